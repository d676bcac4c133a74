"""The command line: names users know, pass-through, and errors that name the flag."""

from __future__ import annotations

import pytest

from slime.args import UsageError, parse_args, validate
from tests.refusal_codes import codes, has, raised

BASE = ["--rollout-batch-size", "4", "--n-samples-per-prompt", "4", "--num-rollout", "2", "--rm-type", "math",
        "--actor-num-gpus-per-node", "1", "--rollout-num-gpus", "1"]


def test_unknown_flag_names_the_closest_known_flag():
    with pytest.raises(UsageError) as e:
        parse_args(["--rollout-batch-sise", "4"])
    assert raised(e.value, "usage.unknown_flag_hint", flag="--rollout-batch-sise", close="--rollout-batch-size")


def test_eval_prompt_data_with_odd_item_count_is_refused():
    with pytest.raises(UsageError) as e:
        parse_args([*BASE, "--eval-prompt-data", "aime", "a.jsonl", "b.jsonl"])
    assert raised(e.value, "usage.eval_pairs", count=3)


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
    assert has(errors, "embedded.trainer_parallel", flag="--tensor-model-parallel-size", value=2), errors


def test_model_flags_that_disagree_with_config_json_are_refused(tiny):
    cfg = parse_args([*BASE, "--hidden-size", "128", "--hf-checkpoint", str(tiny["model"]),
                      "--prompt-data", str(tiny["train"])])
    # a message without a code (the config.json check prefixes the file), matched by its text
    assert any("hidden_size = 64 in config.json, but the spec says --hidden-size 128" in e for e in validate(cfg))


def test_validate_names_each_problem_by_flag():
    cfg = parse_args(["--n-samples-per-prompt", "1", "--save-interval", "2", "--use-kl-loss"])
    found = codes(validate(cfg))
    for code in ("args.run_length", "args.rollout_batch", "args.save_interval", "args.kl_loss_ref", "args.prompt_data",
                 "args.hf_checkpoint"):
        assert code in found


def test_global_batch_that_drops_samples_is_refused():
    cfg = parse_args([*BASE, "--global-batch-size", "5"])
    assert has(validate(cfg), "args.gbs_divides", gbs=5, samples=16)


def test_async_entry_refuses_colocate_with_a_clear_message():
    cfg = parse_args([*BASE, "--colocate"], async_mode=True)
    assert has(validate(cfg), "args.async_colocate")


def test_bad_flags_stop_before_ray_reserves_anything(tiny):
    ray = pytest.importorskip("ray")
    from slime.ray.runtime import PreflightError, preflight

    cfg = parse_args([*BASE, "--tensor-model-parallel-size", "2", "--hf-checkpoint", str(tiny["model"]),
                      "--prompt-data", str(tiny["train"])])
    was_up = ray.is_initialized()
    with pytest.raises(PreflightError) as info:
        preflight(cfg)
    assert raised(info.value, "embedded.trainer_parallel", flag="--tensor-model-parallel-size", value=2)
    assert ray.is_initialized() == was_up  # preflight never starts Ray


def test_cluster_sizes_beyond_the_runtime_limits_are_refused_naming_the_flag():
    from slime.limits import MAX_GPUS_PER_NODE, MAX_NODES

    cfg = parse_args([*BASE, "--actor-num-nodes", str(MAX_NODES + 1),
                      "--actor-num-gpus-per-node", str(MAX_GPUS_PER_NODE + 1)])
    errors = validate(cfg)
    assert has(errors, "limits.outside", flag="--actor-num-nodes", value=MAX_NODES + 1), errors
    assert has(errors, "limits.outside", flag="--actor-num-gpus-per-node", value=MAX_GPUS_PER_NODE + 1)
    assert not has(validate(parse_args(BASE)), "limits.outside")


def test_the_lab_bounds_nodes_and_gpus_by_the_runtime_limits():
    from lab.core.experiment import Experiment
    from slime import limits

    fields = Experiment.model_fields["placement"].annotation.model_fields
    bound = {name: next(m.le for m in fields[name].metadata if getattr(m, "le", None) is not None)
             for name in ("nodes", "gpus_per_node", "train_gpus", "rollout_gpus")}
    assert bound == {"nodes": limits.MAX_NODES, "gpus_per_node": limits.MAX_GPUS_PER_NODE,
                     "train_gpus": limits.MAX_GPUS, "rollout_gpus": limits.MAX_GPUS}
