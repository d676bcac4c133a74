"""One record per advantage estimator (slime/estimators.py): every caller follows the record's
fields, so a new estimator is one entry and its tests.

Each test below runs over every record: the parser's and the lab's choices, the per-sample
advantages, the token-level KL in the reward, the policy loss and its aggregation, the flag checks
(SC allowed or refused, group-relative refusals, the critic's flags), the backends' critic
refusal and the critic's share of a trainer bundle. The last tests add an entry and check that
the callers take it with no other change, and that no module outside the record compares an
estimator's name against a literal.
"""

from __future__ import annotations

import ast
import dataclasses
import math
import typing
from pathlib import Path

import pytest

from slime import estimators
from slime.args import build_parser, parse_args, validate
from slime.config import LossConfig as RuntimeLoss
from slime.data.batch_builder import compute_advantages
from slime.training.advantages import kl_shaped, kl_value, needs_token_advantages
from tests.refusal_codes import codes

REPO = Path(__file__).resolve().parents[2]
NAMES = estimators.names()
BASE = ["--num-rollout", "1", "--rollout-batch-size", "2", "--n-samples-per-prompt", "2", "--rm-type", "math",
        "--prompt-data", "p.jsonl", "--hf-checkpoint", "hf", "--actor-num-gpus-per-node", "1"]
REWARDS, N = [1.0, 0.0, 0.0, 0.0, 2.0, 2.0, 0.0, 1.0], 4
OLD, REF, MASK = [-1.0, -1.0, -1.0], [-1.5, -1.0, -0.5], [1, 1, 1]


def _codes(cfg) -> set[str]:
    return {p.code for p in validate(cfg, environment=False)}


def _choices(flag: str) -> tuple[str, ...]:
    return next(tuple(a.choices) for a in build_parser()._actions if flag in a.option_strings)


def test_the_flag_and_the_lab_offer_exactly_the_records():
    from lab.core.runtime_choices import advantage_estimators

    assert _choices("--advantage-estimator") == NAMES == advantage_estimators()
    assert all(estimators.get(name).name == name for name in NAMES)
    with pytest.raises(ValueError, match="unknown advantage estimator 'grpoo'; known: cispo, dr_grpo"):
        estimators.get("grpoo")


@pytest.mark.parametrize("name", NAMES)
def test_each_record_is_consistent_and_every_form_it_names_exists(name):
    from slime.data.batch_builder import ADVANTAGE_FORMS

    rec = estimators.get(name)
    assert rec.advantage in ADVANTAGE_FORMS and set(ADVANTAGE_FORMS) == set(typing.get_args(estimators.AdvantageForm))
    assert rec.policy_loss in typing.get_args(estimators.PolicyLossForm)
    assert rec.aggregation in typing.get_args(estimators.AggregationForm)
    if rec.group_relative:  # the group is the whole baseline: no KL in the reward, no critic
        assert rec.advantage != "raw" and rec.token_kl is None and not rec.needs_critic
    if rec.sc_allowed:  # SC replaces a group-centred reward and PPO's loss, and puts no KL in the reward
        assert rec.group_relative and rec.policy_loss == "ppo"
    with pytest.raises(dataclasses.FrozenInstanceError):
        rec.sc_allowed = not rec.sc_allowed  # type: ignore[misc]


@pytest.mark.parametrize("name", NAMES)
def test_the_per_sample_advantages_follow_the_records_form(name):
    rec = estimators.get(name)
    adv = compute_advantages(REWARDS, N, name)
    groups = [REWARDS[i:i + N] for i in range(0, len(REWARDS), N)]
    centred = [r - sum(g) / N for g in groups for r in g]
    if rec.advantage == "raw":
        assert adv == REWARDS
    elif rec.advantage == "group_centre":
        assert adv == pytest.approx(centred)
    else:  # group_norm: centred, divided by the group's unbiased std (+ 1e-6)
        stds = [math.sqrt(sum((r - sum(g) / N) ** 2 for r in g) / (N - 1)) for g in groups]
        assert adv == pytest.approx([c / (stds[i // N] + 1e-6) for i, c in enumerate(centred)])
    assert compute_advantages(REWARDS, N, name, normalize=False) == REWARDS  # --disable-rewards-normalization


@pytest.mark.parametrize("name", NAMES)
def test_the_kl_in_the_reward_follows_the_records_token_kl(name):
    rec = estimators.get(name)
    assert needs_token_advantages(name, 0.1, False) == (rec.token_kl is not None)
    assert needs_token_advantages(name, 0.0, True)  # --normalize-advantages whitens for every estimator
    got = kl_shaped(1.0, MASK, OLD, REF, name, 0.5, "k1")
    kl = [kl_value(o - r, "k1") for o, r in zip(OLD, REF)]  # [0.5, 0, -0.5]
    if rec.token_kl is None:
        assert got == [1.0, 1.0, 1.0]
    elif rec.token_kl == "per_token":
        assert got == pytest.approx([1.0 - 0.5 * k for k in kl])
    else:  # return_to_go: the token rewards -0.5 KL_t, the advantage at the last token, summed from t on
        assert got == pytest.approx([1.0 - 0.5 * sum(kl[t:]) for t in range(3)])


@pytest.mark.parametrize("name", NAMES)
def test_the_loss_takes_the_records_policy_loss_and_aggregation(name):
    pytest.importorskip("torch")
    from slime.training.loss import from_runtime

    rec = estimators.get(name)
    got = from_runtime(RuntimeLoss(advantage_estimator=name, max_response_len=8))
    assert got.policy_loss == rec.policy_loss
    if rec.aggregation == "constant_norm":
        assert (got.agg, got.max_response_len) == ("constant_norm", 8)
    else:
        assert (got.agg, got.max_response_len) == ("sample_mean", None)
        assert from_runtime(RuntimeLoss(advantage_estimator=name, calculate_per_token_loss=True)).agg == "token_mean"
    assert from_runtime(RuntimeLoss(advantage_estimator=name, use_sc=True)).policy_loss == "reinforce"


@pytest.mark.parametrize("name", NAMES)
def test_the_flag_checks_follow_the_record(name):
    rec = estimators.get(name)
    est = ["--advantage-estimator", name]
    assert ("args.sc_estimator" in _codes(parse_args([*BASE, *est, "--use-sc"]))) == (not rec.sc_allowed)
    assert ("args.kl_coef_group" in _codes(parse_args([*BASE, *est, "--kl-coef", "0.1"]))) == rec.group_relative
    one = [*BASE, *est, "--n-samples-per-prompt", "1"]
    assert ("args.one_sample_group" in _codes(parse_args(one))) == rec.group_relative
    assert "args.one_sample_group" not in _codes(parse_args([*one, "--disable-rewards-normalization"]))
    per_token = _codes(parse_args([*BASE, *est, "--calculate-per-token-loss"]))
    assert ("args.dr_grpo_per_token" in per_token) == (rec.aggregation == "constant_norm")
    gae = _codes(parse_args([*BASE, *est, "--gamma", "0.9"]))
    assert ("args.critic_flags_unused" in gae) == (not rec.needs_critic)
    assert _codes(parse_args([*BASE, *est])) == set()  # nothing refused by default


@pytest.mark.parametrize("name", NAMES)
def test_the_critic_follows_the_record(name):
    from slime.backends.registry import TRAIN_BACKENDS, capability_errors
    from slime.ray.runtime import trainer_bundle_share

    rec = estimators.get(name)
    cfg = parse_args([*BASE, "--advantage-estimator", name])
    assert trainer_bundle_share(cfg) == (0.5 if rec.needs_critic else 1.0)  # a critic rank takes the other half
    for backend, entry in TRAIN_BACKENDS.items():
        errors = capability_errors(parse_args([*BASE, "--advantage-estimator", name, "--train-backend", backend]))
        refused = f"{backend}.ppo_critic" in codes(errors)  # each backend's code for "no critic here"
        assert refused == (rec.needs_critic and entry.critic is None), (backend, errors)


NEW = "new_estimator"


@pytest.fixture
def new_entry(monkeypatch):
    """One new entry, and nothing else: Dr. GRPO's form without SC, refusing a backend without a critic."""
    rec = dataclasses.replace(estimators.get("dr_grpo"), name=NEW, sc_allowed=False, needs_critic=True)
    monkeypatch.setitem(estimators.ESTIMATORS, NEW, rec)
    return rec


def test_a_new_estimator_is_one_entry(new_entry):
    pytest.importorskip("torch")
    from lab.core.runtime_choices import advantage_estimators
    from slime.ray.runtime import trainer_bundle_share
    from slime.training.loss import from_runtime

    assert NEW in _choices("--advantage-estimator") and NEW in advantage_estimators()
    ns, _ = build_parser().parse_known_args(["--advantage-estimator", NEW])
    assert ns.advantage_estimator == NEW
    cfg = parse_args(BASE)
    cfg.loss.advantage_estimator = NEW
    assert compute_advantages(REWARDS, N, NEW) == compute_advantages(REWARDS, N, "dr_grpo")
    assert from_runtime(cfg.loss).agg == "constant_norm" and trainer_bundle_share(cfg) == 0.5
    cfg.loss.use_sc, cfg.loss.kl_coef = True, 0.0
    cfg.loss.gamma = 0.9
    assert {"args.sc_estimator", "args.critic_flags_unused"} & _codes(cfg) == {"args.sc_estimator"}
    cfg.cluster.train_backend = "megatron"
    assert "megatron.ppo_critic" in {p.code for p in validate(cfg, environment=False)}


# --- no caller compares the name -------------------------------------------------------------

ESTIMATOR_NAMES = {"advantage_estimator", "estimator"}  # how the runtime spells a variable holding the name


def _is_name(node: ast.AST, bound: set[str]) -> bool:
    """Whether node is, syntactically, an estimator's name (not its record)."""
    if isinstance(node, ast.Attribute):
        return node.attr == "advantage_estimator"
    return isinstance(node, ast.Name) and node.id in bound


def _literal_names(node: ast.AST) -> bool:
    """A tuple / list / set of two or more estimator names, or a dict keyed by them."""
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        items = node.elts
    elif isinstance(node, ast.Dict):
        items = [k for k in node.keys if k is not None]
    else:
        return False
    return len(items) >= 2 and all(isinstance(i, ast.Constant) and i.value in NAMES for i in items)


def name_comparisons(source: str) -> list[int]:
    """Lines where an estimator's name is compared, looked up or listed instead of asking its record."""
    tree = ast.parse(source)
    bound = set(ESTIMATOR_NAMES)
    for node in ast.walk(tree):  # names assigned from an estimator's name hold one too
        if isinstance(node, ast.Assign) and _is_name(node.value, bound):
            bound |= {t.id for t in node.targets if isinstance(t, ast.Name)}
    hits = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            hit = any(_is_name(x, bound) for x in (node.left, *node.comparators))
        elif isinstance(node, ast.Subscript):
            hit = _is_name(node.slice, bound)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get":
            hit = bool(node.args) and _is_name(node.args[0], bound) and \
                not (isinstance(node.func.value, ast.Name) and node.func.value.id == "estimators")
        elif isinstance(node, ast.Match):
            hit = _is_name(node.subject, bound)
        else:
            hit = _literal_names(node)
        if hit:
            hits.append(node.lineno)
    return sorted(hits)


def test_the_name_check_finds_what_it_forbids():
    source = (
        'GROUP = ("grpo", "dr_grpo")\n'
        'POLICY = {"gspo": "gspo", "cispo": "cispo"}\n'
        'def f(cfg, estimator):\n'
        '    est = cfg.loss.advantage_estimator\n'
        '    if est == "dr_grpo" or estimator in GROUP:\n'
        '        return POLICY.get(cfg.loss.advantage_estimator, "ppo")\n'
        '    return TABLE[estimator], estimators.get(estimator).needs_critic, ("ppo", "reinforce")\n'
    )
    assert name_comparisons(source) == [1, 2, 5, 5, 6, 7]


def test_no_module_outside_the_record_compares_an_estimator_name():
    record = REPO / "slime" / "estimators.py"
    found = {}
    for path in sorted([*(REPO / "slime").rglob("*.py"), *(REPO / "lab").rglob("*.py")]):
        if path != record:
            lines = name_comparisons(path.read_text(encoding="utf-8"))
            if lines:
                found[str(path.relative_to(REPO))] = lines
    assert found == {}, f"ask the record (slime/estimators.py) instead of comparing the name: {found}"
