"""The argument list experiment.sh gives train.py / train_async.py: MODEL_ARGS, then the train
command's flags (lab/core/train_flags.py) with the shell variables filled in.

The runtime's verdict judges this list (lab/rules/runtime_verdict.py) and script import compares a
script's command with it (lab/rules/import_script.py): the same list the renderer prints.
"""
from __future__ import annotations

import shlex
from functools import lru_cache
from typing import Any

from lab.core.experiment import Experiment
from lab.core.recipes import REPO_ROOT, Recipe, get_recipe
from lab.core.shell_var import Var
from lab.core.train_flags import VALUE_FLAG, needs_sglang_yaml, sglang_groups, shell_variables, train_flag_groups


@lru_cache(maxsize=32)
def _model_args(path: str, mtime_ns: int) -> tuple[str, ...]:
    from slime.backends.megatron.model_args import read_model_args

    return tuple(read_model_args(path)) if mtime_ns >= 0 else ()


def model_args(recipe: Recipe) -> list[str]:
    """MODEL_ARGS of the recipe's model spec, read (never executed) by the runtime's reader."""
    path = REPO_ROOT / recipe.model_spec
    try:
        mtime = path.stat().st_mtime_ns
    except OSError:
        mtime = -1
    return list(_model_args(str(path), mtime))


def experiment_model_args(exp: Experiment, recipe: Recipe) -> list[str]:
    """MODEL_ARGS of the experiment: its custom spec's words (model.spec_args), else its recipe's spec."""
    if exp.model.spec_args:
        return shlex.split(exp.model.spec_args)
    return model_args(recipe)


def _values(exp: Experiment, recipe: Recipe) -> tuple[dict[str, str], dict[str, list[str]]]:
    scalars, arrays = shell_variables(exp, recipe)
    values = {name: str(v) for name, v, _ in scalars}
    lists = {name: list(v) for name, v, _ in arrays}
    values["RDMA_IB_DEVICES"] = ",".join(exp.serving.pd.rdma_devices)
    values["SGLANG_CONFIG"] = f".slime-lab.{exp.model.recipe}.{exp.rollout.queue_run_id}/sglang.yaml"
    return values, lists


def runtime_argv(exp: Experiment, recipe: Recipe | None = None) -> list[str]:
    """The argument list experiment.sh gives train.py / train_async.py: MODEL_ARGS, then TRAIN_ARGS."""
    recipe = recipe or get_recipe(exp.model.recipe)
    values, lists = _values(exp, recipe)
    argv: list[str] = list(experiment_model_args(exp, recipe)) if recipe.backends.train == "megatron" else []
    for group in train_flag_groups(exp, recipe, exp.placement.train_gpus):
        for line in group.lines:
            for tok in line:
                if isinstance(tok, Var):
                    if tok.array:
                        argv.extend(lists.get(tok.name, []))
                    else:
                        argv.append(values.get(tok.name, "") + tok.suffix)
                else:
                    argv.append(str(tok))
    if exp.paths.load:  # experiment.sh appends it from LOAD_DIR after the array
        argv += [VALUE_FLAG["paths.load"], exp.paths.load]
    return argv


def server_groups(exp: Experiment, recipe: Recipe) -> list[dict[str, Any]] | None:
    """The server groups of the sglang.yaml experiment.sh embeds (None when it embeds none)."""
    if not needs_sglang_yaml(exp, recipe):
        return None
    return sglang_groups(exp, recipe, exp.placement.train_gpus)
