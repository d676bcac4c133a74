"""Whether a checkpoint's optimizer state can be loaded at this trainer's parallel layout: a pure
rule over the layout record the Megatron trainer's save() writes beside the torch_dist files
(slime/backends/megatron/trainer.py), checked before anything is loaded."""

from __future__ import annotations

from typing import Any, Mapping

from slime.refusals import Refusal, declare

_R = declare("megatron.resume", {
    "optimizer_count": ("saved", "now", "ep_saved", "ep_now"),
    "distributed_layout": ("changes",),
})

# What save() records next to the torch_dist files: the layout the optimizer state was written at.
LAYOUT_FILE = "slime_layout.json"
LAYOUT_KEYS = ("tp", "pp", "cp", "ep", "etp", "vpp")


def optimizer_resume_refusal(saved: Mapping[str, Any] | None, now: Mapping[str, Any]) -> Refusal | None:
    """Why the optimizer state of a checkpoint cannot be loaded at this layout, or None.

    The distributed optimizer's state is written as megatron-core's ``dp_reshardable`` buffers:
    flat per-bucket shards whose layout follows TP, PP, EP, expert-TP, CP and virtual PP, so it
    loads at another data-parallel size only (megatron-core's own words). Any other change would
    pair Adam moments with the wrong weights, or fail deep in the loader; it is refused here with
    both ways forward. The non-distributed optimizer (the CPU mode's) keeps one state tensor per
    parameter, which reshards like the weights, as long as the parameters are grouped into the
    same number of optimizers (megatron-core chains a separate one for the routed experts at EP > 1).
    A checkpoint without the record (older saves) is taken as it is."""
    if not saved:
        return None
    if saved.get("optimizers", 1) != now.get("optimizers", 1):
        return _R("optimizer_count", saved=saved.get("optimizers"), now=now.get("optimizers"),
                  ep_saved=saved.get("ep"), ep_now=now.get("ep"))
    if not saved.get("distributed_optimizer") or not now.get("distributed_optimizer"):
        return None
    diff = [k for k in LAYOUT_KEYS if saved.get(k) != now.get(k)]
    if not diff:
        return None
    show = ", ".join(f"{k.upper()} {saved.get(k)} -> {now.get(k)}" for k in diff)
    return _R("distributed_layout", changes=show)
