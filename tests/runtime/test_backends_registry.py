"""Trainer backends behind one interface: the registry names the class the Ray actors build and
each backend's own capability checks (asked torch-free); one loss translation for all of them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from slime.args import parse_args, validate
from slime.backends.registry import TRAIN_BACKENDS, backend_names, get_backend
from tests.refusal_codes import has, raised

REPO = Path(__file__).resolve().parents[2]
TINY_SPEC = REPO / "scripts" / "models" / "tiny-cpu.sh"


def _model_args() -> list[str]:
    from slime.backends.megatron.model_args import read_model_args

    return read_model_args(TINY_SPEC)


def _cfg(*extra: str):
    return parse_args(["--hf-checkpoint", "/nonexistent", "--prompt-data", "/nonexistent.jsonl",
                       "--rollout-batch-size", "2", *extra])


def test_the_flag_offers_exactly_the_registered_backends():
    from slime.args import UsageError

    with pytest.raises(UsageError) as e:
        _cfg("--train-backend", "nope")
    assert raised(e.value, "usage.invalid_choice", flag="--train-backend")
    assert "embedded" in e.value.problems[0].params["choices"] and "megatron" in e.value.problems[0].params["choices"]
    assert backend_names() == ["embedded", "megatron"]
    # both run on a CPU (megatron: float32 with gloo, slime/backends/megatron/cpu.py)
    assert not get_backend("megatron").needs_gpu and not get_backend("embedded").needs_gpu


def test_capability_checks_import_without_torch():
    code = ("import sys; sys.modules['torch'] = None; sys.modules['megatron'] = None\n"
            "from slime.backends.registry import capability_errors\n"
            "from slime.args import parse_args\n"
            "cfg = parse_args(['--train-backend', 'megatron', '--prompt-data', 'x', '--rollout-batch-size', '1',"
            " '--context-parallel-size', '2'])\n"
            "print('\\n'.join(capability_errors(cfg)))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                         env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr
    assert "--context-parallel-size 2" in out.stdout and "--num-layers" in out.stdout


def test_megatron_is_a_registry_entry_not_a_refusal():
    ok = _cfg("--train-backend", "megatron", *_model_args())
    assert not [e for e in validate(ok) if "megatron" in e.lower()]
    tp = _cfg("--train-backend", "megatron", "--tensor-model-parallel-size", "2", "--actor-num-gpus-per-node", "2",
              *_model_args())
    assert not [e for e in validate(tp) if "megatron" in e.lower() or "tensor-model-parallel" in e]  # runs in the loop now
    odd = _cfg("--train-backend", "megatron", "--pipeline-model-parallel-size", "2", "--actor-num-gpus-per-node", "3",
               *_model_args())
    assert has(validate(odd), "megatron.dp_whole", ranks=3)


def test_embedded_checks_live_with_the_embedded_backend():
    cfg = _cfg("--tensor-model-parallel-size", "2")
    assert has(validate(cfg), "embedded.trainer_parallel")
    assert TRAIN_BACKENDS["embedded"].capabilities.endswith(":embedded_trainer_errors")


def test_both_trainers_take_the_one_loss_translation():
    from slime.backends.embedded.trainer import loss_fn_config
    from slime.training.loss import from_runtime

    cfg = _cfg("--use-kl-loss", "--kl-loss-coef", "0.1", "--use-icepop", "--icepop-low", "0.4")
    got = from_runtime(cfg.loss)
    assert got == loss_fn_config(cfg.loss)
    assert got.kl_loss_coef == 0.1 and got.tis_mode == "icepop" and got.tis_clip_low == 0.4
    assert from_runtime(_cfg("--kl-loss-coef", "0.1").loss).kl_loss_coef == 0.0  # no --use-kl-loss


def test_the_embedded_backend_builds_trains_exports_and_saves_through_the_registry(tiny, tmp_path):
    import torch

    from slime.backends.registry import backend_class
    from slime.checkpoint import resolve_checkpoint
    from slime.data.train_data import TrainRecord

    torch.set_num_threads(1)
    cfg = parse_args(["--hf-checkpoint", str(tiny["model"]), "--ref-load", str(tiny["ref"]), "--prompt-data",
                      str(tiny["train"]), "--rollout-batch-size", "2", "--use-kl-loss", "--lr", "1e-3"])
    backend = backend_class("embedded").build(cfg, 0, 1, ("127.0.0.1", 0))
    assert backend.resume_state == {}
    recs = [TrainRecord([2, 8, 11, 6, 3, 5, 1], 5, a, [], [1, 1]) for a in (1.0, -1.0)]
    m = backend.train(recs, 1)
    assert m["train/kl_loss"] == 0.0  # step 1: the policy is still the reference
    buckets = list(backend.export_buckets(4096))
    assert len(buckets) > 1 and all(sum(t.numel() * t.element_size() for t in b.values()) <= 4096 or len(b) == 1
                                    for b in buckets)
    names = {n for b in buckets for n in b}
    assert names == set(dict(backend.trainer.module.named_parameters()))
    d = backend.save(str(tmp_path / "ckpt"), 1, {"next_rollout_id": 1})
    assert Path(d).name == "iter_0000001"
    assert resolve_checkpoint(tmp_path / "ckpt").state["next_rollout_id"] == 1
    assert backend.offload() == {} and backend.onload() == {}  # CPU: nothing to give back
