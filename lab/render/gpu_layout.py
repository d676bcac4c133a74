"""The GPU cells the page draws for a run: which pool owns each GPU and which engine it serves,
drawn from the runtime's Ray placement plan (the plan `experiment.sh check` prints), so the diagram
and the plan are one."""
from __future__ import annotations

from typing import Any

from lab.core.experiment import Experiment

MAX_DRAWN_NODES = 64  # beyond this the layout says "… and N more nodes" instead of drawing them
MAX_DRAWN_ENGINES = 64  # likewise for the boxes of external engines


def gpu_layout(exp: Experiment, plan: list[Any]) -> dict[str, Any]:
    """GPU cells by node: which pool owns each GPU and which engine it serves, drawn from the
    runtime's Ray placement plan (the plan `experiment.sh check` prints), so the diagram and the
    plan are one. Only the first MAX_DRAWN_NODES nodes and MAX_DRAWN_ENGINES external engines are
    built, so drawing costs what is drawn, not the cluster's size."""
    p = exp.placement
    gpn = p.gpus_per_node
    if gpn <= 0:
        return {"cpu_only": True, "gpus_per_node": 0, "nodes": [], "external": [], "hidden_nodes": 0,
                "hidden_engines": 0}
    used: dict[tuple[int, int], list[Any]] = {}  # (node, gpu) -> [role, engine index or null]
    n_external = 0
    last = -1
    for slot in plan:
        if slot["role"] == "external":
            n_external += 1
        elif slot["role"] == "trainer" and slot["node"] is not None:
            last = max(last, slot["node"])
            if slot["node"] < MAX_DRAWN_NODES:
                for g in slot["gpus"]:
                    used[(slot["node"], g)] = ["train", None]
        elif slot["role"] in ("engine", "prefill", "decode") and slot["node"] is not None:
            span = slot["nodes"] or [slot["node"]]
            last = max(last, span[-1])
            left = max(p.engine_gpus, 1)
            for node in span:
                for g in (slot["gpus"] if node == span[0] else range(gpn)):
                    if left <= 0:
                        break
                    left -= 1
                    if node >= MAX_DRAWN_NODES:
                        continue
                    was = used.get((node, g))
                    used[(node, g)] = ["shared" if was and was[0] == "train" else "rollout", slot["index"]]
    count = max(p.nodes, last + 1)
    drawn = min(count, MAX_DRAWN_NODES)
    external = [max(p.engine_gpus, 1)] * min(n_external, MAX_DRAWN_ENGINES)
    return {
        "cpu_only": False,
        "gpus_per_node": gpn,
        "nodes": [[used.get((n, g), ["idle", None]) for g in range(gpn)] for n in range(drawn)],
        "hidden_nodes": count - drawn,
        "external": external,
        "hidden_engines": n_external - len(external),
        "ownership": p.ownership,
    }
