"""Hashes of every file the lab renders for each recipe x common variant: the record that a
refactor left the product's output unchanged byte for byte.

    PYTHONPATH=$PWD python tools/render_golden.py            # print the table
    PYTHONPATH=$PWD python tools/render_golden.py --write    # rewrite tests/fixtures/render_golden.json

Rewrite the record only when a render is meant to change, and say why in the commit.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

GOLDEN = ROOT / "tests" / "fixtures" / "render_golden.json"


def _pinned(prov: dict) -> dict:
    """The provenance record with the checkout's own state fixed (commit, dirty, which files differ
    from it): those change with every commit; the source files' hashes stay, they are the content."""
    prov = dict(prov, checkout={"commit": "0" * 40, "dirty": False, "repository": "git"})
    prov["sources"] = {k: {**v, "modified": False} if "modified" in v else v for k, v in prov["sources"].items()}
    return prov


def renders() -> dict[str, str]:
    """'recipe/variant/file' -> sha256 of the rendered bytes."""
    from lab_clean_configs import VARIANTS, configuration

    from lab.core.provenance import provenance
    from lab.core.recipes import all_recipes, get_recipe
    from lab.web.export import experiment_files

    out: dict[str, str] = {}
    for recipe in all_recipes():
        for variant in VARIANTS:
            try:
                exp = configuration(recipe, variant)
            except Exception as exc:  # a variant the lab refuses at the field is recorded as such
                out[f"{recipe}/{variant}/refused"] = type(exc).__name__
                continue
            for name, text in sorted(experiment_files(exp, prov=_pinned(provenance(get_recipe(recipe), exp.install.image))).items()):
                out[f"{recipe}/{variant}/{name}"] = hashlib.sha256(text.encode()).hexdigest()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write", action="store_true", help="rewrite the stored record")
    a = ap.parse_args()
    table = renders()
    if a.write:
        GOLDEN.write_text(json.dumps(table, indent=1, sort_keys=True) + "\n")
        print(f"wrote {len(table)} entries to {GOLDEN.relative_to(ROOT)}")
    else:
        print(json.dumps(table, indent=1, sort_keys=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
