"""How many of the lab's common configurations are clean: 8 recipes x 9 variants.

A configuration is clean when the lab shows no error and no memory warning (LAB-MEM-1) for it: the
runtime accepts it (no RUNTIME error) and the training phase fits the lab's memory estimate. Each
variant is set through the lab's own edit path (`lab.rules.dependents.apply_change`), as a user would set it
on the page, so dependent fields follow as they do there.

    PYTHONPATH=$PWD python bench/lab_clean_configs.py [--verbose] [--issue-variants]

prints one line per configuration that is not clean (with --verbose, every configuration) and
the count on the last line. Exit code 0 always: it measures, it does not judge.

The variants are set as a user who wants each feature sets it so the runtime can run it: IcePop
instead of TIS (the runtime refuses the two together: "pick one"), SC with TIS off (SC already
weighs by the truncated ratio), DAPO's over-sampling at twice the rollout batch (the runtime asks
for 1.5-3x). `--issue-variants` sets them as issue 24 counted them (TIS and IcePop together, SC on
top of the recipe's TIS, over-sampling 64 whatever the batch), for the before/after comparison.
"""
from __future__ import annotations

import argparse
from typing import Any

from lab.core.change import ChangeError
from lab.core.recipes import all_recipes
from lab.rules.dependents import apply_change, new_experiment
from lab.rules.validate import validate

# The common variants of the tutorial, each as the fields a user changes on the page.
VARIANTS: dict[str, dict[str, Any]] = {
    "default": {},
    "async": {"placement.scheduling": "async"},
    "colocated": {"placement.ownership": "colocated"},
    "gspo": {"task.advantage_estimator": "gspo"},
    "dapo": {"task.rm_type": "dapo", "rollout.over_sampling_batch_size": "2x"},
    "tis/icepop": {"corrections.tis": False, "corrections.icepop": True},
    "sc": {"corrections.tis": False, "corrections.sc": True},
    "partial": {"rollout.partial_rollout": True},
    "ppo": {"task.advantage_estimator": "ppo"},
}


# As issue 24 counted them (15 of 72 clean before the runtime ran TP/PP/EP in the Ray loop).
ISSUE_VARIANTS: dict[str, dict[str, Any]] = {
    **{k: v for k, v in VARIANTS.items() if k not in ("dapo", "tis/icepop", "sc")},
    "dapo": {"task.rm_type": "dapo", "rollout.over_sampling_batch_size": 64},
    "tis+icepop": {"corrections.tis": True, "corrections.icepop": True},
    "sc": {"corrections.sc": True},
}


def configuration(recipe: str, variant: str, variants: dict[str, dict[str, Any]] = VARIANTS):
    exp = new_experiment(recipe)
    for path, value in variants[variant].items():
        if value == "2x":
            value = 2 * exp.task.rollout_batch_size
        exp, _ = apply_change(exp, path, value)
    return exp


def blockers(exp) -> list[str]:
    """What keeps it from being clean: errors, and the memory warning (runtime refusals by code)."""
    out = []
    for f in validate(exp):
        if f.level == "error" or f.id == "LAB-MEM-1":
            out.append(f.params.get("code") or f.id if f.id == "RUNTIME" else f.id)
    return out


def count(verbose: bool = False, variants: dict[str, dict[str, Any]] = VARIANTS) -> tuple[int, int]:
    clean = total = 0
    for recipe in all_recipes():
        for variant in variants:
            total += 1
            try:
                why = blockers(configuration(recipe, variant, variants))
            except ChangeError as exc:
                why = [f"refused at the field: {exc}"]
            clean += not why
            if why or verbose:
                print(f"{recipe:<13} {variant:<11} {'clean' if not why else ', '.join(sorted(set(why)))}")
    return clean, total


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--verbose", action="store_true", help="print every configuration, clean ones too")
    ap.add_argument("--issue-variants", action="store_true", help="the variants as issue 24 counted them")
    args = ap.parse_args()
    clean, total = count(args.verbose, ISSUE_VARIANTS if args.issue_variants else VARIANTS)
    print(f"{clean} of {total} configurations are clean")


if __name__ == "__main__":
    main()
