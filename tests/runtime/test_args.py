"""The command line: names users know, pass-through, and errors that name the flag."""

from __future__ import annotations

import pytest

from slime.args import UsageError, parse_args, validate

BASE = ["--rollout-batch-size", "4", "--n-samples-per-prompt", "4", "--num-rollout", "2", "--rm-type", "math",
        "--actor-num-gpus-per-node", "1", "--rollout-num-gpus", "1"]


def test_unknown_flag_names_the_closest_known_flag():
    with pytest.raises(UsageError, match=r"unknown flag --rollout-batch-sise; did you mean --rollout-batch-size\?"):
        parse_args(["--rollout-batch-sise", "4"])


def test_eval_prompt_data_with_odd_item_count_is_refused():
    with pytest.raises(UsageError, match="NAME PATH pairs"):
        parse_args([*BASE, "--eval-prompt-data", "aime", "a.jsonl", "b.jsonl"])


def test_megatron_and_sglang_flags_pass_through_into_their_dicts():
    cfg = parse_args([*BASE, "--tensor-model-parallel-size", "1", "--sequence-parallel",
                      "--sglang-mem-fraction-static", "0.7", "--moe-router-topk", "2"])
    assert cfg.megatron == {"tensor_model_parallel_size": "1", "sequence_parallel": True, "moe_router_topk": "2"}
    assert cfg.sglang == {"mem_fraction_static": "0.7"}


def test_defaults_match_the_names_users_know():
    cfg = parse_args(BASE)
    assert cfg.data.input_key == "input" and cfg.data.rollout_seed == 42
    assert cfg.loss.eps_clip == 0.2 and cfg.loss.kl_loss_type == "k1"
    assert cfg.sync.buffer_size == 512 * 1024**2 and cfg.cluster.train_backend == "embedded"


def test_embedded_backend_refuses_tensor_parallelism_naming_the_flag(tiny):
    cfg = parse_args([*BASE, "--tensor-model-parallel-size", "2", "--hf-checkpoint", str(tiny["model"]),
                      "--prompt-data", str(tiny["train"])])
    errors = validate(cfg)
    assert any(e.startswith("--tensor-model-parallel-size 2: the embedded trainer") for e in errors), errors


def test_model_flags_that_disagree_with_config_json_are_refused(tiny):
    cfg = parse_args([*BASE, "--hidden-size", "128", "--hf-checkpoint", str(tiny["model"]),
                      "--prompt-data", str(tiny["train"])])
    assert any("hidden_size = 64 in config.json, but the spec says --hidden-size 128" in e for e in validate(cfg))


def test_validate_names_each_problem_by_flag():
    cfg = parse_args(["--n-samples-per-prompt", "1", "--save-interval", "2", "--use-kl-loss"])
    text = "\n".join(validate(cfg))
    for needle in ("--num-rollout or --num-epoch", "--rollout-batch-size is required", "--save-interval needs --save",
                   "--use-kl-loss needs", "--prompt-data is required", "--hf-checkpoint is required"):
        assert needle in text


def test_global_batch_that_drops_samples_is_refused():
    cfg = parse_args([*BASE, "--global-batch-size", "5"])
    assert any("does not divide the 16 samples" in e for e in validate(cfg))


def test_async_entry_refuses_colocate_with_a_clear_message():
    cfg = parse_args([*BASE, "--colocate"], async_mode=True)
    assert any("train_async.py" in e and "drop --colocate" in e for e in validate(cfg))


def test_bad_flags_stop_before_ray_reserves_anything(tiny):
    ray = pytest.importorskip("ray")
    from slime.ray.runtime import PreflightError, preflight

    cfg = parse_args([*BASE, "--tensor-model-parallel-size", "2", "--hf-checkpoint", str(tiny["model"]),
                      "--prompt-data", str(tiny["train"])])
    was_up = ray.is_initialized()
    with pytest.raises(PreflightError) as info:
        preflight(cfg)
    assert "--tensor-model-parallel-size 2" in str(info.value)
    assert ray.is_initialized() == was_up  # preflight never starts Ray


def test_cluster_sizes_beyond_the_runtime_limits_are_refused_naming_the_flag():
    from slime.limits import MAX_GPUS_PER_NODE, MAX_NODES

    cfg = parse_args([*BASE, "--actor-num-nodes", str(MAX_NODES + 1),
                      "--actor-num-gpus-per-node", str(MAX_GPUS_PER_NODE + 1)])
    errors = validate(cfg)
    assert any(x.startswith(f"--actor-num-nodes {MAX_NODES + 1} is outside") for x in errors), errors
    assert any(x.startswith(f"--actor-num-gpus-per-node {MAX_GPUS_PER_NODE + 1} is outside") for x in errors)
    assert not any("is outside" in x for x in validate(parse_args(BASE)))


def test_the_lab_bounds_nodes_and_gpus_by_the_runtime_limits():
    from lab.experiment import Experiment
    from slime import limits

    fields = Experiment.model_fields["placement"].annotation.model_fields
    bound = {name: next(m.le for m in fields[name].metadata if getattr(m, "le", None) is not None)
             for name in ("nodes", "gpus_per_node", "train_gpus", "rollout_gpus")}
    assert bound == {"nodes": limits.MAX_NODES, "gpus_per_node": limits.MAX_GPUS_PER_NODE,
                     "train_gpus": limits.MAX_GPUS, "rollout_gpus": limits.MAX_GPUS}
