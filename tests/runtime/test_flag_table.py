"""One home per runtime flag: the table in slime/flags.py.

The parser is generated from it, the Config is built from it by keyword, the lab reads its public
description, and each fact it holds (a default, a choice list) is read from it by every other place
(tests tie each reader to the table).
"""

from __future__ import annotations

import ast
import dataclasses
import json
import typing
from pathlib import Path

import pytest

import slime.config as config_mod
from slime.args import DERIVED, build_parser, direct_fills, parse_args
from slime.config import Config
from slime.flags import BY_NAME, FLAGS, KL_TYPES, default_of, describe
from tests.refusal_codes import raised

REPO = Path(__file__).resolve().parents[2]
BASE = ["--rollout-batch-size", "2", "--n-samples-per-prompt", "2", "--num-rollout", "1", "--rm-type", "math"]

# Config fields that no flag of the table fills: set at start-up from the cluster (use_gpu), from the
# run's length (total_steps), from Megatron's LR schedule flags (slime.args._lr_schedule_flags), or the
# pass-through dicts and the entry point's mode.
NOT_FROM_THE_TABLE = {"cluster.use_gpu", "optim.total_steps", "optim.lr_decay_style", "optim.min_lr",
                      "optim.lr_warmup_iters", "optim.lr_warmup_fraction", "optim.lr_decay_iters",
                      "megatron", "sglang", "async_mode"}


def _config_fields(cls: type = Config, prefix: str = "") -> dict[str, dataclasses.Field]:
    hints = typing.get_type_hints(cls)
    out: dict[str, dataclasses.Field] = {}
    for f in dataclasses.fields(cls):
        path = f"{prefix}.{f.name}" if prefix else f.name
        if dataclasses.is_dataclass(hints[f.name]):
            out.update(_config_fields(hints[f.name], path))
        else:
            out[path] = f
    return out


def test_each_flag_is_declared_once_and_names_real_config_fields():
    assert len(BY_NAME) == len(FLAGS)
    fields = _config_fields()
    for flag in FLAGS:
        assert flag.name.startswith("--") and flag.group, flag.name
        for path in flag.fills:
            assert path in fields, f"{flag.name} fills {path}, which is not a Config field"
    assert [f for f in FLAGS if not f.fills] == [BY_NAME["--dry-run"]]  # read by the entry points


def test_every_config_field_comes_from_one_flag_or_one_rule():
    fillers: dict[str, list[str]] = {}
    for flag in FLAGS:
        for path in flag.fills:
            fillers.setdefault(path, []).append(flag.name)
    for path in _config_fields():
        if path in NOT_FROM_THE_TABLE:
            assert path not in fillers, path
        elif path in DERIVED:
            assert fillers.get(path), f"the rule for {path} reads flags that do not declare it"
        else:
            assert len(fillers.get(path, [])) == 1, f"{path} is filled by {fillers.get(path)}"
    assert set(direct_fills()) | set(DERIVED) == set(fillers)


def test_the_parser_is_the_table():
    ns = vars(build_parser().parse_args([]))
    assert ns == {f.dest: f.default for f in FLAGS}
    for flag in FLAGS:
        if flag.choices is not None:
            bad = usage_error([*BASE, flag.name, "no-such-choice"])
            assert raised(bad, "usage.invalid_choice", flag=flag.name), bad


def usage_error(argv: list[str]) -> Exception:
    from slime.args import UsageError

    with pytest.raises(UsageError) as e:
        parse_args(argv)
    return e.value


def test_config_defaults_are_the_flag_defaults():
    """A Config built without flags (tests, tools) holds what the command line holds without them."""
    parsed = parse_args([])
    fields = _config_fields()
    for path, dest in direct_fills().items():
        f = fields[path]
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        if default is dataclasses.MISSING:
            continue
        assert default == BY_NAME["--" + dest.replace("_", "-")].default, path
    assert parsed.loss == config_mod.LossConfig(std_normalization=False)  # n=1 turns std normalization off


def test_the_config_is_built_by_keyword_never_by_position():
    names = {n for n, c in vars(config_mod).items() if isinstance(c, type) and dataclasses.is_dataclass(c)}
    for path in [*(REPO / "slime").rglob("*.py"), REPO / "train.py", REPO / "train_async.py"]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) in names:
                assert not node.args, f"{path.relative_to(REPO)}:{node.lineno}: {node.func.id} built by position"


def test_exactly_one_loss_config():
    homes = [f"{p.relative_to(REPO)}" for p in (REPO / "slime").rglob("*.py")
             for node in ast.walk(ast.parse(p.read_text()))
             if isinstance(node, ast.ClassDef) and node.name == "LossConfig"]
    assert homes == ["slime/config.py"]


def test_the_kl_type_default_and_choices_have_one_home_the_cli():
    """The runtime's Config, the loss function's config and both KL readers take the CLI's default."""
    from slime.training.advantages import kl_value
    from slime.training.loss import LossFnConfig, from_runtime

    default = default_of("--kl-loss-type")
    assert parse_args(BASE).loss.kl_loss_type == default  # the user's contract
    assert config_mod.LossConfig().kl_loss_type == default
    assert LossFnConfig().kl_loss_type == default
    assert from_runtime(config_mod.LossConfig()).kl_loss_type == default
    for name in ("eps_clip", "eps_clip_high", "eps_clip_c", "kl_loss_coef", "entropy_coef", "tis_clip", "tis_clip_low"):
        assert getattr(LossFnConfig(), name) == default_of("--" + name.replace("_", "-")), name
    assert BY_NAME["--kl-loss-type"].choice_list() == KL_TYPES and default in KL_TYPES
    for kl_type in KL_TYPES:  # both KL readers compute every choice the parser accepts
        assert isinstance(kl_value(0.1, kl_type), float)


def test_the_public_description_is_plain_records_of_every_flag():
    records = describe()
    assert [r.name for r in records] == [f.name for f in FLAGS]
    json.dumps([dataclasses.asdict(r) for r in records])  # plain values only
    by = {r.name: r for r in records}
    assert by["--colocate"].kind == "switch" and by["--eval-prompt-data"].kind == "list"
    assert by["--rollout-batch-size"].type == "int" and by["--apply-chat-template-kwargs"].type == "json"
    from slime import estimators

    assert by["--advantage-estimator"].choices == tuple(estimators.names())  # the records, read now


def test_the_lab_reads_the_description_not_argparse():
    from lab.core.runtime_choices import advantage_estimators, flag_choices, kl_estimators

    assert kl_estimators() == KL_TYPES
    assert advantage_estimators() == BY_NAME["--advantage-estimator"].choice_list()
    assert flag_choices("--rollout-backend") == ("embedded", "sglang") and flag_choices("--lr") == ()
    for path in (REPO / "lab").rglob("*.py"):
        assert "_actions" not in path.read_text(), path
