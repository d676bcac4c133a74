"""The Megatron trainer's reference pass (KL loss): it runs the frozen reference weights and then
hands the actor its own weights back, bit for bit, every step; the buffers that hold the actor's
weights meanwhile are filled again, not made anew (pinned host memory on a GPU, where pageable
copies of a 3B model cost seconds). One gloo rank on the CPU, the tiny-cpu recipe's model. The same
run sets SLIME_PROFILE_DIR (slime/profiling.py): the trainer's second train call leaves its table."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("megatron.core")
torch = pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def _records(vocab: int, seed: int):
    import random

    from slime.data.train_data import TrainRecord

    rng = random.Random(seed)
    out = []
    for i in range(6):
        p, r = 3 + i % 3, 2 + i % 4
        out.append(TrainRecord([rng.randrange(4, vocab) for _ in range(p + r)], p, rng.choice([-1.0, 1.0]),
                               [-1.0] * r, [1] * r))
    return out


def _steps(model_dir: str, out: str) -> None:
    torch.set_num_threads(1)
    from slime.backends.megatron.model import unwrap
    from slime.backends.megatron.trainer import MegatronTrainer
    from slime.config import BatchConfig, LossConfig, ModelConfig, OptimConfig
    from slime.model_spec import load_flags

    flags = load_flags(str(ROOT / "scripts" / "models" / "tiny-cpu.sh"))
    tr = MegatronTrainer(flags, ModelConfig(hf_checkpoint=model_dir), OptimConfig(lr=1e-2, weight_decay=0.0),
                         LossConfig(use_kl_loss=True, kl_loss_coef=0.1), BatchConfig(micro_batch_size=4))
    vocab = int(flags["vocab_size"])
    probe = _records(vocab, seed=7)

    def weights() -> dict[str, torch.Tensor]:
        return {n: p.detach().clone() for n, p in unwrap(tr.model).named_parameters()}

    first = tr.log_probs(probe)
    res: dict = {"ref_equals_actor_at_start": tr.log_probs(probe, use_ref=True) == first, "steps": []}
    backups = []
    for step in range(3):
        tr.train(_records(vocab, seed=step), 1)
        before = weights()
        actor = tr.log_probs(probe)
        ref = tr.log_probs(probe, use_ref=True)
        after = weights()
        backups.append(tr._host.allocated)  # host buffers made so far (slime/backends/offload.py HostBuffers)
        res["steps"].append({
            "actor_weights_back_bitwise": all(torch.equal(before[n], after[n]) for n in before),
            "actor_log_probs_after_ref_pass": tr.log_probs(probe) == actor,
            "ref_log_probs_are_the_start": ref == first,
            "actor_moved": actor != first,
        })
    n_params = len(list(unwrap(tr.model).parameters()))
    # ref_state's buffers, then the first reference pass's backup: none made after that pass.
    res["backup_buffers_reused"] = backups == [2 * n_params] * 3
    Path(out).write_text(json.dumps(res))


def test_the_reference_pass_gives_the_actor_its_weights_back_and_reuses_its_buffers(tmp_path):
    sys.path.insert(0, str(ROOT / "tools" / "tiny"))
    import prepare  # tools/tiny/prepare.py: the tiny-cpu recipe's own model (float32)

    prepare.main(["--model-dir", str(tmp_path / "model"), "--data-dir", str(tmp_path / "data")])
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(port), "SLIME_PROFILE_DIR": str(tmp_path / "profile"), "SLIME_PROFILE_CALL": "2",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    out = tmp_path / "res.json"
    r = subprocess.run([sys.executable, __file__, str(tmp_path / "model"), str(out)], capture_output=True,
                       text=True, timeout=540, env=env, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads(out.read_text())
    assert res["ref_equals_actor_at_start"], res
    for i, step in enumerate(res["steps"]):
        assert all(step.values()), f"step {i + 1}: {step}"
    assert res["backup_buffers_reused"], res
    tables = sorted((tmp_path / "profile").iterdir())
    assert [t.name for t in tables] == ["megatron_train_call2_rank0.txt"]
    assert "aten::" in tables[0].read_text()


if __name__ == "__main__":
    _steps(sys.argv[1], sys.argv[2])
