"""The cluster sizes the runtime accepts (torch-free; the lab reads its bounds from here).

One Ray placement group holds one bundle per GPU, and the runtime builds per-rank tables of that
size at start-up, so the sizes are bounded where a real cluster stops: 1,024 nodes of at most 16
GPUs each. `slime.args.validate` refuses larger values naming the flag; the lab's experiment model
uses the same numbers as its field bounds, which also bounds what one page view costs.
"""
from __future__ import annotations

from slime.refusals import declare

MAX_NODES = 1024  # --actor-num-nodes
MAX_GPUS_PER_NODE = 16  # --actor-num-gpus-per-node, --num-gpus-per-node
MAX_GPUS = MAX_NODES * MAX_GPUS_PER_NODE  # --rollout-num-gpus, and any pool
MAX_GPUS_PER_ENGINE = 1024  # --rollout-num-gpus-per-engine (an engine may span nodes)


_R = declare("limits", {"outside": ("flag", "value", "lo", "hi")})


def cluster_size_errors(actor_num_nodes: int, actor_num_gpus_per_node: int, num_gpus_per_node: int,
                        rollout_num_gpus: int | None, rollout_num_gpus_per_engine: int) -> list[str]:
    """One message per size outside the limits, naming its flag."""
    e: list[str] = []
    for flag, value, lo, hi in (("--actor-num-nodes", actor_num_nodes, 1, MAX_NODES),
                                ("--actor-num-gpus-per-node", actor_num_gpus_per_node, 0, MAX_GPUS_PER_NODE),
                                ("--num-gpus-per-node", num_gpus_per_node, 0, MAX_GPUS_PER_NODE),
                                ("--rollout-num-gpus", rollout_num_gpus, 0, MAX_GPUS),
                                ("--rollout-num-gpus-per-engine", rollout_num_gpus_per_engine, 1, MAX_GPUS_PER_ENGINE)):
        if value is not None and not lo <= value <= hi:
            e.append(_R("outside", flag=flag, value=value, lo=lo, hi=hi))
    return e
