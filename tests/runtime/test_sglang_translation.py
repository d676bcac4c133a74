"""sglang.yaml + --sglang-* flags -> SGLang launch arguments, checked against the flag table of
slime/rollout/engines/sglang_flags.py (SGLang SGLANG_VERSION). No SGLang, no GPU needed."""

from __future__ import annotations

import pytest

from slime.rollout.engines import sglang_flags
from slime.rollout.engines.sglang import (
    EngineSpec,
    TranslationError,
    default_groups,
    launch_command,
    launch_fields,
    load_server_groups,
    plan_engines,
    to_argv,
)
from tests.refusal_codes import raised

PD_YAML = """\
sglang:
  - name: actor
    update_weights: true
    server_groups:
      - worker_type: prefill
        num_gpus: 8
        num_gpus_per_engine: 8
        overrides:
          disaggregation_transfer_backend: "mooncake"
          enable_hierarchical_cache: true
          hicache_size: 64
          speculative_algorithm: "EAGLE"
          speculative_num_steps: 3
          speculative_eagle_topk: 1
          speculative_num_draft_tokens: 4
          max_running_requests: 256
      - worker_type: decode
        num_gpus: 16
        num_gpus_per_engine: 8
        overrides:
          disaggregation_transfer_backend: "mooncake"
          speculative_algorithm: "EAGLE"
          speculative_num_steps: 3
          speculative_eagle_topk: 1
          speculative_num_draft_tokens: 4
          max_running_requests: 256
"""


def _flags_of(argv: list[str]) -> list[str]:
    return [a for a in argv if a.startswith("--")]


def _launch(spec: EngineSpec, **kw) -> list[str]:
    args = dict(model_path="/ckpt/Qwen3-30B", host="10.0.0.2", port=30000, nccl_port=30001, seed=42,
                base_gpu_id=0, offload_rollout=False)
    args.update(kw)
    return launch_command(launch_fields(spec, **args))


def _value(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


def test_every_translated_flag_is_in_the_table_of_the_documented_version(tmp_path):
    assert sglang_flags.SGLANG_VERSION.startswith("0.5.")
    table = {sglang_flags.flag(f) for f in sglang_flags.FLAGS}
    y = tmp_path / "sglang.yaml"
    y.write_text(PD_YAML)
    specs = plan_engines(load_server_groups(y), {"mem_fraction_static": "0.7", "disaggregation_ib_device":
                                                 "mlx5_0,mlx5_1", "enable_dp_attention": True, "dp_size": "8"},
                         rollout_gpus=24)
    for s in specs:
        argv = _launch(s, nnodes=2, node_rank=1, dist_init_addr="10.0.0.1:5000", offload_rollout=True)
        assert argv[:3] == ["python3", "-m", "sglang.launch_server"]
        assert set(_flags_of(argv)) <= table, set(_flags_of(argv)) - table


def test_pd_with_mooncake_ib_devices_hicache_on_prefill_only_and_eagle(tmp_path):
    y = tmp_path / "sglang.yaml"
    y.write_text(PD_YAML)
    specs = plan_engines(load_server_groups(y), {"mem_fraction_static": "0.7",
                                                 "disaggregation_ib_device": "mlx5_0,mlx5_1"})
    assert [s.worker_type for s in specs] == ["prefill", "decode", "decode"]
    assert [s.first_gpu for s in specs] == [0, 8, 16]
    prefill, decode = _launch(specs[0]), _launch(specs[1], base_gpu_id=0, port=30010)
    assert prefill[3:] == [
        "--mem-fraction-static", "0.7", "--disaggregation-ib-device", "mlx5_0,mlx5_1",
        "--disaggregation-transfer-backend", "mooncake", "--enable-hierarchical-cache", "--hicache-size", "64",
        "--speculative-algorithm", "EAGLE", "--speculative-num-steps", "3", "--speculative-eagle-topk", "1",
        "--speculative-num-draft-tokens", "4", "--max-running-requests", "256",
        "--disaggregation-mode", "prefill", "--disaggregation-bootstrap-port", "8998",
        "--load-balance-method", "follow_bootstrap_room", "--tp-size", "8",
        "--model-path", "/ckpt/Qwen3-30B", "--trust-remote-code", "--skip-server-warmup", "--enable-metrics",
        "--random-seed", "42", "--host", "10.0.0.2", "--port", "30000", "--nccl-port", "30001",
        "--base-gpu-id", "0", "--gpu-id-step", "1", "--enable-draft-weights-cpu-backup"]
    assert "--enable-hierarchical-cache" not in decode and "--hicache-size" not in decode
    assert _value(decode, "--disaggregation-mode") == "decode" and "--prefill-round-robin-balance" in decode
    assert _value(decode, "--disaggregation-ib-device") == "mlx5_0,mlx5_1"
    assert "--disaggregation-bootstrap-port" not in decode
    # HiCache passed to every engine as a flag: decode engines drop it and say so.
    specs = plan_engines(load_server_groups(y), {"enable_hierarchical_cache": True})
    assert "--enable-hierarchical-cache" in _launch(specs[0]) and "--enable-hierarchical-cache" not in _launch(specs[1])
    assert any("decode engines run without HiCache" in n for n in specs[1].notices)


def test_regular_group_flags_dp_attention_memory_saver_and_multinode():
    specs = plan_engines(default_groups(32, 16, None), {"enable_dp_attention": True, "dp_size": "4",
                                                        "mem_fraction_static": "0.6", "tp_size": "2"})
    assert len(specs) == 2 and all(s.worker_type == "regular" for s in specs)
    assert any("--sglang-tp-size is set by slime" in n for n in specs[0].notices)  # SGL-1: dropped, said
    argv = _launch(specs[1], offload_rollout=True, nnodes=2, node_rank=1, dist_init_addr="10.0.0.1:5000",
                   base_gpu_id=0)
    assert _value(argv, "--tp-size") == "16" and _value(argv, "--dp-size") == "4" and "--enable-dp-attention" in argv
    assert "--enable-memory-saver" in argv
    assert (_value(argv, "--nnodes"), _value(argv, "--node-rank"), _value(argv, "--dist-init-addr")) == \
        ("2", "1", "10.0.0.1:5000")
    assert argv.count("--tp-size") == 1


def test_overrides_win_over_flags_and_eagle_without_cap_gets_the_concurrency(tmp_path):
    y = tmp_path / "sglang.yaml"
    y.write_text("sglang:\n  - name: actor\n    server_groups:\n      - worker_type: regular\n        num_gpus: 4\n"
                 "        num_gpus_per_engine: 2\n        overrides:\n          mem_fraction_static: 0.5\n"
                 "          speculative_algorithm: EAGLE\n")
    (spec, _) = plan_engines(load_server_groups(y), {"mem-fraction-static": "0.8"}, server_concurrency=384)
    argv = _launch(spec)
    assert _value(argv, "--mem-fraction-static") == "0.5"
    assert _value(argv, "--max-running-requests") == "384"  # SGL-7


def test_pd_from_prefill_num_servers():
    specs = plan_engines(default_groups(8, 2, 1), {})
    assert [s.worker_type for s in specs] == ["prefill", "decode", "decode", "decode"]
    assert _value(_launch(specs[0]), "--disaggregation-transfer-backend") == "mooncake"


@pytest.mark.parametrize("flags,yaml,code", [
    ({"dp_size": "2"}, None, "sglang.dp_attention"),
    ({"dp_size": "3", "enable_dp_attention": True}, None, "sglang.dp_divides"),
    ({"enable_dp_lm_head": True}, None, "sglang.dp_lm_head"),
    ({"speculative_draft_model_pathh": "/x"}, None, "sglang.unknown_fields"),
    ({"enable_hierarchical_cache": True, "disable_radix_cache": True}, None, "sglang.hicache_radix"),
    ({}, "      - worker_type: regular\n        num_gpus: 2\n      - worker_type: prefill\n        num_gpus: 2\n",
     "sglang.group_mixed"),
    ({}, "      - worker_type: prefil\n        num_gpus: 2\n", "sglang.worker_type"),
    ({}, "      - worker_type: regular\n        num_gpus: 0\n", "sglang.group_gpus"),
    ({}, "      - worker_type: regular\n        num_gpus: 3\n        num_gpus_per_engine: 2\n", "sglang.group_whole"),
])
def test_invalid_combinations_are_refused_with_the_reason(tmp_path, flags, yaml, code):
    with pytest.raises(TranslationError) as e:
        if yaml:
            y = tmp_path / "s.yaml"
            y.write_text("sglang:\n  - name: actor\n    server_groups:\n" + yaml)
            plan_engines(load_server_groups(y), flags)
        else:
            plan_engines(default_groups(4, 2, None), flags)
    assert raised(e.value, code)


def test_gpu_totals_must_match_rollout_gpus_and_pd_must_leave_decode():
    with pytest.raises(TranslationError) as e:
        plan_engines(default_groups(4, 2, None), {}, rollout_gpus=8)
    assert raised(e.value, "sglang.groups_total", total=4, gpus=8)
    with pytest.raises(TranslationError) as e:
        default_groups(4, 2, 2)
    assert raised(e.value, "sglang.prefill_no_decode")


def test_lab_rendered_yaml_translates(tmp_path):
    """The lab renderer's template (lab/render/templates/sglang.yaml.j2) parses and translates."""
    jinja2 = pytest.importorskip("jinja2")
    from pathlib import Path

    src = Path(__file__).resolve().parents[2] / "lab/render/templates/sglang.yaml.j2"
    env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True)
    env.filters["comment"] = str
    text = env.from_string(src.read_text()).render(
        recipe={"name": "t"}, commit="abc", yaml_value=lambda v: str(v).lower() if isinstance(v, bool) else str(v),
        groups=[{"worker_type": "prefill", "num_gpus": 4, "num_gpus_per_engine": 4,
                 "overrides": {"disaggregation_transfer_backend": "mooncake", "enable_hierarchical_cache": True,
                               "hicache_size": 32}},
                {"worker_type": "decode", "num_gpus": 4, "num_gpus_per_engine": 4,
                 "overrides": {"disaggregation_transfer_backend": "mooncake"}}])
    y = tmp_path / "sglang.yaml"
    y.write_text(text)
    specs = plan_engines(load_server_groups(y), {}, rollout_gpus=8)
    assert [s.worker_type for s in specs] == ["prefill", "decode"]
    assert "--enable-hierarchical-cache" in to_argv(specs[0].fields)


def test_cuda_graph_batch_sizes_pass_through_as_one_list_flag():
    """`--sglang-cuda-graph-bs 1 2 4 $(seq 8 8 32)` in a launch script: every size after one flag."""
    from slime.args import parse_args

    cfg = parse_args(["--sglang-cuda-graph-bs", "1", "2", "4", "8", "16", "24", "32"])
    (spec,) = plan_engines(default_groups(2, 2, None), cfg.sglang)
    argv = _launch(spec)
    at = argv.index("--cuda-graph-bs")
    assert argv[at + 1:at + 8] == ["1", "2", "4", "8", "16", "24", "32"] and argv.count("--cuda-graph-bs") == 1
