"""GRPO advantages and batch building: the numbers docs/en/corrections.md#grpo-normalisation promises."""

from __future__ import annotations

import math
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from slime import estimators
from slime.data.batch_builder import (
    build_loss_mask,
    compute_advantages,
    expand_to_tokens,
    normalize_group_rewards,
    pack_samples,
)

REPO_ROOT = Path(__file__).resolve().parents[2]
WORKED_EXAMPLE = [1, 1, 1, 1, 0, 0, 0, 0]


def test_worked_example_gives_plus_minus_0_935412() -> None:
    adv = normalize_group_rewards(WORKED_EXAMPLE, 8)
    assert adv[:4] == pytest.approx([0.935412] * 4, abs=1e-5)
    assert adv[4:] == pytest.approx([-0.935412] * 4, abs=1e-5)


def test_worked_example_uses_unbiased_std_not_biased() -> None:
    adv = normalize_group_rewards(WORKED_EXAMPLE, 8)
    # A biased (N) std of 0.5 would give exactly +-1.0.
    assert abs(adv[0] - 1.0) > 0.05
    assert adv[0] == pytest.approx(0.5 / (math.sqrt(2 / 7) + 1e-6), abs=1e-12)


def test_equal_rewards_give_exactly_zero() -> None:
    assert normalize_group_rewards([0.7, 0.7, 0.7, 0.7], 4) == [0.0, 0.0, 0.0, 0.0]
    assert normalize_group_rewards([0.1] * 3, 3, std_normalization=False) == [0.0, 0.0, 0.0]


def test_n_equal_one_forces_mean_centring_only() -> None:
    # Each sample is its own group: centring gives 0, and no std division (std undefined).
    assert normalize_group_rewards([1.0, 0.0, 0.5], 1) == [0.0, 0.0, 0.0]


def test_disable_std_normalization_is_dr_grpo_mean_centring() -> None:
    expected = [0.5, 0.5, -0.5, -0.5]
    assert normalize_group_rewards([1, 1, 0, 0], 4, std_normalization=False) == pytest.approx(expected)
    assert compute_advantages([1, 1, 0, 0], 4, std_normalization=False) == pytest.approx(expected)
    assert compute_advantages([1, 1, 0, 0], 4, estimator="dr_grpo") == pytest.approx(expected)


def test_disable_rewards_normalization_returns_raw_rewards() -> None:
    assert compute_advantages([1, 0, 0.5, 0.25], 2, normalize=False) == [1.0, 0.0, 0.5, 0.25]


def test_groups_are_normalized_independently() -> None:
    adv = normalize_group_rewards([1, 0, 5, 5, 3, 1], 2)
    first = 0.5 / (math.sqrt(0.5) + 1e-6)
    assert adv == pytest.approx([first, -first, 0.0, 0.0, first, -first])


def test_length_not_multiple_of_n_raises() -> None:
    with pytest.raises(ValueError, match="not a multiple of n_samples_per_prompt=4"):
        normalize_group_rewards([1, 0, 1, 0, 1], 4)
    with pytest.raises(ValueError, match="not a multiple"):
        compute_advantages([1, 0, 1], 2)


def test_nan_reward_is_rejected() -> None:
    with pytest.raises(ValueError, match="reward 1 is not finite"):
        normalize_group_rewards([1.0, float("nan")], 2)


def test_reinforce_plus_plus_baseline_centres_groups_without_std() -> None:
    # Group mean is the baseline, no std division; whitening is --normalize-advantages (trainer).
    adv = compute_advantages([1, 0, 3, 1], 2, estimator="reinforce_plus_plus_baseline")
    assert adv == pytest.approx([0.5, -0.5, 1.0, -1.0])


def test_reinforce_plus_plus_returns_the_raw_reward_without_baseline() -> None:
    assert compute_advantages([1, 0, 3, 1], 2, estimator="reinforce_plus_plus") == [1.0, 0.0, 3.0, 1.0]
    assert compute_advantages([0.5], 1, estimator="reinforce_plus_plus") == [0.5]


def test_unknown_estimator_lists_known_ones() -> None:
    with pytest.raises(ValueError, match="unknown advantage estimator 'grpoo'.*grpo.*reinforce_plus_plus_baseline"):
        compute_advantages([1, 0], 2, estimator="grpoo")
    assert {"grpo", "gspo", "cispo", "dr_grpo", "reinforce_plus_plus", "reinforce_plus_plus_baseline"} <= set(
        estimators.names()
    )


def test_tensor_path_agrees_with_pure_python() -> None:
    torch = pytest.importorskip("torch")
    from slime.data.batch_builder import normalize_group_rewards_tensor

    gen = torch.Generator().manual_seed(0)
    rewards = torch.rand(64, generator=gen).round(decimals=1)
    rewards[8:16] = 0.3  # an all-equal group
    for n, std in [(8, True), (8, False), (4, True), (1, True)]:
        pure = normalize_group_rewards(rewards.tolist(), n, std)
        tensor = normalize_group_rewards_tensor(rewards, n, std)
        assert tensor.dtype == torch.float32
        assert tensor.tolist() == pytest.approx(pure, abs=1e-6)
    assert normalize_group_rewards_tensor(rewards, 8)[8:16].eq(0).all()


def test_batch_builder_imports_and_runs_without_torch() -> None:
    code = textwrap.dedent(
        """
        import sys
        sys.modules["torch"] = None  # any 'import torch' now raises ImportError
        from slime.data.batch_builder import normalize_group_rewards
        adv = normalize_group_rewards([1, 1, 1, 1, 0, 0, 0, 0], 8)
        assert "torch" not in sys.modules or sys.modules["torch"] is None
        print(repr(adv[0]), repr(adv[-1]))
        """
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    plus, minus = (float(x) for x in result.stdout.split())
    assert plus == pytest.approx(0.935412, abs=1e-5)
    assert minus == pytest.approx(-0.935412, abs=1e-5)


def test_every_response_token_gets_its_sample_advantage() -> None:
    assert expand_to_tokens([0.5, -1.0, 2.0], [2, 0, 3]) == [[0.5, 0.5], [], [2.0, 2.0, 2.0]]
    with pytest.raises(ValueError, match="2 advantages but 1 response lengths"):
        expand_to_tokens([0.5, 1.0], [2])


def test_loss_mask_covers_response_tokens_only() -> None:
    assert build_loss_mask(3, 2) == [0, 0, 0, 1, 1]
    assert build_loss_mask(2, 3, response_mask=[1, 0, 1]) == [0, 0, 1, 0, 1]
    assert build_loss_mask(1, 2, remove_sample=True) == [0, 0, 0]
    with pytest.raises(ValueError, match="response_mask has 1 entries"):
        build_loss_mask(1, 2, response_mask=[1])


def test_packing_respects_cap_and_keeps_every_sample() -> None:
    lengths = [5, 3, 4, 2, 6, 1]
    packs = pack_samples([[0] * n for n in lengths], 8)
    assert packs == [[0, 1], [2, 3, 5], [4]]
    assert sorted(i for p in packs for i in p) == list(range(len(lengths)))
    assert all(sum(lengths[i] for i in p) <= 8 for p in packs)


def test_oversize_sample_gets_its_own_pack() -> None:
    packs = pack_samples([3, 20, 4], 8)
    assert packs == [[0, 2], [1]]
    assert pack_samples([3, 20, 4], 8) == packs  # deterministic
