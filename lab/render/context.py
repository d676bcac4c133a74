"""From an experiment to the values the templates print beyond its train command's flags (those are
lab/core/train_flags.py): the variables block's neighbours, YAML scalars, MODEL_ARGS lines, the job's
fixed environment.

Pure: reads the experiment and its recipe. Every user value stays a Python value here; the
templates quote it (the `q` / `words` filters).
"""
from __future__ import annotations

from typing import Any

from lab.core.experiment import Experiment
from lab.core.recipes import Recipe
from lab.core.shell_var import Var
from lab.core.train_flags import fmt_num, split_flag_lines
from lab.render.env import yq

DEFAULT_DASHBOARD = "http://127.0.0.1:8265"
# Data sets the default math task downloads in `prepare` (Hugging Face dataset repos), keyed by the
# file name the default paths use. A path with another file name is the user's own data.
KNOWN_DATASETS = {
    "dapo-math-17k.jsonl": "zhuzilin/dapo-math-17k",
    "aime-2024.jsonl": "zhuzilin/aime-2024",
}


def yaml_value(v: Any) -> str:
    """A YAML scalar: numbers and booleans plain, strings double-quoted (JSON escapes)."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return fmt_num(v)
    if isinstance(v, Var):
        raise ValueError("a shell variable cannot go into the quoted sglang.yaml heredoc")
    return yq(v)


def custom_model_lines(exp: Experiment) -> list[list[Any]]:
    """model.spec_args as the flag lines of the MODEL_ARGS array experiment.sh writes (empty: the recipe's spec)."""
    import shlex

    try:
        return split_flag_lines(shlex.split(exp.model.spec_args)) if exp.model.spec_args else []
    except ValueError:
        return []


def runtime_env_fixed(exp: Experiment, recipe: Recipe) -> list[str]:
    """Environment variables the job always gets (besides PYTHONPATH and NCCL_* passed through)."""
    env = ["PYTHONUNBUFFERED=1"]
    r = exp.resources
    if recipe.backends.train == "megatron" and (r.tp > 1 or r.cp > 1):
        env.append("CUDA_DEVICE_MAX_CONNECTIONS=1")  # PAR-4: Megatron requires it with TP/CP > 1
    if exp.precision.training == "fp8":
        env.append("NVTE_FP8_BLOCK_SCALING_FP32_SCALES=1")  # PRC-1
    return env
