"""What the pre-flight (`train.py --dry-run`, behind `experiment.sh check`) refuses about files on
the cluster (the queue directory, sglang.yaml, data, checkpoints, external engines, the model
spec) carries a refusal code, so the lab shows it in the page's language and not in English."""
from __future__ import annotations

import json

import pytest

from lab.core.messages import localize_finding
from lab.rules.runtime_verdict import runtime_finding
from slime.dry_run import dry_run
from slime.model_spec import ConfigMismatchError, check_config_file, spec_from_text


@pytest.fixture
def base(tmp_path):
    data = tmp_path / "train.jsonl"
    data.write_text(json.dumps({"input": "1+1", "label": "2"}) + "\n")
    hf = tmp_path / "hf"
    hf.mkdir()
    return ["--hf-checkpoint", str(hf), "--prompt-data", str(data), "--label-key", "label", "--rm-type", "math",
            "--num-rollout", "1", "--rollout-batch-size", "2", "--n-samples-per-prompt", "2",
            "--actor-num-gpus-per-node", "2", "--rollout-num-gpus", "1"]


def _only(errors, code):
    got = [e for e in errors if getattr(e, "code", None) == code]
    assert got, [(getattr(e, "code", None), str(e)) for e in errors]
    return got[0]


def _zh(message, field="model.recipe"):
    return localize_finding(runtime_finding("error", [field], message), "zh").message


def test_a_queue_directory_of_another_run_is_refused_with_its_code_and_reads_in_chinese(base, tmp_path):
    q = tmp_path / "queue"
    q.mkdir()
    (q / "index.json").write_text(json.dumps({"format": "straw-v1", "run_id": "old-run"}))
    err = _only(dry_run([*base, "--rollout-queue-dir", str(q), "--rollout-queue-run-id", "new-run"]).errors,
                "queue.other_run")
    assert err.params == {"root": str(q), "owner": "old-run", "run_id": "new-run"}
    assert "to resume run 'old-run', pass its id" in err
    zh = _zh(err, "rollout.queue")
    assert "`--rollout-queue-run-id 'new-run'`" in zh and "新实验需要新的 run id" in zh


def test_an_unreadable_or_malformed_sglang_yaml_is_a_refusal_not_a_traceback(tmp_path):
    """What the cluster's pre-flight reads for --sglang-config (slime.ray.runtime.engine_specs)."""
    from slime.rollout.engines.sglang import TranslationError, load_server_groups

    def refusal(path):
        with pytest.raises(TranslationError) as e:
            load_server_groups(path)
        return e.value.args[0]

    assert refusal(tmp_path).code == "sglang.yaml_unreadable"  # a directory, not a file
    broken = tmp_path / "broken.yaml"
    broken.write_text("sglang: [\n")
    assert refusal(broken).code == "sglang.yaml_syntax"
    wrong = tmp_path / "wrong.yaml"
    wrong.write_text("sglang:\n  - name: actor\n    server_groups:\n      - worker_type: mixed\n        num_gpus: 1\n")
    err = refusal(wrong)
    assert err.code == "sglang.worker_type" and "未知的 `worker_type 'mixed'`" in _zh(err)


def test_missing_data_and_an_incomplete_checkpoint_carry_codes(base, tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"input": "1+1", "label": "2"}\n{"input": \n')
    err = _only(dry_run([*base[:3], str(bad), *base[4:]]).errors, "data.bad_json")
    assert err.startswith(f"{bad}:2: malformed JSON line") and _zh(err).startswith(f"运行时拒绝：`{bad}:2`：JSON 行格式错误")
    ckpt = tmp_path / "ckpt"
    (ckpt / "iter_0000002").mkdir(parents=True)
    err = _only(dry_run([*base, "--load", str(ckpt)]).errors, "checkpoint.no_marker_found")
    assert "the last save did not finish" in err and "上次保存没有完成" in _zh(err)


def test_an_unreachable_external_engine_carries_a_code(base):
    argv = [*base, "--rollout-external-engine-addrs", "127.0.0.1:9", "--rollout-backend", "sglang"]
    err = _only(dry_run(argv).errors, "external.unreachable")
    assert err.params["addr"] == "127.0.0.1:9" and "外部引擎 `127.0.0.1:9`：无法连接" in _zh(err)


def test_the_model_spec_and_config_json_comparison_carries_codes(tmp_path):
    spec = spec_from_text("MODEL_ARGS=(--num-layers 2 --hidden-size 64 --num-attention-heads 4 --vocab-size 14)")
    (tmp_path / "config.json").write_text(json.dumps({"num_hidden_layers": 2, "hidden_size": 96,
                                                       "num_attention_heads": 4, "vocab_size": 14}))
    with pytest.raises(ConfigMismatchError) as e:
        check_config_file(spec, tmp_path)
    assert e.value.args[0].code == "model_spec.config_differs" and "no weights were read" in e.value.args[0]
    (diff,) = [m for m in e.value.mismatches if m.key == "hidden_size"]
    assert diff.refusal.code == "model_spec.mismatch" and str(diff) == diff.refusal
    assert "config.json 中是 `hidden_size = 96`，但 spec 写的是 `--hidden-size 64`" in _zh(diff.refusal)


def test_a_wrapped_refusal_reads_in_chinese_inside_and_out(tmp_path):
    from slime.model_spec import ModelSpecError, load_model_spec

    spec = tmp_path / "bad.sh"
    spec.write_text("MODEL_ARGS=(--num-layers two --hidden-size 64 --num-attention-heads 4 --vocab-size 14)\n")
    with pytest.raises(ModelSpecError) as e:
        load_model_spec(spec)
    err = e.value.args[0]
    assert err.code == "model_spec.in_file" and err.params["error"].code == "model_spec.not_integer"
    assert err == f"{spec}: --num-layers 'two' is not an integer"  # the runtime's English, unchanged
    assert _zh(err).endswith(f"`{spec}`：`--num-layers 'two'` 不是整数")


def test_a_hook_that_cannot_load_is_refused_with_its_code(tmp_path):
    from slime.rewards.hooks import HookLoadError, load_function

    with pytest.raises(HookLoadError) as e:
        load_function(str(tmp_path / "absent.py") + ":score", kind="reward")
    err = e.value.args[0]
    assert err.code == "hooks.file_missing" and err.startswith("[reward hook] ")
    assert f"文件 `{tmp_path / 'absent.py'}` 不存在" in _zh(err)


# The exceptions the pre-flight (slime.ray.runtime.preflight, slime.dry_run) and start-up turn into
# "cannot start" lines; each is raised with a Refusal, never with a bare string.
PREFLIGHT_ERRORS = {"QueueError", "TranslationError", "DataError", "CheckpointError", "ModelSpecError",
                    "ModelArgsError", "ConfigMismatchError", "HookLoadError", "PreflightError"}
SCANNED = ["slime/rollout/queue.py", "slime/rollout/engines/sglang.py", "slime/data/dataset.py", "slime/checkpoint.py",
           "slime/model_spec.py", "slime/backends/megatron/model_args.py", "slime/rewards/hooks.py",
           "slime/ray/runtime.py", "slime/rollout/engines/external.py", "slime/backends/registry.py"]
# wrappers that add context around an already-worded error at run time (not pre-flight)
ALLOWED = {("slime/data/dataset.py", "DataError")}


def test_no_preflight_refusal_is_raised_as_a_bare_string():
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    bare = []
    for rel in SCANNED:
        tree = ast.parse((root / rel).read_text())
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call)):
                continue
            name = getattr(node.exc.func, "id", getattr(node.exc.func, "attr", ""))
            args = node.exc.args
            if name in PREFLIGHT_ERRORS and args and isinstance(args[0], (ast.JoinedStr, ast.Constant, ast.BinOp)):
                if (rel, name) in ALLOWED and isinstance(args[0], ast.JoinedStr) and "record" in ast.unparse(args[0]):
                    continue
                bare.append(f"{rel}:{node.lineno} {name}")
    assert bare == []
