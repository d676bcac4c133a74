"""The advantage estimators (``--advantage-estimator``): one frozen record each, the one home of
what an estimator's name means.

Every caller asks the record instead of comparing the name: the parser's choices (and so the
lab's), the per-sample advantages (slime/data/batch_builder.py), the token-level KL in the reward
(slime/training/advantages.py), the policy loss and its aggregation (slime/training/loss.py), the
flag checks (slime/args.py), the backends' capability checks and the critic's placement
(slime/ray/runtime.py). A new estimator is one entry here and its tests
(tests/runtime/test_estimator_records.py checks every caller against every entry).

Torch-free and import-free: the lab's base install and the capability checks import it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

# The per-sample advantage from the rewards (slime/data/batch_builder.py: ADVANTAGE_FORMS):
# group_norm: (r - group mean) / (group std + eps), std division off with
#   --disable-grpo-std-normalization; group_centre: r - group mean; raw: the reward itself.
# --disable-rewards-normalization gives raw rewards for every form.
AdvantageForm = Literal["group_norm", "group_centre", "raw"]
# The policy-gradient term (slime/training/loss.py: policy_loss kinds; --use-sc replaces it by
# plain REINFORCE).
PolicyLossForm = Literal["ppo", "gspo", "cispo"]
# flag: --calculate-per-token-loss picks token_mean, else sample_mean; constant_norm: the sum over
# loss tokens divided by samples x --rollout-max-response-len (--calculate-per-token-loss refused).
AggregationForm = Literal["flag", "constant_norm"]
# --kl-coef in the trainer's per-token advantages (slime/training/advantages.py: kl_shaped):
# return_to_go: G_t = sum_{t' >= t} (-kl_coef KL_t'), the sample's advantage added at its last loss
# token; per_token: A - kl_coef KL_t; None: the per-sample advantage on every token.
TokenKL = Literal["return_to_go", "per_token"] | None


@dataclass(frozen=True)
class Estimator:
    """What one ``--advantage-estimator`` value means, field by field."""

    name: str
    advantage: AdvantageForm
    policy_loss: PolicyLossForm
    aggregation: AggregationForm
    # The group is the whole baseline: no KL in the reward (--kl-coef refused, use --use-kl-loss),
    # and one sample per prompt with normalised rewards is refused (every advantage would be 0).
    group_relative: bool
    token_kl: TokenKL
    # A critic (value model) trains beside the policy: each trainer rank shares its bundle with a
    # critic rank, the runtime sets GAE advantages from its values, and trainer backends without a
    # critic (the registry's `critic` None) refuse the estimator.
    needs_critic: bool
    # --use-sc is allowed: the advantage is a group-centred reward and the loss PPO's, which SC
    # replaces by centred importance-weighted scores and plain REINFORCE.
    sc_allowed: bool


# The order is the order of the --advantage-estimator choices (the lab's list too).
ESTIMATORS: dict[str, Estimator] = {e.name: e for e in (
    Estimator("grpo", advantage="group_norm", policy_loss="ppo", aggregation="flag",
              group_relative=True, token_kl=None, needs_critic=False, sc_allowed=True),
    # GSPO and CISPO share GRPO's advantages; they differ in the loss (sequence ratio / clipped IS weight).
    Estimator("gspo", advantage="group_norm", policy_loss="gspo", aggregation="flag",
              group_relative=True, token_kl=None, needs_critic=False, sc_allowed=False),
    Estimator("cispo", advantage="group_norm", policy_loss="cispo", aggregation="flag",
              group_relative=True, token_kl=None, needs_critic=False, sc_allowed=False),
    # Dr. GRPO: centre without the std division, normalise the loss by a constant length.
    Estimator("dr_grpo", advantage="group_centre", policy_loss="ppo", aggregation="constant_norm",
              group_relative=True, token_kl=None, needs_critic=False, sc_allowed=True),
    # REINFORCE++-baseline: the group mean is a baseline, the KL in the reward is per token.
    Estimator("reinforce_plus_plus_baseline", advantage="group_centre", policy_loss="ppo", aggregation="flag",
              group_relative=False, token_kl="per_token", needs_critic=False, sc_allowed=False),
    # REINFORCE++: the return (gamma = 1), no baseline, so one sample per prompt is fine.
    Estimator("reinforce_plus_plus", advantage="raw", policy_loss="ppo", aggregation="flag",
              group_relative=False, token_kl="return_to_go", needs_critic=False, sc_allowed=False),
    # PPO: the critic is the baseline; the raw reward becomes GAE's reward at the last token.
    Estimator("ppo", advantage="raw", policy_loss="ppo", aggregation="flag",
              group_relative=False, token_kl=None, needs_critic=True, sc_allowed=False),
)}


def names() -> tuple[str, ...]:
    """The estimators' names, in choice order."""
    return tuple(ESTIMATORS)


def get(name: str) -> Estimator:
    """The record of ``name``; an unknown name lists the known ones."""
    try:
        return ESTIMATORS[name]
    except KeyError:
        raise ValueError(f"unknown advantage estimator {name!r}; known: {', '.join(sorted(ESTIMATORS))}") from None


def of(loss) -> Estimator:
    """The record of a loss config's ``advantage_estimator`` (slime.config.LossConfig)."""
    return get(loss.advantage_estimator)
