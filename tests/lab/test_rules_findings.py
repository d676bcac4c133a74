"""validate(): each rule fires with its level, the fields it names and a fix; none on recipe defaults."""
from __future__ import annotations

import pytest

from lab.core.change import validated
from lab.core.experiment import set_path
from lab.core.recipes import all_recipes
from lab.rules.dependents import new_experiment
from lab.rules.derive import derive
from lab.rules.validate import validate
from tests.lab.runtime_pending import pending

HOPPER = "slimerl/slime:0.1.0-cu130-hopper"
AMPERE = "slimerl/slime:0.1.0-cu130-ampere"


def raw(recipe: str, **changes):
    """The recipe's defaults with fields set directly (no dependent changes): a state to validate."""
    data = new_experiment(recipe).model_dump(mode="json")
    for path, value in changes.items():
        set_path(data, path.replace("__", "."), value)
    return validated(data)


def find(exp, rule_id):
    return [f for f in validate(exp) if f.id == rule_id]


@pytest.mark.parametrize("name", list(all_recipes()))
def test_recipe_defaults_have_no_error_findings_but_the_runtimes_pending_capabilities(name):
    # The runtime's refusals of capabilities it lacks today (tests/lab/runtime_pending.py) are shown,
    # as they must be, at the fields whose flags they name; nothing else is an error.
    errors = [f for f in validate(new_experiment(name)) if f.level == "error"]
    shown = [f for f in errors if pending(f)]
    assert all(f.fields for f in shown)
    assert [f for f in errors if f not in shown] == []


# The runtime's own rules, shown by the lab at the fields whose flags the runtime names:
# (test id, recipe, changes, level, fields that must be named, the runtime's refusal code)
RUNTIME_CASES = [
    ("async_on_shared_pool", "glm4.7", {"placement.scheduling": "async"}, "error",
     ["placement.ownership"], "args.async_colocate"),
    ("grpo_with_one_sample", "glm4-9b", {"task.n_samples_per_prompt": 1}, "error",
     ["task.n_samples_per_prompt"], "args.one_sample_group"),
    ("samples_not_divisible_by_steps", "glm4-9b", {"task.num_steps_per_rollout": 3}, "error",
     ["task.rollout_batch_size", "task.n_samples_per_prompt"], "args.gbs_divides"),
    ("global_batch_not_divisible_by_dp", "glm4.7", {"task.rollout_batch_size": 1, "task.n_samples_per_prompt": 3}, "error",
     ["placement.train_gpus"], "args.gbs_dp"),
    ("over_sampling_below_rollout_batch", "glm4-9b", {"rollout.over_sampling_batch_size": 16}, "error",
     ["rollout.over_sampling_batch_size", "task.rollout_batch_size"], "args.over_sampling"),
    ("partial_rollout_without_over_sampling", "glm4-9b", {"rollout.partial_rollout": True, "corrections.tis": True}, "warning",
     ["rollout.partial_rollout", "rollout.over_sampling_batch_size"], "args.warn_partial_no_over"),
    ("icepop_and_tis_both_on", "glm4.7", {"corrections.icepop": True}, "error",
     ["corrections.tis", "corrections.icepop"], "args.tis_icepop"),
    ("ppo_needs_a_critic", "glm4-9b", {"task.advantage_estimator": "ppo"}, "error",
     ["task.advantage_estimator"], "megatron.ppo_critic"),
    ("external_without_addresses", "glm4-9b", {"placement.ownership": "external"}, "error",
     ["placement.external_engine_addrs"], "usage.expected_some"),
    ("queue_without_state_dir", "glm4-9b", {"rollout.queue": True}, "error", ["rollout.queue_state_dir"], "args.queue_pair"),
    ("save_without_directory", "glm4-9b", {"paths.save": ""}, "error", ["paths.save"], "args.save_interval"),
    ("sc_and_tis_weigh_the_ratio_twice", "glm4.7", {"corrections.sc": True}, "error",
     ["corrections.sc", "corrections.tis"], "args.sc_ratio"),
]


@pytest.mark.parametrize("case", RUNTIME_CASES, ids=[c[0] for c in RUNTIME_CASES])
def test_runtime_refusal_is_shown_at_the_fields_whose_flags_it_names(case):
    _, recipe, changes, level, fields, code = case
    exp = raw(recipe, **{k.replace(".", "__"): v for k, v in changes.items()})
    hits = [f for f in validate(exp) if f.id == "RUNTIME" and f.level == level and f.params["code"] == code]
    assert hits, [f.message for f in validate(exp)]
    assert set(fields) <= set(hits[0].fields)
    assert hits[0].fix


def test_async_keeps_held_out_eval_and_predicts_a_one_step_lookahead():
    exp = raw("glm4-9b", placement__scheduling="async", evaluation__enabled=True, corrections__tis=True)
    assert not [f for f in validate(exp) if "evaluation.enabled" in f.fields and f.level == "error"]
    assert derive(exp).expected_staleness == 1.0
    assert derive(raw("glm4-9b")).expected_staleness == 0.0


# (test id, recipe, changes, rule id, level, fields that must be named, a word the fix must mention)
CASES = [
    ("parallelism_not_dividing_gpus", "glm4-9b", {"resources.tp": 4}, "PAR-1", "error", ["resources.tp", "placement.train_gpus"], "DP"),
    ("heads_not_divisible_by_tp", "qwen3.8-27b", {"resources.tp": 16}, "PAR-2", "error", ["resources.tp"], "24"),
    ("experts_not_divisible_by_ep", "deepseek-r1", {"resources.ep": 48}, "PAR-2", "error", ["resources.ep"], "EP"),
    ("layers_not_splitting_over_pp", "glm4-9b", {"resources.pp": 3, "resources.cp": 1, "placement.train_gpus": 6,
                                                 "placement.rollout_gpus": 2}, "PAR-5", "error", ["resources.pp"], "PP"),
    ("dsa_stage_starting_on_reuse_layer", "glm5.3", {"resources.pp_first_stage_layers": 13,
                                                     "resources.pp_last_stage_layers": 17}, "PAR-5", "error",
     ["resources.pp_first_stage_layers"], "14"),
    ("first_last_layers_with_pp_1", "glm4-9b", {"resources.pp_last_stage_layers": 10}, "PAR-5", "error",
     ["resources.pp_last_stage_layers"], "Clear"),
    ("engines_not_dividing_rollout_gpus", "glm4-9b", {"placement.rollout_gpus": 3}, "RES-4", "warning",
     ["placement.rollout_gpus", "placement.engine_gpus"], "multiple of 2"),
    ("engine_larger_than_rollout_pool", "glm4-9b", {"placement.engine_gpus": 8}, "RES-4", "error",
     ["placement.rollout_gpus", "placement.engine_gpus"], "multiple of 8"),
    ("engine_spanning_partial_nodes", "glm4.7", {"placement.engine_gpus": 12}, "RES-4", "error", ["placement.engine_gpus"], "16"),
    ("requested_gpus_exceed_declared", "glm4-9b", {"placement.train_gpus": 8}, "RES-2", "error",
     ["placement.nodes", "placement.train_gpus"], "2 nodes"),
    ("pd_groups_not_holding_the_pool", "glm4-9b", {"serving.pd.enabled": True, "serving.pd.decode_engines": 2,
                                                   "serving.pd.rdma_devices": ["mlx5_0"]}, "SGL-4", "error",
     ["serving.pd.prefill_engines", "serving.pd.decode_engines", "placement.rollout_gpus"], "whole engines"),
    ("pd_group_of_zero", "glm4-9b", {"serving.pd.enabled": True, "serving.pd.prefill_engines": 0,
                                     "serving.pd.rdma_devices": ["mlx5_0"]}, "SGL-4", "error", ["serving.pd.prefill_engines"], "at least one"),
    ("pd_without_rdma_devices", "glm4-9b", {"serving.pd.enabled": True}, "SGL-5", "error", ["serving.pd.rdma_devices"], "mlx5"),
    ("hicache_under_pd_is_prefill_only", "glm4-9b", {"serving.pd.enabled": True, "serving.hicache.enabled": True,
                                                     "serving.pd.rdma_devices": ["mlx5_0"]}, "SGL-5", "info",
     ["serving.hicache.enabled"], "host memory"),
    ("eagle_separate_head_without_path", "qwen3.8-27b", {"serving.eagle.enabled": True, "serving.eagle.head": "separate"}, "LAB-EAGLE-1", "error",
     ["serving.eagle.draft_head_path"], "draft_head_path"),
    ("eagle_mtp_on_model_without_mtp", "glm4-9b", {"serving.eagle.enabled": True}, "LAB-EAGLE-2", "error",
     ["serving.eagle.head"], "separate"),
    ("eagle_needs_explicit_concurrency", "glm4.7-flash", {"serving.eagle.enabled": True}, "SGL-7", "info", ["serving.concurrency"], "concurrency"),
    ("fp8_rollout_on_ampere", "glm4.7", {"install.image": AMPERE, "precision.rollout": "fp8"}, "PRC-2", "error",
     ["precision.rollout", "install.image"], "Hopper"),
    ("fp8_kv_cache_on_ampere", "glm4-9b", {"install.image": AMPERE, "precision.kv_cache_dtype": "fp8_e4m3",
                                           "corrections.tis": True}, "PRC-2", "error", ["precision.kv_cache_dtype"], "bf16"),
    ("fp8_training_on_ampere", "glm4-9b", {"install.image": AMPERE, "precision.training": "fp8"}, "PRC-1", "error",
     ["precision.training", "install.image"], "BF16"),
    ("int4_rollout_without_kernels", "tiny-cpu", {"install.image": "slimerl/slime:0.1.0-cpu", "precision.rollout": "int4"},
     "PRC-4", "error", ["precision.rollout"], "BF16"),
    ("fp8_training_is_experimental", "glm4-9b", {"precision.training": "fp8"}, "LAB-PRC-1", "warning", ["precision.training"], "BF16"),
    ("int4_rollout_is_beta", "glm4-9b", {"precision.rollout": "int4", "corrections.tis": True}, "LAB-PRC-1", "warning",
     ["precision.rollout"], "BF16"),
    ("low_precision_rollout_without_correction", "glm4.7", {"precision.rollout": "fp8", "corrections.tis": False}, "PRC-5", "warning",
     ["precision.rollout", "corrections.tis"], "TIS"),
    ("hybrid_without_recurrent_state_dtype", "qwen3.8-27b", {"precision.recurrent_state_dtype": None}, "LAB-HYB-1", "error",
     ["precision.recurrent_state_dtype"], "float32"),
    ("external_malformed_address", "glm4-9b", {"placement.ownership": "external",
                                               "placement.external_engine_addrs": ["10.0.0.1:30000", "10.0.0.2", "http://h:1"]},
     "LAB-EXT-2", "error", ["placement.external_engine_addrs"], "host:port"),
    ("addresses_with_colocated_ownership", "glm4.7", {"placement.external_engine_addrs": ["10.0.0.1:30000"]}, "RES-6", "warning",
     ["placement.external_engine_addrs", "placement.ownership"], "external"),
    ("custom_task_without_hooks", "glm4-9b", {"task.kind": "custom"}, "LAB-TASK-1", "error",
     ["task.custom_generate_path", "task.custom_reward_path"], "dotted"),
    ("hook_that_is_not_a_dotted_path", "glm4-9b", {"task.kind": "custom", "task.custom_generate_path": "my_pkg.agent.generate",
                                                   "task.custom_reward_path": "score reward"}, "LAB-TASK-2", "error",
     ["task.custom_reward_path"], "pkg.module.function"),
    ("async_with_several_steps_per_rollout", "glm4-9b", {"placement.scheduling": "async", "task.num_steps_per_rollout": 2,
                                                          "corrections.tis": True}, "LAB-ASY-STEPS", "warning",
     ["task.num_steps_per_rollout"], "num_steps_per_rollout 1"),
    ("async_without_correction", "glm4-9b", {"placement.scheduling": "async"}, "ASY-1", "warning", ["corrections.tis"], "TIS"),
    ("token_cap_below_response_length", "glm4.7", {}, "BAT-5", "warning", ["resources.max_tokens_per_gpu"], "CP"),
    ("deepscaler_on_non_reasoning_model", "glm4-9b", {"task.rm_type": "deepscaler"}, "REW-3", "info", ["task.rm_type", "model.recipe"], "math"),
    ("r3_on_dense_model", "glm4-9b", {"corrections.r3": True}, "LAB-R3-1", "warning", ["corrections.r3"], "off"),
    ("save_interval_beyond_short_run", "glm4-9b", {}, "LAB-CKP-1", "info", ["paths.save_interval", "task.num_rollout"], "save interval"),
    ("resume_from_other_directory", "glm4-9b", {"paths.load": "/data/other"}, "CKP-3", "warning", ["paths.load", "paths.save"],
     "paths.save"),
    ("no_gpus_for_a_gpu_recipe", "glm4-9b", {"placement.gpus_per_node": 0}, "LAB-GPU-1", "error", ["placement.gpus_per_node"], "GPUs"),
    ("colocated_memory_fraction_too_high", "glm4.7", {"serving.mem_fraction_static": 0.9}, "COL-2", "warning",
     ["serving.mem_fraction_static"], "0.4–0.7"),
    ("eval_without_data", "glm4-9b", {"evaluation.enabled": True, "evaluation.data_path": ""}, "EVL-1", "error",
     ["evaluation.data_path"], "data_path"),
    ("external_engines_weight_transport", "glm4-9b", {"placement.ownership": "external",
                                                      "placement.external_engine_addrs": ["h:30000"]}, "SYN-3", "info",
     ["placement.ownership"], "disk"),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_rule_fires_with_level_fields_and_fix(case):
    _, recipe, changes, rule_id, level, fields, fix_word = case
    exp = raw(recipe, **{k.replace(".", "__"): v for k, v in changes.items()})
    hits = find(exp, rule_id)
    assert hits, f"{rule_id} did not fire; got {[f.id for f in validate(exp)]}"
    hit = next((h for h in hits if set(fields) <= set(h.fields)), hits[0])
    assert hit.level == level
    assert set(fields) <= set(hit.fields)
    assert fix_word.lower() in (hit.fix + " " + hit.message).lower()


@pytest.mark.parametrize("case", [c for c in CASES if c[2]], ids=[c[0] for c in CASES if c[2]])
def test_rule_is_absent_on_the_recipe_defaults(case):
    _, recipe, _, rule_id, level, fields, _ = case
    assert not [f for f in find(new_experiment(recipe), rule_id) if set(fields) <= set(f.fields) and f.level == level]


def test_idle_gpu_count_is_in_the_message():
    hit = find(raw("glm4-9b", placement__rollout_gpus=3), "RES-4")[0]
    assert "1 GPUs stay idle" in hit.message
    assert derive(raw("glm4-9b", placement__rollout_gpus=3)).idle_rollout_gpus == 1


def test_findings_are_sorted_errors_first():
    levels = [f.level for f in validate(raw("glm4-9b", resources__tp=4, corrections__r3=True))]
    assert levels == sorted(levels, key=["error", "warning", "info"].index)


def test_every_finding_names_known_fields():
    from lab.core.experiment import LEAF_FIELDS

    for case in CASES:
        exp = raw(case[1], **{k.replace(".", "__"): v for k, v in case[2].items()})
        for f in validate(exp):
            assert f.fields and set(f.fields) <= LEAF_FIELDS, f
            assert f.message and f.fix


def test_validate_and_derive_are_fast():
    import time

    exp = new_experiment("deepseek-r1")
    validate(exp), derive(exp)
    best = float("inf")
    for _ in range(5):  # best of 5 batches: robust to a busy machine
        t0 = time.perf_counter()
        for _ in range(50):
            validate(exp)
            derive(exp)
        best = min(best, (time.perf_counter() - t0) / 50)
    assert best < 0.002  # < 1 ms typical on an idle laptop
