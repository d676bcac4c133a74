"""Where the page links into the docs: one "why & math" derivation per correction, estimator and
serving switch, and the "See …" links of each step. One table, read by the page template and by
tests/lab/test_docs.py, which resolves every target to a section of both languages.

Targets are docs-relative (`corrections.md#staleness`); the page serves them at
/docs/<lang>/<target>, and the heading ids are the English page's in both languages (lab/web/docs.py).
"""
from __future__ import annotations

# field path -> derivation (the link sits under the control)
WHY: dict[str, str] = {
    "task.advantage_estimator": "corrections.md#grpo-normalisation",
    "placement.scheduling": "corrections.md#staleness",
    "rollout.partial_rollout": "rollout-scheduling.md#mixed-version-probabilities",
    "rollout.queue": "rollout-scheduling.md#checkpoint-boundaries",
    "rollout.producers": "fully-async.md#distributed-producers",
    "resources.cp": "parallelism-memory.md#context-parallelism-zigzag-and-all-gather",
    "resources.cpu_adam": "parallelism-memory.md#memory-accounting",
    "precision.training": "precision.md#fp8-and-int4-serving",
    "precision.rollout": "precision.md#fp8-and-int4-serving",
    "precision.kv_cache_dtype": "precision.md#kv-cache-precision",
    "precision.state_kv_ratio": "hybrid-cache.md#two-pools",
    "corrections.tis": "corrections.md#tis-truncated-importance-sampling",
    "corrections.icepop": "corrections.md#icepop-masking-out-of-range-tokens",
    "corrections.r3": "corrections.md#r3-rollout-routing-replay",
    "corrections.sc": "corrections.md#sc-score-centering-with-reinforce",
    "corrections.deterministic": "corrections.md#deterministic-execution",
    "serving.pd.enabled": "serving-cost.md#pd-prefilldecode-disaggregation",
    "serving.hicache.enabled": "serving-cost.md#hicache-host-memory-kv-cache",
    "serving.eagle.enabled": "speculative-decoding.md#acceptance-and-speed-up",
}

# derivations that belong to no single control: (ui key of the link text, target)
WHY_EXTRA: dict[str, tuple[str, str]] = {
    "kl": ("why_kl", "corrections.md#kl-estimators"),
}

# "See …" links of each step: (ui key of the link text, target), in reading order
SEE: dict[str, list[tuple[str, str]]] = {
    "intro": [("see_tutorial", "tutorial.md")],
    "step-1": [("see_architecture", "architecture.md#reused-specs"),
               ("see_hooks", "hooks.md#a-generate-function-for-agents")],
    "step-2-gpu": [("see_parallelism", "parallelism-memory.md#the-five-kinds-of-parallelism")],
    "step-2-sched": [("see_scheduling", "rollout-scheduling.md#timelines"),
                     ("see_fully_async", "fully-async.md")],
    "step-3": [("see_hybrid", "hybrid-cache.md#two-pools"), ("see_precision", "precision.md"),
               ("see_corrections", "corrections.md")],
    "step-4": [("see_serving_cost", "serving-cost.md"),
               ("see_speculative", "speculative-decoding.md#configuration-and-metrics")],
    "step-6": [("see_fully_async", "fully-async.md#evaluation-and-the-queue"),
               ("see_debug", "debug-replay.md"), ("see_trace", "trace.md"),
               ("see_profiling", "profiling.md"), ("see_observability", "observability.md")],
}


def all_targets() -> list[str]:
    out = list(WHY.values()) + [t for _, t in WHY_EXTRA.values()]
    out += [t for links in SEE.values() for _, t in links]
    return out
