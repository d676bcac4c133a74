"""How many of the lab's common configurations are clean: 8 recipes x 9 variants.

A configuration is clean when the lab shows no error and no memory warning (LAB-MEM-1) for it: the
runtime accepts it (no RUNTIME error) and the training phase fits the lab's memory estimate. Each
variant is set through the lab's own edit path (`lab.rules.apply_change`), as a user would set it
on the page, so dependent fields follow as they do there.

    PYTHONPATH=$PWD python bench/lab_clean_configs.py [--verbose]

prints one line per configuration that is not clean (with --verbose, every configuration) and
the count on the last line. Exit code 0 always: it measures, it does not judge.
"""
from __future__ import annotations

import argparse
from typing import Any

from lab.recipes import all_recipes
from lab.rules import ChangeError, apply_change, new_experiment, validate

# The common variants of the tutorial, each as the fields a user changes on the page.
VARIANTS: dict[str, dict[str, Any]] = {
    "default": {},
    "async": {"placement.scheduling": "async"},
    "colocated": {"placement.ownership": "colocated"},
    "gspo": {"task.advantage_estimator": "gspo"},
    "dapo": {"task.rm_type": "dapo", "rollout.over_sampling_batch_size": 64},
    "tis+icepop": {"corrections.tis": True, "corrections.icepop": True},
    "sc": {"corrections.sc": True},
    "partial": {"rollout.partial_rollout": True},
    "ppo": {"task.advantage_estimator": "ppo"},
}


def configuration(recipe: str, variant: str):
    exp = new_experiment(recipe)
    for path, value in VARIANTS[variant].items():
        exp, _ = apply_change(exp, path, value)
    return exp


def blockers(exp) -> list[str]:
    """What keeps it from being clean: errors, and the memory warning (runtime refusals by code)."""
    out = []
    for f in validate(exp):
        if f.level == "error" or f.id == "LAB-MEM-1":
            out.append(f.params.get("code") or f.id if f.id == "RUNTIME" else f.id)
    return out


def count(verbose: bool = False) -> tuple[int, int]:
    clean = total = 0
    for recipe in all_recipes():
        for variant in VARIANTS:
            total += 1
            try:
                why = blockers(configuration(recipe, variant))
            except ChangeError as exc:
                why = [f"refused at the field: {exc}"]
            clean += not why
            if why or verbose:
                print(f"{recipe:<13} {variant:<11} {'clean' if not why else ', '.join(sorted(set(why)))}")
    return clean, total


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--verbose", action="store_true", help="print every configuration, clean ones too")
    args = ap.parse_args()
    clean, total = count(args.verbose)
    print(f"{clean} of {total} configurations are clean")


if __name__ == "__main__":
    main()
