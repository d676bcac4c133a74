"""Which controls cannot apply to the current choices, so the page folds them away.

Pure: a field is folded when the switch that gives it meaning is off (PD counts with PD off, hook
paths in math mode, recurrent-state dtype for a model without recurrent layers). Folding hides a
control, never its value: the value stays in the experiment, in history and in experiment.json. A
field that a finding names is never folded, so a problem can always be seen and fixed.
"""
from __future__ import annotations

from collections.abc import Iterable

from lab.core.experiment import Experiment


def folded_fields(exp: Experiment, recipe_kind: str | None, named_by_findings: Iterable[str] = ()) -> list[str]:
    s, p, c, ro, ev, r = exp.serving, exp.placement, exp.corrections, exp.rollout, exp.evaluation, exp.resources
    rules: list[tuple[bool, tuple[str, ...]]] = [
        (exp.task.kind != "custom", ("task.custom_generate_path", "task.custom_reward_path")),
        (p.ownership != "external", ("placement.external_engine_addrs",)),
        (p.ownership == "external", ("placement.engine_gpus", "serving.mem_fraction_static")),
        (not ro.queue, ("rollout.queue_run_id", "rollout.queue_state_dir")),
        (not (ro.queue and p.scheduling == "async"), ("rollout.producers",)),
        (r.pp == 1, ("resources.pp_first_stage_layers", "resources.pp_last_stage_layers")),
        (recipe_kind != "hybrid", ("precision.recurrent_state_dtype", "precision.state_kv_ratio")),
        (not (c.tis or c.sc), ("corrections.tis_clip",)),
        (not c.icepop, ("corrections.icepop_low", "corrections.icepop_high")),
        (not s.pd.enabled, ("serving.pd.prefill_engines", "serving.pd.decode_engines", "serving.pd.rdma_devices")),
        (not s.hicache.enabled, ("serving.hicache.host_memory_gb",)),
        (not s.eagle.enabled, ("serving.eagle.head", "serving.eagle.steps", "serving.eagle.topk",
                               "serving.eagle.draft_tokens")),
        (not (s.eagle.enabled and s.eagle.head == "separate"), ("serving.eagle.draft_head_path",)),
        (not ev.enabled, ("evaluation.name", "evaluation.data_path", "evaluation.interval", "evaluation.n_samples")),
    ]
    keep = set(named_by_findings)
    return [f for applies, fields in rules if applies for f in fields if f not in keep]
