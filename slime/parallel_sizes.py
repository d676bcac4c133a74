"""The group sizes a parallel layout implies, computed here once.

megatron-core forms the dense layers' groups over TP x CP x DP x PP ranks and the expert layers'
over ETP x EP x EDP x PP (slime/ray/placement.py gives the rank order). Every place that needs one
of these sizes (the runtime's validation and placement, the lab's rules, repairs and memory
estimates) reads it from this module, so the runtime and the lab cannot disagree on which layouts
tile a pool. Plain ints in and out; no torch.
"""

from __future__ import annotations

import math


def model_parallel_size(tp: int, pp: int, cp: int = 1) -> int:
    """The ranks one replica of the dense layers spans: TP x PP x CP."""
    return tp * pp * cp


def expert_parallel_size(etp: int, ep: int, pp: int) -> int:
    """The ranks one replica of the expert layers spans: ETP x EP x PP."""
    return etp * ep * pp


def data_parallel_size(ranks: int, tp: int, pp: int, cp: int = 1) -> int:
    """Ranks / (TP x PP x CP), the data-parallel size; 0 when the layout does not tile the ranks."""
    model = model_parallel_size(tp, pp, cp)
    return ranks // model if model > 0 and ranks % model == 0 else 0


def expert_data_parallel_size(ranks: int, etp: int, ep: int, pp: int) -> int:
    """Ranks / (ETP x EP x PP), the experts' data-parallel size; 0 when it does not tile the ranks."""
    unit = expert_parallel_size(etp, ep, pp)
    return ranks // unit if unit > 0 and ranks % unit == 0 else 0


def train_unit(tp: int, pp: int, cp: int, *, moe: bool = False, etp: int = 1, ep: int = 1) -> int:
    """The smallest pool of trainer ranks the layout tiles: TP x PP x CP, and for MoE its lcm with
    ETP x EP x PP (both the dense and the expert groups must be whole)."""
    unit = model_parallel_size(tp, pp, cp)
    return math.lcm(unit, expert_parallel_size(etp, ep, pp)) if moe else unit
