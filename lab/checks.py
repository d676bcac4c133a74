"""The validation checks: each returns the findings of one area of the experiment.

`lab.rules.validate` runs them in order; ids come from validation-rules.md where one exists,
LAB-* for the lab's own. Pure functions over (experiment, recipe, model spec, derived numbers).
"""
from __future__ import annotations

import re

from lab.derive import ETP, Derived
from lab.experiment import Experiment
from lab.findings import Finding
from lab.images import get_image
from lab.model_spec import ModelSpec
from lab.recipes import Recipe

# --- the checks (each returns the findings of one area) -------------------------------------------

_F = Finding
_HOOK_DOTTED = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)+$")
_HOOK_FILE = re.compile(r"^[^:]+\.py:[A-Za-z_][A-Za-z0-9_]*$")
_HOST_PORT = re.compile(r"^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?):(\d{1,5})$")
# Model families whose chat output closes a reasoning block with </think> (deepscaler grades after it).
NON_REASONING_FAMILIES = frozenset({"glm4", "qwen2"})  # qwen2: the tiny model answers one digit
GROUP_ESTIMATORS = frozenset({"grpo", "gspo", "reinforce_plus_plus_baseline"})


def _gpu_run(recipe: Recipe) -> bool:
    return recipe.backends.train != "embedded"


def _check_resources(exp: Experiment, recipe: Recipe, spec: ModelSpec, d: Derived) -> list[Finding]:
    p, out = exp.placement, []
    if not _gpu_run(recipe):
        return out
    if p.gpus_per_node == 0 or p.train_gpus == 0:
        out.append(_F(id="LAB-GPU-1", level="error", fields=["placement.gpus_per_node", "placement.train_gpus"],
                      message=f"{recipe.display_name} trains with Megatron on GPUs, but the layout has no training GPUs.",
                      fix="Set placement.gpus_per_node to the GPUs of your nodes (8 on the reference nodes) and give the training pool GPUs."))
        return out
    if d.total_gpus > d.declared_gpus:
        arithmetic = {"colocated": f"max({p.train_gpus}, {p.rollout_gpus})",
                      "disaggregated": f"{p.train_gpus} + {p.rollout_gpus}",
                      "external": f"{p.train_gpus} (external engines are outside Ray)"}[p.ownership]
        out.append(_F(id="RES-2", level="error",
                      fields=["placement.nodes", "placement.gpus_per_node", "placement.train_gpus", "placement.rollout_gpus"],
                      message=f"The job requests {arithmetic} = {d.total_gpus} GPUs but declares {p.nodes} × {p.gpus_per_node} = "
                              f"{d.declared_gpus}; Ray's placement group would wait forever (the job looks hung).",
                      fix=f"Declare {d.nodes_needed} nodes (placement.nodes), or shrink the training/rollout pools to fit {d.declared_gpus} GPUs."))
    if p.ownership == "colocated" and p.train_gpus != p.rollout_gpus:
        out.append(_F(id="LAB-COL-2", level="warning", fields=["placement.train_gpus", "placement.rollout_gpus"],
                      message=f"Colocated means one pool, but training has {p.train_gpus} GPUs and rollout {p.rollout_gpus}.",
                      fix=f"Set both to nodes × GPUs per node = {d.declared_gpus}."))
    return out


def _check_engines(exp: Experiment, recipe: Recipe, spec: ModelSpec, d: Derived) -> list[Finding]:
    p, out = exp.placement, []
    if p.ownership == "external":
        if not p.external_engine_addrs:
            out.append(_F(id="LAB-EXT-1", level="error", fields=["placement.external_engine_addrs"],
                          message="External SGLang engines are selected but no engine address is given.",
                          fix="Add host:port of every running engine (from your deployment), or choose colocated/disaggregated."))
        bad = [a for a in p.external_engine_addrs if not _valid_host_port(a)]
        if bad:
            out.append(_F(id="LAB-EXT-2", level="error", fields=["placement.external_engine_addrs"],
                          message=f"Not a host:port address: {', '.join(repr(b) for b in bad)}.",
                          fix="Write each address as host:port, e.g. 10.0.0.5:30000 (port 1–65535, no scheme or path)."))
        out.append(_F(id="SYN-3", level="info", fields=["placement.ownership"],
                      message="External engines receive weights over NCCL only when trainer and engines can form one NCCL group.",
                      fix="Across clusters or fabrics use disk transport on a directory both sides mount at the same path."))
        return out
    if p.external_engine_addrs:
        out.append(_F(id="RES-6", level="warning", fields=["placement.external_engine_addrs", "placement.ownership"],
                      message=f"Engine addresses are set but GPU ownership is {p.ownership}: slime starts its own engines and the addresses "
                              "are ignored (external engines with --colocate are unsupported).",
                      fix="Choose external SGLang to use those engines, or clear the addresses."))
    if not _gpu_run(recipe) or p.engine_gpus == 0:
        if _gpu_run(recipe):
            out.append(_F(id="RES-4", level="error", fields=["placement.engine_gpus"],
                          message="A rollout engine needs at least one GPU.", fix="Set placement.engine_gpus ≥ 1."))
        return out
    e = p.engine_gpus
    if p.rollout_gpus < e:
        out.append(_F(id="RES-4", level="error", fields=["placement.rollout_gpus", "placement.engine_gpus"],
                      message=f"The rollout pool ({p.rollout_gpus} GPUs) cannot hold one {e}-GPU engine: no engine starts.",
                      fix=f"Give the rollout pool a multiple of {e} GPUs, or use smaller engines."))
    elif d.idle_rollout_gpus:
        out.append(_F(id="RES-4", level="warning", fields=["placement.rollout_gpus", "placement.engine_gpus"],
                      message=f"{p.rollout_gpus} rollout GPUs hold {d.engines} whole {e}-GPU engines; {d.idle_rollout_gpus} GPUs stay idle "
                              "(they are reserved but run nothing).",
                      fix=f"Set the rollout pool to {d.engines * e} or {(d.engines + 1) * e} GPUs (a multiple of {e}), or change the engine size."))
    if p.gpus_per_node and e > p.gpus_per_node and e % p.gpus_per_node:
        out.append(_F(id="RES-4", level="error", fields=["placement.engine_gpus", "placement.gpus_per_node"],
                      message=f"A {e}-GPU engine spans nodes of {p.gpus_per_node} GPUs but is not a whole number of nodes; it starts "
                              "as a one-node engine whose tensor parallel size cannot fit.",
                      fix=f"Use an engine size ≤ {p.gpus_per_node} or a multiple of it ({2 * p.gpus_per_node}, {3 * p.gpus_per_node}, …)."))
    return out


def _valid_host_port(addr: str) -> bool:
    m = _HOST_PORT.match(addr.strip())
    return bool(m) and 1 <= int(m.group(3)) <= 65535


def _valid_tp_pp_cp(n: int, limit: int = 6) -> str:
    opts = []
    for tp in (1, 2, 4, 8):
        for pp in (1, 2, 4, 8):
            for cp in (1, 2):
                if n and n % (tp * pp * cp) == 0:
                    opts.append(f"TP {tp}/PP {pp}/CP {cp} → DP {n // (tp * pp * cp)}")
    return "; ".join(opts[:limit])


def _check_parallel(exp: Experiment, recipe: Recipe, spec: ModelSpec, d: Derived) -> list[Finding]:
    r, n, out = exp.resources, exp.placement.train_gpus, []
    par = r.tp * r.pp * r.cp
    if n and n % par:
        out.append(_F(id="PAR-1", level="error", fields=["resources.tp", "resources.pp", "resources.cp", "placement.train_gpus"],
                      message=f"TP×PP×CP = {r.tp}×{r.pp}×{r.cp} = {par} does not divide the {n} training GPUs: no whole data-parallel size.",
                      fix=f"Valid choices for {n} GPUs: {_valid_tp_pp_cp(n)}."))
    if spec.heads % r.tp:
        out.append(_F(id="PAR-2", level="error", fields=["resources.tp"],
                      message=f"{spec.heads} attention heads are not divisible by TP {r.tp}.",
                      fix=f"Pick a TP that divides {spec.heads}: {', '.join(str(t) for t in (1, 2, 4, 8, 16) if spec.heads % t == 0)}."))
    if not spec.mla and spec.kv_groups % r.tp and r.tp % spec.kv_groups:
        out.append(_F(id="PAR-2", level="error", fields=["resources.tp"],
                      message=f"{spec.kv_groups} KV groups are neither a multiple nor a divisor of TP {r.tp}.",
                      fix=f"Pick a TP that divides or is a multiple of {spec.kv_groups}."))
    if spec.is_moe:
        if spec.experts % r.ep:
            out.append(_F(id="PAR-2", level="error", fields=["resources.ep"],
                          message=f"{spec.experts} experts are not divisible by EP {r.ep}.",
                          fix=f"Pick an EP that divides {spec.experts}: {', '.join(str(e) for e in (1, 2, 4, 8, 16, 32, 64) if spec.experts % e == 0)}."))
        if n and n % (ETP * r.ep * r.pp):
            ok = [e for e in (1, 2, 4, 8, 16, 32, 64) if spec.experts % e == 0 and n % (e * r.pp) == 0]
            out.append(_F(id="PAR-2", level="error", fields=["resources.ep", "resources.pp", "placement.train_gpus"],
                          message=f"EP×PP = {r.ep}×{r.pp} = {r.ep * r.pp} (expert tensor parallel 1) does not divide the {n} training GPUs: "
                                  "Megatron cannot build the expert-parallel groups.",
                          fix=f"Use EP {', '.join(map(str, ok)) or '1'} at PP {r.pp}, or give training a multiple of {r.ep * r.pp} GPUs."))
        if spec.router_groups and spec.experts % spec.router_groups:
            out.append(_F(id="PAR-2", level="error", fields=["model.recipe"],
                          message=f"{spec.experts} experts are not divisible by {spec.router_groups} router groups.",
                          fix="Use the model spec that matches the checkpoint."))
    elif r.ep > 1:
        out.append(_F(id="LAB-PAR-EP", level="warning", fields=["resources.ep"],
                      message=f"{recipe.display_name} has no experts; EP {r.ep} has no effect.", fix="Set EP to 1."))
    out += _check_pipeline(exp, spec)
    if spec.dsa and r.cp > 1 and not spec.allgather_cp:
        out.append(_F(id="PAR-6", level="warning", fields=["resources.cp"],
                      message="A DSA model with CP > 1 needs the all-gather CP layout, and its model spec lacks --allgather-cp.",
                      fix="Keep --allgather-cp in the DSA model spec, or set CP to 1."))
    if not spec.dsa and spec.allgather_cp and r.cp > 1:
        out.append(_F(id="PAR-6", level="error", fields=["resources.cp"],
                      message="--allgather-cp with CP > 1 on a non-DSA model scrambles token order (zigzag CP is required).",
                      fix="Remove --allgather-cp from the model spec or set CP to 1."))
    return out


def _check_pipeline(exp: Experiment, spec: ModelSpec) -> list[Finding]:
    r, out = exp.resources, []
    first, last = r.pp_first_stage_layers, r.pp_last_stage_layers
    fields = ["resources.pp", "resources.pp_first_stage_layers", "resources.pp_last_stage_layers"]
    if r.pp == 1:
        if first or last:
            out.append(_F(id="PAR-5", level="error", fields=fields,
                          message="First/last pipeline-stage layer counts are given with PP 1.",
                          fix="Clear pp_first_stage_layers and pp_last_stage_layers, or raise PP."))
        return out
    middle_stages = r.pp - (1 if first else 0) - (1 if last else 0)
    rest = spec.layers - (first or 0) - (last or 0)
    if middle_stages <= 0 and rest != 0 or rest < 0 or (middle_stages > 0 and rest % middle_stages):
        even = [pp for pp in (2, 4, 8) if spec.layers % pp == 0]
        out.append(_F(id="PAR-5", level="error", fields=fields,
                      message=f"{spec.layers} layers do not split into PP {r.pp} stages"
                              + (f" with first {first} / last {last}" if first or last else " evenly") + ".",
                      fix=f"Use PP {', '.join(map(str, even)) or '1'} (even split), or first/last counts that leave a multiple of "
                          f"{max(middle_stages, 1)} layers for the middle stages."))
        return out
    if spec.dsa:
        per = rest // middle_stages if middle_stages > 0 else 0
        starts, layer = [0], first if first else per
        for _ in range(r.pp - 1):
            starts.append(layer)
            layer += per
        bad = [s for s in starts if not spec.dsa_computes_index(s)]
        if bad:
            out.append(_F(id="PAR-5", level="error", fields=fields,
                          message=f"With DSA index sharing, pipeline stages starting at layers {bad} would reuse an index computed "
                                  "on the previous stage; the model fails to build.",
                          fix=f"Start every stage on an index-computing layer (every {spec.index_topk_freq}th, offset "
                              f"{spec.index_skip_topk_offset}); the reference uses first 14 / last 16 over 8 stages."))
    return out


def _check_batching(exp: Experiment, recipe: Recipe, spec: ModelSpec, d: Derived) -> list[Finding]:
    t, out = exp.task, []
    if d.samples_dropped:
        out.append(_F(id="BAT-3", level="error", fields=["task.num_steps_per_rollout", "task.rollout_batch_size", "task.n_samples_per_prompt"],
                      message=f"S = {t.rollout_batch_size} × {t.n_samples_per_prompt} = {d.samples_per_rollout} samples do not split into "
                              f"{t.num_steps_per_rollout} optimizer steps: {d.samples_dropped} samples are dropped every rollout.",
                      fix=f"Choose steps per rollout that divide {d.samples_per_rollout} (e.g. 1), or change the batch."))
    if d.dp and _gpu_run(recipe):
        if d.global_batch_size % d.dp:
            out.append(_F(id="BAT-4", level="error", fields=["task.num_steps_per_rollout", "task.rollout_batch_size", "placement.train_gpus"],
                          message=f"The global batch of {d.global_batch_size} samples is not divisible by DP {d.dp} (micro-batch 1).",
                          fix=f"Make S / steps a multiple of {d.dp}."))
    if t.n_samples_per_prompt == 1 and t.advantage_estimator in GROUP_ESTIMATORS:
        out.append(_F(id="BAT-6", level="error", fields=["task.n_samples_per_prompt", "task.advantage_estimator"],
                      message=f"{t.advantage_estimator} with one sample per prompt: each reward minus its own group mean is 0, so every "
                              "advantage is zero and nothing is learned (silently).",
                      fix="Use n_samples_per_prompt ≥ 2 (typically 4–16), or switch to reinforce_plus_plus or ppo."))
    over = exp.rollout.over_sampling_batch_size
    if over is not None and over < t.rollout_batch_size:
        out.append(_F(id="BAT-7", level="error", fields=["rollout.over_sampling_batch_size", "task.rollout_batch_size"],
                      message=f"Over-sampling {over} prompts is fewer than the rollout batch of {t.rollout_batch_size}.",
                      fix=f"Over-sample 1.5–3 × the rollout batch, e.g. {2 * t.rollout_batch_size}."))
    cap = exp.resources.max_tokens_per_gpu * exp.resources.cp
    if _gpu_run(recipe) and cap < exp.rollout.max_response_len:
        out.append(_F(id="BAT-5", level="warning", fields=["resources.max_tokens_per_gpu", "rollout.max_response_len", "resources.cp"],
                      message=f"The packing cap (max tokens per GPU × CP = {cap}) is below the longest response ({exp.rollout.max_response_len} "
                              "tokens): a long sample gets a micro-batch of its own, over budget, which risks OOM on long tails.",
                      fix="Raise max_tokens_per_gpu toward (prompt + max response) / CP once memory allows, or use CP for long samples."))
    return out


def _check_scheduling(exp: Experiment, recipe: Recipe, spec: ModelSpec, d: Derived) -> list[Finding]:
    p, c, out = exp.placement, exp.corrections, []
    corrected = c.tis or c.icepop
    if p.scheduling == "async":
        if p.ownership == "colocated":
            out.append(_F(id="COL-1", level="error", fields=["placement.scheduling", "placement.ownership"],
                          message="Fully async on a shared (colocated) GPU pool: rollout and training would overlap on the same GPUs; "
                                  "the async driver rejects --colocate.",
                          fix="Choose disaggregated pools (selecting async does it for you), or synchronous scheduling."))
        if not corrected:
            out.append(_F(id="ASY-1", level="warning", fields=["placement.scheduling", "corrections.tis", "corrections.icepop"],
                          message="Fully async trains on samples at least one policy version old, without off-policy correction.",
                          fix="Turn on TIS (corrections.tis) or IcePop and watch the mismatch metrics."))
        if exp.task.num_steps_per_rollout > 1:
            out.append(_F(id="LAB-ASY-STEPS", level="warning", fields=["task.num_steps_per_rollout", "placement.scheduling"],
                          message=f"Fully async with {exp.task.num_steps_per_rollout} optimizer steps per rollout: every step moves the policy "
                                  "further from the samples in flight, so staleness compounds silently.",
                          fix="Use num_steps_per_rollout 1 with TIS."))
        backlog = exp.serving.concurrency * max(d.engines, 1)
        if d.samples_per_rollout and backlog > 2 * d.samples_per_rollout:
            out.append(_F(id="ASY-3", level="warning", fields=["serving.concurrency", "task.rollout_batch_size"],
                          message=f"{backlog} requests in flight (concurrency {exp.serving.concurrency} × {max(d.engines, 1)} engines) against "
                                  f"{d.samples_per_rollout} samples per rollout: samples may be trained ≈{d.expected_staleness} rollouts after they were drawn.",
                          fix=f"Size concurrency × engines to about 1–2 × S (≈{max(1, 2 * d.samples_per_rollout // max(d.engines, 1))} per engine) and enable TIS."))
        if exp.evaluation.enabled:
            out.append(_F(id="EVL-2", level="error", fields=["evaluation.enabled", "placement.scheduling"],
                          message="The fully async queue does not implement evaluation; the run would crash at the first eval.",
                          fix="Turn evaluation off here and schedule a separate eval job (or a supported evaluation path) on saved checkpoints."))
    if exp.rollout.partial_rollout:
        over = exp.rollout.over_sampling_batch_size
        if over is None or over <= exp.task.rollout_batch_size:
            out.append(_F(id="PRT-1", level="warning", fields=["rollout.partial_rollout", "rollout.over_sampling_batch_size"],
                          message="Partial rollout without over-sampling: only requests still in flight at the batch boundary are recycled, "
                                  "and without extra submissions there are none, so the flag does nothing.",
                          fix=f"Set over_sampling_batch_size above the rollout batch (e.g. {2 * exp.task.rollout_batch_size}), or turn partial rollout off."))
        if not corrected:
            out.append(_F(id="LAB-PRT-TIS", level="warning", fields=["rollout.partial_rollout", "corrections.tis"],
                          message="Recycled partial samples carry tokens from older policies and are trained as if on-policy.",
                          fix="Enable TIS (corrections.tis) or IcePop."))
    if exp.rollout.queue and not exp.rollout.queue_state_dir:
        out.append(_F(id="LAB-QUEUE-1", level="error", fields=["rollout.queue", "rollout.queue_state_dir"],
                      message="straw (the persistent queue) has no state directory to keep payloads and queue state.",
                      fix="Set rollout.queue_state_dir to a directory on the shared filesystem."))
    return out


def _check_serving(exp: Experiment, recipe: Recipe, spec: ModelSpec, d: Derived) -> list[Finding]:
    s, p, out = exp.serving, exp.placement, []
    if s.pd.enabled:
        e = p.engine_gpus
        pd_fields = ["serving.pd.prefill_engines", "serving.pd.decode_engines", "placement.rollout_gpus", "placement.engine_gpus"]
        if p.ownership == "external":
            out.append(_F(id="SGL-4", level="error", fields=["serving.pd.enabled", "placement.ownership"],
                          message="PD groups cannot be combined with external engines; the external deployment owns its topology.",
                          fix="Configure PD in the external launcher, or choose colocated/disaggregated."))
        elif s.pd.prefill_engines == 0 or s.pd.decode_engines == 0:
            out.append(_F(id="SGL-4", level="error", fields=pd_fields,
                          message="A PD group has 0 engines: both prefill and decode need at least one whole engine.",
                          fix="Give each group at least one engine."))
        elif (s.pd.prefill_engines + s.pd.decode_engines) * e != p.rollout_gpus:
            need = (s.pd.prefill_engines + s.pd.decode_engines) * e
            out.append(_F(id="SGL-4", level="error", fields=pd_fields,
                          message=f"PD groups of {s.pd.prefill_engines} prefill + {s.pd.decode_engines} decode engines × {e} GPUs = {need} GPUs, "
                                  f"but the rollout pool has {p.rollout_gpus}: the groups must hold whole engines that add up to the pool.",
                          fix=f"Set the rollout pool to {need} GPUs, or split {d.engines} engines as e.g. "
                              f"{max(1, d.engines // 2)} prefill + {max(1, d.engines - d.engines // 2)} decode."))
        if not s.pd.rdma_devices and p.ownership != "external":
            out.append(_F(id="SGL-5", level="error", fields=["serving.pd.rdma_devices"],
                          message="PD moves the KV cache with Mooncake over RDMA and needs the InfiniBand device names of your nodes.",
                          fix="Fill in the RDMA devices from your environment (ibv_devices), e.g. mlx5_0."))
        if s.hicache.enabled:
            out.append(_F(id="SGL-5", level="info", fields=["serving.hicache.enabled", "serving.pd.enabled"],
                          message="Under PD, HiCache is enabled on the prefill engines only (decode workers run without the radix cache).",
                          fix="Budget host memory for the prefill engines; nothing to change."))
    if s.hicache.enabled and p.ownership == "colocated":
        out.append(_F(id="SGL-6", level="info", fields=["serving.hicache.enabled", "placement.ownership"],
                      message="HiCache under colocation keeps its host cache allocated through training unless it is released.",
                      fix="The shell passes --sglang-release-hicache (slime's patched SGLang); keep it."))
    if s.eagle.enabled:
        out += _check_eagle(exp, recipe, spec)
    if p.ownership == "colocated" and s.mem_fraction_static > 0.8:
        out.append(_F(id="COL-2", level="warning", fields=["serving.mem_fraction_static", "placement.ownership"],
                      message=f"SGLang claims {s.mem_fraction_static:.0%} of GPU memory while colocated; Megatron's leftovers "
                              "(CUDA context, NCCL buffers) may not fit.",
                      fix="Use 0.4–0.7 under colocation; lower it on OOM."))
    return out


def _check_eagle(exp: Experiment, recipe: Recipe, spec: ModelSpec) -> list[Finding]:
    eg, out = exp.serving.eagle, []
    if eg.head == "separate" and not eg.draft_head_path:
        out.append(_F(id="LAB-EAGLE-1", level="error", fields=["serving.eagle.head", "serving.eagle.draft_head_path"],
                      message="EAGLE with a separate head needs the path of that draft-head checkpoint.",
                      fix="Set serving.eagle.draft_head_path to a compatible EAGLE head, or use the checkpoint's MTP head."))
    if eg.head == "mtp" and spec.mtp_layers == 0:
        out.append(_F(id="LAB-EAGLE-2", level="error", fields=["serving.eagle.head", "serving.eagle.enabled"],
                      message=f"{recipe.display_name} has no MTP layer to draft with (only the DeepSeek, GLM MoE and Qwen3.5-family "
                              "checkpoints carry one).",
                      fix="Provide a separate EAGLE head (head: separate + draft_head_path), or turn EAGLE off."))
    out.append(_F(id="SGL-7", level="info", fields=["serving.eagle.enabled", "serving.concurrency"],
                  message="With speculation on, SGLang caps concurrent requests at a small default (48) unless set explicitly; "
                          f"the shell passes --sglang-max-running-requests {exp.serving.concurrency}. Draft heads stay frozen "
                          "unless MTP training is on, so acceptance falls as the policy drifts.",
                  fix="Keep serving.concurrency explicit and monitor the acceptance rate."))
    return out


def _check_precision(exp: Experiment, recipe: Recipe, spec: ModelSpec, d: Derived) -> list[Finding]:
    pr, out = exp.precision, []
    image = get_image(exp.install.image)
    hw = image.name if image else exp.install.image
    uses = {"fp8_training": pr.training == "fp8", "fp8_rollout": pr.rollout == "fp8", "int4_rollout": pr.rollout == "int4"}
    fields = {"fp8_training": "precision.training", "fp8_rollout": "precision.rollout", "int4_rollout": "precision.rollout"}
    label = {"fp8_training": "FP8 training", "fp8_rollout": "FP8 rollout", "int4_rollout": "INT4 rollout"}
    for key, used in uses.items():
        if not used:
            continue
        support = getattr(recipe.precision, key)
        if support == "unsupported":
            out.append(_F(id="LAB-PRC-1", level="error", fields=[fields[key]],
                          message=f"{label[key]} is not supported for {recipe.display_name}.", fix="Use BF16."))
        elif support in ("experimental", "beta"):
            out.append(_F(id="LAB-PRC-1", level="warning", fields=[fields[key]],
                          message=f"{label[key]} is {support} for {recipe.display_name}.",
                          fix="Establish a BF16 baseline first and compare reward and mismatch metrics."))
    if image is None:
        out.append(_F(id="LAB-IMG-1", level="warning", fields=["install.image"],
                      message=f"{exp.install.image} is not a known image (docker/images.yaml); hardware checks are skipped.",
                      fix="Choose a known image, or check FP8/INT4 support of your GPUs yourself."))
    else:
        if pr.training == "fp8" and not image.fp8:
            out.append(_F(id="PRC-1", level="error", fields=["precision.training", "install.image"],
                          message=f"FP8 (blockwise) training needs Hopper or newer; {hw} has none.",
                          fix="Use BF16 training, or a Hopper/Blackwell image."))
        if pr.rollout == "fp8" and not image.fp8:
            out.append(_F(id="PRC-2", level="error", fields=["precision.rollout", "install.image"],
                          message=f"FP8 rollout uses block-FP8 kernels for sm90+; {hw} lacks them.",
                          fix="Use BF16 (or INT4) rollout, or a Hopper/Blackwell image."))
        if pr.kv_cache_dtype == "fp8_e4m3" and not image.fp8:
            out.append(_F(id="PRC-2", level="error", fields=["precision.kv_cache_dtype", "install.image"],
                          message=f"An FP8 KV cache needs FP8-capable GPUs; {hw} has none.",
                          fix="Use the auto/bf16 KV cache, or a Hopper/Blackwell image."))
        if pr.rollout == "int4" and not image.int4:
            out.append(_F(id="PRC-4", level="error", fields=["precision.rollout", "install.image"],
                          message=f"INT4 rollout kernels are not available on {hw}.",
                          fix="Use BF16 rollout, or an image with INT4 kernels (Ampere or newer)."))
    low = pr.rollout != "bf16" or pr.kv_cache_dtype == "fp8_e4m3"
    if low and not (exp.corrections.tis or exp.corrections.icepop):
        out.append(_F(id="PRC-5", level="warning", fields=["precision.rollout", "precision.kv_cache_dtype", "corrections.tis"],
                      message="Low-precision rollout widens the gap between rollout and training log-probs, which biases the update.",
                      fix="Turn on TIS (corrections.tis) or IcePop and watch the mismatch metrics."))
    if recipe.kind == "hybrid" and pr.recurrent_state_dtype is None:
        out.append(_F(id="LAB-HYB-1", level="error", fields=["precision.recurrent_state_dtype"],
                      message=f"{recipe.display_name} is hybrid (Gated DeltaNet): its recurrent state needs a dtype of its own.",
                      fix="Set precision.recurrent_state_dtype to float32 (safe) or bfloat16."))
    if recipe.kind != "hybrid" and (pr.recurrent_state_dtype is not None or pr.state_kv_ratio is not None):
        out.append(_F(id="LAB-HYB-2", level="info", fields=["precision.recurrent_state_dtype", "precision.state_kv_ratio"],
                      message=f"{recipe.display_name} has no recurrent state; the state dtype and ratio are ignored.",
                      fix="Clear them."))
    return out


def _check_corrections(exp: Experiment, recipe: Recipe, spec: ModelSpec, d: Derived) -> list[Finding]:
    c, out = exp.corrections, []
    if c.tis and c.icepop:
        out.append(_F(id="LAB-CORR-1", level="warning", fields=["corrections.tis", "corrections.icepop"],
                      message="TIS and IcePop are both on; IcePop is a TIS variant, and only one correction function runs.",
                      fix="Keep one: TIS clips the ratio, IcePop masks out-of-range tokens."))
    if c.r3 and not spec.is_moe:
        out.append(_F(id="LAB-R3-1", level="warning", fields=["corrections.r3"],
                      message=f"R3 replays MoE expert routes; {recipe.display_name} is dense, so it has no effect.",
                      fix="Turn R3 off."))
    return out


def _check_task(exp: Experiment, recipe: Recipe, spec: ModelSpec, d: Derived) -> list[Finding]:
    t, out = exp.task, []
    if t.kind == "custom":
        missing = [f for f, v in (("task.custom_generate_path", t.custom_generate_path), ("task.custom_reward_path", t.custom_reward_path)) if not v]
        if missing:
            out.append(_F(id="LAB-TASK-1", level="error", fields=missing,
                          message="My agent / reward needs both an importable generate function and a reward function; "
                                  "the lab does not invent a reward for your task.",
                          fix="Give both as dotted paths (my_pkg.agent.generate, my_pkg.reward.score) that exist on every worker."))
    for path, value in (("task.custom_generate_path", t.custom_generate_path), ("task.custom_reward_path", t.custom_reward_path)):
        if value and not (_HOOK_DOTTED.match(value) or _HOOK_FILE.match(value)):
            out.append(_F(id="LAB-TASK-2", level="error", fields=[path],
                          message=f"{value!r} is not an importable function path.",
                          fix="Write it as pkg.module.function or path/to/file.py:function."))
    if t.kind == "math" and t.rm_type == "deepscaler" and recipe.family in NON_REASONING_FAMILIES:
        out.append(_F(id="REW-3", level="info", fields=["task.rm_type", "model.recipe"],
                      message=f"deepscaler grades only the text after </think>; {recipe.display_name} is not a reasoning model and "
                              "may not emit it, which scores every answer 0 unless your prompts ask for it.",
                      fix="For non-reasoning models use rm_type math or dapo, or a prompt that produces </think>."))
    if not t.label_key:
        out.append(_F(id="REW-3", level="error", fields=["task.label_key"],
                      message="A rule-based reward needs the label key of the reference answer.", fix="Set task.label_key (e.g. label)."))
    return out


def _check_paths_eval(exp: Experiment, recipe: Recipe, spec: ModelSpec, d: Derived) -> list[Finding]:
    pa, ev, out = exp.paths, exp.evaluation, []
    if not pa.save.strip():
        out.append(_F(id="CKP-1", level="error", fields=["paths.save", "paths.save_interval"],
                      message="A save interval without a checkpoint directory is rejected.", fix="Set paths.save."))
    if pa.save_interval > exp.task.num_rollout:
        out.append(_F(id="LAB-CKP-1", level="info", fields=["paths.save_interval", "task.num_rollout"],
                      message=f"The run has {exp.task.num_rollout} rollouts and saves every {pa.save_interval}: no intermediate "
                              "checkpoint is written before the short run ends (only the final one).",
                      fix="Choose a save interval appropriate for your experiment (≤ num_rollout for periodic checkpoints)."))
    if pa.load:
        if pa.load.rstrip("/") != pa.save.rstrip("/"):
            out.append(_F(id="CKP-3", level="warning", fields=["paths.load", "paths.save"],
                          message="Resuming from a directory other than the save directory resets the data cursor, so prompts repeat.",
                          fix="Set paths.load equal to paths.save."))
        out.append(_F(id="CKP-2", level="info", fields=["paths.load"],
                      message="--load must be the parent checkpoint directory (with latest_checkpointed_iteration.txt); "
                              "otherwise the run silently starts fresh from --ref-load.",
                      fix="Point paths.load at the directory given to --save, not an iter_… subfolder."))
    if ev.enabled and not ev.data_path.strip():
        out.append(_F(id="EVL-1", level="error", fields=["evaluation.data_path"],
                      message="Evaluation is on without a held-out data set.", fix="Set evaluation.data_path (e.g. aime-2024.jsonl)."))
    if not pa.prompt_data.strip():
        out.append(_F(id="DAT-1", level="error", fields=["paths.prompt_data"],
                      message="No prompt data set: the run would generate from empty prompts.", fix="Set paths.prompt_data (JSONL or parquet)."))
    return out


CHECKS = (_check_resources, _check_engines, _check_parallel, _check_batching, _check_scheduling,
           _check_serving, _check_precision, _check_corrections, _check_task, _check_paths_eval)
