"""The validation checks: each returns the findings of one area of the experiment.

`lab.rules.validate` runs them in order; ids are shared with the runtime where it checks the same thing (docs/en/lab.md#findings-and-rule-ids),
LAB-* for the lab's own. Pure functions over (experiment, recipe, model spec, derived numbers).
"""
from __future__ import annotations

import re

from lab.core.experiment import Experiment
from lab.core.findings import Finding
from lab.core.images import get_image
from lab.core.messages import ref
from lab.core.model_spec import ModelSpec
from lab.core.recipes import Recipe
from lab.rules.derive import ETP, Derived
from slime.parallel_sizes import (
    data_parallel_size,
    expert_data_parallel_size,
    expert_parallel_size,
    model_parallel_size,
)

# --- the checks (each returns the findings of one area) -------------------------------------------

_F = Finding.of  # _F(id, level, fields, variant=None, **params): texts from lab/locales/messages.*.json
_HOOK_DOTTED = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)+$")
_HOOK_FILE = re.compile(r"^[^:]+\.py:[A-Za-z_][A-Za-z0-9_]*$")
_HOST_PORT = re.compile(r"^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?):(\d{1,5})$")
# Model families whose chat output closes a reasoning block with </think> (deepscaler grades after it).
NON_REASONING_FAMILIES = frozenset({"glm4", "qwen2"})  # qwen2: the tiny model answers one digit


def gpu_run(recipe: Recipe) -> bool:
    return recipe.backends.train != "embedded"


def _check_resources(exp: Experiment, recipe: Recipe, spec: ModelSpec, d: Derived) -> list[Finding]:
    p = exp.placement
    out: list[Finding] = []
    if not gpu_run(recipe):
        return out
    if p.gpus_per_node == 0 or p.train_gpus == 0:
        out.append(_F("LAB-GPU-1", "error", ["placement.gpus_per_node", "placement.train_gpus"], model=recipe.display_name))
        return out
    if d.total_gpus > d.declared_gpus:
        arithmetic = ref(f"term.gpu_sum.{p.ownership}", train=p.train_gpus, rollout=p.rollout_gpus)
        out.append(_F("RES-2", "error", ["placement.nodes", "placement.gpus_per_node", "placement.train_gpus", "placement.rollout_gpus"],
                      arithmetic=arithmetic, total=d.total_gpus, nodes=p.nodes, gpn=p.gpus_per_node, declared=d.declared_gpus,
                      nodes_needed=d.nodes_needed))
    if p.ownership == "colocated" and p.train_gpus != p.rollout_gpus:
        out.append(_F("LAB-COL-2", "warning", ["placement.train_gpus", "placement.rollout_gpus"],
                      train=p.train_gpus, rollout=p.rollout_gpus, declared=d.declared_gpus))
    return out


def _check_engines(exp: Experiment, recipe: Recipe, spec: ModelSpec, d: Derived) -> list[Finding]:
    p, out = exp.placement, []
    if p.ownership == "external":
        bad = [a for a in p.external_engine_addrs if not _valid_host_port(a)]
        if bad:
            out.append(_F("LAB-EXT-2", "error", ["placement.external_engine_addrs"], addrs=", ".join(repr(b) for b in bad)))
        out.append(_F("SYN-3", "info", ["placement.ownership"]))
        return out
    if p.external_engine_addrs:
        out.append(_F("RES-6", "warning", ["placement.external_engine_addrs", "placement.ownership"], ownership=p.ownership))
    if not gpu_run(recipe) or p.engine_gpus == 0:
        if gpu_run(recipe):
            out.append(_F("RES-4", "error", ["placement.engine_gpus"], "no_gpu"))
        return out
    e = p.engine_gpus
    if p.rollout_gpus < e:
        out.append(_F("RES-4", "error", ["placement.rollout_gpus", "placement.engine_gpus"], "pool_too_small",
                      rollout=p.rollout_gpus, engine=e))
    elif d.idle_rollout_gpus:
        out.append(_F("RES-4", "warning", ["placement.rollout_gpus", "placement.engine_gpus"], "idle",
                      rollout=p.rollout_gpus, engines=d.engines, engine=e, idle=d.idle_rollout_gpus,
                      lower=d.engines * e, upper=(d.engines + 1) * e))
    if p.gpus_per_node and e > p.gpus_per_node and e % p.gpus_per_node:
        out.append(_F("RES-4", "error", ["placement.engine_gpus", "placement.gpus_per_node"], "partial_nodes",
                      engine=e, gpn=p.gpus_per_node, gpn2=2 * p.gpus_per_node, gpn3=3 * p.gpus_per_node))
    return out


def _valid_host_port(addr: str) -> bool:
    m = _HOST_PORT.match(addr.strip())
    return m is not None and 1 <= int(m.group(3)) <= 65535


def _valid_tp_pp_cp(n: int, limit: int = 6) -> str:
    opts = []
    for tp in (1, 2, 4, 8):
        for pp in (1, 2, 4, 8):
            for cp in (1, 2):
                if dp := data_parallel_size(n, tp, pp, cp):
                    opts.append(f"TP {tp}/PP {pp}/CP {cp} → DP {dp}")
    return "; ".join(opts[:limit])


def check_parallel(exp: Experiment, recipe: Recipe, spec: ModelSpec, d: Derived) -> list[Finding]:
    r, n, out = exp.resources, exp.placement.train_gpus, []
    par = model_parallel_size(r.tp, r.pp, r.cp)
    if n and not data_parallel_size(n, r.tp, r.pp, r.cp):
        out.append(_F("PAR-1", "error", ["resources.tp", "resources.pp", "resources.cp", "placement.train_gpus"],
                      tp=r.tp, pp=r.pp, cp=r.cp, unit=par, n=n, choices=_valid_tp_pp_cp(n)))
    if spec.heads % r.tp:
        out.append(_F("PAR-2", "error", ["resources.tp"], "heads", heads=spec.heads, tp=r.tp,
                      options=", ".join(str(t) for t in (1, 2, 4, 8, 16) if spec.heads % t == 0)))
    if not spec.mla and spec.kv_groups % r.tp and r.tp % spec.kv_groups:
        out.append(_F("PAR-2", "error", ["resources.tp"], "kv_groups", kv_groups=spec.kv_groups, tp=r.tp))
    if spec.is_moe:
        if spec.experts % r.ep:
            out.append(_F("PAR-2", "error", ["resources.ep"], "experts", experts=spec.experts, ep=r.ep,
                          options=", ".join(str(e) for e in (1, 2, 4, 8, 16, 32, 64) if spec.experts % e == 0)))
        if n and not expert_data_parallel_size(n, ETP, r.ep, r.pp):
            ok = [e for e in (1, 2, 4, 8, 16, 32, 64) if spec.experts % e == 0 and expert_data_parallel_size(n, ETP, e, r.pp)]
            out.append(_F("PAR-2", "error", ["resources.ep", "resources.pp", "placement.train_gpus"], "ep_groups",
                          ep=r.ep, pp=r.pp, unit=expert_parallel_size(ETP, r.ep, r.pp), n=n, options=", ".join(map(str, ok)) or "1"))
        if spec.router_groups and spec.experts % spec.router_groups:
            out.append(_F("PAR-2", "error", ["model.recipe"], "router_groups", experts=spec.experts, groups=spec.router_groups))
    elif r.ep > 1:
        out.append(_F("LAB-PAR-EP", "warning", ["resources.ep"], model=recipe.display_name, ep=r.ep))
    out += _check_pipeline(exp, spec)
    if spec.dsa and r.cp > 1 and not spec.allgather_cp:
        out.append(_F("PAR-6", "warning", ["resources.cp"], "dsa"))
    if not spec.dsa and spec.allgather_cp and r.cp > 1:
        out.append(_F("PAR-6", "error", ["resources.cp"], "non_dsa"))
    return out


def _check_pipeline(exp: Experiment, spec: ModelSpec) -> list[Finding]:
    r, out = exp.resources, []
    first, last = r.pp_first_stage_layers, r.pp_last_stage_layers
    fields = ["resources.pp", "resources.pp_first_stage_layers", "resources.pp_last_stage_layers"]
    if r.pp == 1:
        if first or last:
            out.append(_F("PAR-5", "error", fields, "pp1"))
        return out
    middle_stages = r.pp - (1 if first else 0) - (1 if last else 0)
    rest = spec.layers - (first or 0) - (last or 0)
    if middle_stages <= 0 and rest != 0 or rest < 0 or (middle_stages > 0 and rest % middle_stages):
        even = [pp for pp in (2, 4, 8) if spec.layers % pp == 0]
        out.append(_F("PAR-5", "error", fields, "split" if first or last else "even", layers=spec.layers, pp=r.pp,
                      first=first, last=last, options=", ".join(map(str, even)) or "1", middle=max(middle_stages, 1)))
        return out
    if spec.dsa:
        per = rest // middle_stages if middle_stages > 0 else 0
        starts, layer = [0], first if first else per
        for _ in range(r.pp - 1):
            starts.append(layer)
            layer += per
        bad = [s for s in starts if not spec.dsa_computes_index(s)]
        if bad:
            out.append(_F("PAR-5", "error", fields, "dsa", layers=str(bad), freq=spec.index_topk_freq,
                          offset=spec.index_skip_topk_offset))
    return out


def _check_batching(exp: Experiment, recipe: Recipe, spec: ModelSpec, d: Derived) -> list[Finding]:
    # Batch divisibility (BAT-3/4), group size (BAT-6) and over-sampling (BAT-7) are runtime rules:
    # lab.rules.runtime_verdict shows the runtime's verdict on them.
    out: list[Finding] = []
    cap = exp.resources.max_tokens_per_gpu * exp.resources.cp
    if gpu_run(recipe) and cap < exp.rollout.max_response_len:
        out.append(_F("BAT-5", "warning", ["resources.max_tokens_per_gpu", "rollout.max_response_len", "resources.cp"],
                      cap=cap, response=exp.rollout.max_response_len))
    return out


def _check_scheduling(exp: Experiment, recipe: Recipe, spec: ModelSpec, d: Derived) -> list[Finding]:
    p, c, out = exp.placement, exp.corrections, []
    corrected = c.tis or c.icepop
    # async + colocated (COL-1) and partial rollout without over-sampling or correction (PRT-1) are
    # runtime rules; held-out eval runs under async (train_async.py evaluates), so EVL-2 is gone.
    if p.scheduling == "async":
        if not corrected:
            out.append(_F("ASY-1", "warning", ["placement.scheduling", "corrections.tis", "corrections.icepop"]))
        if exp.task.num_steps_per_rollout > 1:
            out.append(_F("LAB-ASY-STEPS", "warning", ["task.num_steps_per_rollout", "placement.scheduling"],
                          steps=exp.task.num_steps_per_rollout))
    return out


def _check_serving(exp: Experiment, recipe: Recipe, spec: ModelSpec, d: Derived) -> list[Finding]:
    s, p, out = exp.serving, exp.placement, []
    if s.pd.enabled:
        e = p.engine_gpus
        pd_fields = ["serving.pd.prefill_engines", "serving.pd.decode_engines", "placement.rollout_gpus", "placement.engine_gpus"]
        embedded = recipe.backends.rollout == "embedded"
        if p.ownership == "external":
            out.append(_F("SGL-4", "error", ["serving.pd.enabled", "placement.ownership"], "external"))
        elif s.pd.prefill_engines == 0 or s.pd.decode_engines == 0:
            out.append(_F("SGL-4", "error", pd_fields, "empty_group"))
        elif embedded and p.ownership == "colocated":
            # The embedded pool is one engine per trainer process when colocated: no room for a second group.
            out.append(_F("SGL-4", "error", ["serving.pd.enabled", "placement.ownership"], "embedded_colocated"))
        elif embedded and recipe.backends.train == "embedded":
            pass  # its rollout pool is rendered as one engine per prefill and decode engine (lab/core/train_flags.py)
        elif (s.pd.prefill_engines + s.pd.decode_engines) * e != p.rollout_gpus:
            need = (s.pd.prefill_engines + s.pd.decode_engines) * e
            out.append(_F("SGL-4", "error", pd_fields, "pool", prefill=s.pd.prefill_engines, decode=s.pd.decode_engines,
                          engine=e, need=need, rollout=p.rollout_gpus, engines=d.engines,
                          split_prefill=max(1, d.engines // 2), split_decode=max(1, d.engines - d.engines // 2)))
        # SGLang's engines move the KV cache over RDMA; the embedded engine's Mooncake falls back to TCP
        if not s.pd.rdma_devices and p.ownership != "external" and not embedded:
            out.append(_F("SGL-5", "error", ["serving.pd.rdma_devices"], "rdma"))
        if s.hicache.enabled:
            out.append(_F("SGL-5", "info", ["serving.hicache.enabled", "serving.pd.enabled"], "hicache"))
    if s.hicache.enabled and p.ownership == "colocated":
        out.append(_F("SGL-6", "info", ["serving.hicache.enabled", "placement.ownership"]))
    if s.eagle.enabled:
        out += _check_eagle(exp, recipe, spec)
    if p.ownership == "colocated" and s.mem_fraction_static > 0.8:
        out.append(_F("COL-2", "warning", ["serving.mem_fraction_static", "placement.ownership"], fraction=s.mem_fraction_static))
    return out


def _check_eagle(exp: Experiment, recipe: Recipe, spec: ModelSpec) -> list[Finding]:
    eg, out = exp.serving.eagle, []
    if eg.head == "separate" and not eg.draft_head_path:
        out.append(_F("LAB-EAGLE-1", "error", ["serving.eagle.head", "serving.eagle.draft_head_path"]))
    if eg.head == "mtp" and spec.mtp_layers == 0:
        out.append(_F("LAB-EAGLE-2", "error", ["serving.eagle.head", "serving.eagle.enabled"], model=recipe.display_name))
    out.append(_F("SGL-7", "info", ["serving.eagle.enabled", "serving.concurrency"], concurrency=exp.serving.concurrency))
    return out


def _check_precision(exp: Experiment, recipe: Recipe, spec: ModelSpec, d: Derived) -> list[Finding]:
    pr, out = exp.precision, []
    image = get_image(exp.install.image)
    hw = image.name if image else exp.install.image
    uses = {"fp8_training": pr.training == "fp8", "fp8_rollout": pr.rollout == "fp8", "int4_rollout": pr.rollout == "int4"}
    fields = {"fp8_training": "precision.training", "fp8_rollout": "precision.rollout", "int4_rollout": "precision.rollout"}
    for key, used in uses.items():
        if not used:
            continue
        support = getattr(recipe.precision, key)
        if support == "unsupported":
            out.append(_F("LAB-PRC-1", "error", [fields[key]], "unsupported", what=ref(f"term.{key}"), model=recipe.display_name))
        elif support in ("experimental", "beta"):
            out.append(_F("LAB-PRC-1", "warning", [fields[key]], support, what=ref(f"term.{key}"), model=recipe.display_name))
    if image is None:
        out.append(_F("LAB-IMG-1", "warning", ["install.image"], image=exp.install.image))
    else:
        if pr.training == "fp8" and not image.fp8:
            out.append(_F("PRC-1", "error", ["precision.training", "install.image"], hw=hw))
        if pr.rollout == "fp8" and not image.fp8:
            out.append(_F("PRC-2", "error", ["precision.rollout", "install.image"], "rollout", hw=hw))
        if pr.kv_cache_dtype == "fp8_e4m3" and not image.fp8:
            out.append(_F("PRC-2", "error", ["precision.kv_cache_dtype", "install.image"], "kv_cache", hw=hw))
        if pr.rollout == "int4" and not image.int4:
            out.append(_F("PRC-4", "error", ["precision.rollout", "install.image"], hw=hw))
    low = pr.rollout != "bf16" or pr.kv_cache_dtype == "fp8_e4m3"
    if low and not (exp.corrections.tis or exp.corrections.icepop):
        out.append(_F("PRC-5", "warning", ["precision.rollout", "precision.kv_cache_dtype", "corrections.tis"]))
    if recipe.kind == "hybrid" and pr.recurrent_state_dtype is None:
        out.append(_F("LAB-HYB-1", "error", ["precision.recurrent_state_dtype"], model=recipe.display_name))
    if recipe.kind != "hybrid" and (pr.recurrent_state_dtype is not None or pr.state_kv_ratio is not None):
        out.append(_F("LAB-HYB-2", "info", ["precision.recurrent_state_dtype", "precision.state_kv_ratio"], model=recipe.display_name))
    return out


def _check_corrections(exp: Experiment, recipe: Recipe, spec: ModelSpec, d: Derived) -> list[Finding]:
    c, out = exp.corrections, []
    if c.r3 and not spec.is_moe:
        out.append(_F("LAB-R3-1", "warning", ["corrections.r3"], model=recipe.display_name))
    return out


def _check_task(exp: Experiment, recipe: Recipe, spec: ModelSpec, d: Derived) -> list[Finding]:
    t, out = exp.task, []
    if t.kind == "custom":
        missing = [f for f, v in (("task.custom_generate_path", t.custom_generate_path), ("task.custom_reward_path", t.custom_reward_path)) if not v]
        if missing:
            out.append(_F("LAB-TASK-1", "error", missing))
    for path, value in (("task.custom_generate_path", t.custom_generate_path), ("task.custom_reward_path", t.custom_reward_path)):
        if value and not (_HOOK_DOTTED.match(value) or _HOOK_FILE.match(value)):
            out.append(_F("LAB-TASK-2", "error", [path], value=repr(value)))
    if t.kind == "math" and t.rm_type == "deepscaler" and recipe.family in NON_REASONING_FAMILIES:
        out.append(_F("REW-3", "info", ["task.rm_type", "model.recipe"], "deepscaler", model=recipe.display_name))
    if not t.label_key:
        out.append(_F("REW-3", "error", ["task.label_key"], "label_key"))
    return out


def _check_paths_eval(exp: Experiment, recipe: Recipe, spec: ModelSpec, d: Derived) -> list[Finding]:
    pa, ev, out = exp.paths, exp.evaluation, []
    # No addresses for external engines, straw without a state directory and a save interval without
    # --save are the runtime's refusals (lab.rules.runtime_verdict), not repeated here.
    if pa.save_interval > exp.task.num_rollout:
        out.append(_F("LAB-CKP-1", "info", ["paths.save_interval", "task.num_rollout"],
                      rollouts=exp.task.num_rollout, interval=pa.save_interval))
    if pa.load:
        if pa.load.rstrip("/") != pa.save.rstrip("/"):
            out.append(_F("CKP-3", "warning", ["paths.load", "paths.save"]))
        out.append(_F("CKP-2", "info", ["paths.load"]))
    if ev.enabled and not ev.data_path.strip():
        out.append(_F("EVL-1", "error", ["evaluation.data_path"]))
    if not pa.prompt_data.strip():
        out.append(_F("DAT-1", "error", ["paths.prompt_data"]))
    return out


CHECKS = (_check_resources, _check_engines, check_parallel, _check_batching, _check_scheduling,
           _check_serving, _check_precision, _check_corrections, _check_task, _check_paths_eval)
