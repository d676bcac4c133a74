"""Step 1 of GRPO is exact only if the trainer's training pass (train mode, autograd on) computes
the same log-probs as its old/reference pass (eval mode, no grad) over the same packed micro-batch.
Checked here on the CPU for the six seeded families (tiny reference checkpoints, megatron-core's
real modules, bf16 weights), plus the fixed-order MoE combine that removes DeepSeek-V3's GPU
difference (slime/backends/megatron/determinism.py).

What a CPU cannot show is the GPU's atomic-add order itself; the combine test checks that
megatron-core's dispatcher now takes its ordered branch (``index_add_``).
Fakes (named as in tests/runtime/megatron_cpu_fakes.py): ``torch.cuda.current_device`` returns
"cpu"; fla's Triton l2norm is its torch formula (Qwen3.5); the allgather dispatcher stands in for
alltoall (which opens CUDA streams). Setting: ``TORCHDYNAMO_DISABLE=1``: megatron-core's fused
SwiGLU and the DeltaNet's helpers are torch.compile'd, and on a CPU the no-grad and the autograd
graph compile apart, specialised by shape, to vectorised or scalar math: with it on, GLM-5's layer-2
experts differed by 3e-5 and Qwen3.5's first response token by 1.7e-3; eager, both agree bitwise.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
FAMILIES = ["deepseek_v3", "glm4", "glm4_moe", "glm4_moe_lite", "glm_moe_dsa", "qwen3_5"]
LENS = [24, 40, 17]


def test_bf16_sums_of_four_expert_outputs_depend_on_their_order():
    """Why top-4 routing moved and top-2 did not: the GPU's atomic adds come in any order."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, 4096, generator=g).to(torch.bfloat16)

    def add(order):
        acc = torch.zeros(4096, dtype=torch.bfloat16)
        for i in order:
            acc = acc + x[i]
        return acc

    assert not torch.equal(add([0, 1, 2, 3]), add([3, 1, 0, 2]))
    assert torch.equal(add([0, 1]), add([1, 0]))


def test_the_moe_combine_takes_megatrons_ordered_branch():
    from megatron.core.transformer.moe import moe_utils, token_dispatcher

    from slime.backends.megatron.determinism import install_fixed_order_moe_combine

    original = token_dispatcher.unpermute
    try:
        seen = []

        def spy(*a, **k):
            seen.append(torch.are_deterministic_algorithms_enabled())
            return moe_utils.unpermute(*a, **k)

        token_dispatcher.unpermute = spy
        assert install_fixed_order_moe_combine()
        assert install_fixed_order_moe_combine()  # idempotent: wrapped once
        g = torch.Generator().manual_seed(1)
        tokens, experts, hidden = 6, 8, 16
        routing = torch.zeros(tokens, experts, dtype=torch.bool)
        for t in range(tokens):
            routing[t, torch.randperm(experts, generator=g)[:4]] = True
        _, permuted_idx = torch.nonzero(routing.T, as_tuple=True)  # megatron's order: expert-major
        permuted = torch.randn(len(permuted_idx), hidden, generator=g).to(torch.bfloat16)
        out = token_dispatcher.unpermute(permuted, permuted_idx, restore_shape=torch.Size([tokens, hidden]),
                                         routing_map=routing)
        assert seen == [True] and not torch.are_deterministic_algorithms_enabled()
        # megatron-core's ordered branch (index_add_, which PyTorch's deterministic mode sums in order)
        want = torch.zeros(tokens, hidden, dtype=torch.bfloat16).index_add_(0, permuted_idx, permuted)
        assert torch.equal(out, want)
    finally:
        token_dispatcher.unpermute = original


def _passes(family: str, out: str) -> None:
    """Build the family's Megatron model (bf16) from its reference, run one packed micro-batch
    in the log-prob pass's mode and in the training pass's mode, write both log-prob rows."""
    sys.path.insert(0, str(ROOT / "tools"))
    import reference_models as rm

    from tests.runtime.megatron_cpu_fakes import install

    install(gated_delta_net=family == "qwen3_5")
    from slime.backends.megatron import model as mm
    from slime.backends.megatron.determinism import install_fixed_order_moe_combine
    from slime.backends.megatron.trainer import build_pack
    from slime.data.train_data import TrainRecord
    from slime.model_spec import load_flags

    hf, spec = rm.build(family, Path(out).parent / "ref")
    flags = load_flags(spec)
    mm.init_parallel({}, backend="gloo")
    install_fixed_order_moe_combine()
    over = {"deterministic_mode": True} if family == "qwen3_5" else {
        "moe_token_dispatcher_type": "allgather", "variable_seq_lengths": False}
    model = mm.build_model(flags, {}, cpu=True, init_weights=False, **over)
    for p in model.parameters():
        p.data = p.data.to(torch.bfloat16)
    mm.load_hf_into(model, flags, mm.HFReader(hf).get)
    mm.freeze_mtp(model)
    g = torch.Generator().manual_seed(0)
    recs = [TrainRecord(torch.randint(1, 256, (n,), generator=g).tolist(), 4, 1.0, [], [1] * (n - 4)) for n in LENS]
    # the DeltaNet's torch path runs one sequence per row: one record per pack there, as packing would
    packs = [build_pack([r], torch.device("cpu")) for r in recs] if family == "qwen3_5" else \
        [build_pack(recs, torch.device("cpu"))]

    def run(train: bool) -> list[float]:
        model.train(train)
        vals = []
        with torch.enable_grad() if train else torch.no_grad(), mm.mtp_skipped(model):
            for pk in packs:
                # the DeltaNet's torch (deterministic) path refuses THD: one plain sequence per pack there
                logits = model(pk.tokens, pk.position_ids, None,
                               packed_seq_params=None if family == "qwen3_5" else pk.packed)
                rows = logits[0].index_select(0, pk.logit_rows)[:, :256].float()
                vals += torch.log_softmax(rows, -1).gather(-1, pk.targets[:, None])[:, 0].tolist()
        return vals

    old = run(False)
    new = run(True)
    ref = run(False)
    Path(out).write_text(json.dumps({"old": old, "new": new, "ref": ref}))


@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILIES)
def test_training_pass_log_probs_equal_the_old_and_reference_pass_bitwise(tmp_path, family):
    out = tmp_path / "lp.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
           "TORCHDYNAMO_DISABLE": "1"}  # setting: see the module docstring
    r = subprocess.run([sys.executable, __file__, family, str(out)], capture_output=True, text=True, timeout=600,
                       env=env, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads(out.read_text())
    assert len(res["new"]) == sum(n - 4 for n in LENS)
    # step 1: ppo_kl = mean(old - new) and the KL to the reference are 0 only if these are equal
    assert res["new"] == res["old"] == res["ref"]


if __name__ == "__main__":
    _passes(sys.argv[1], sys.argv[2])
