"""Refactors keep the product's output: every recipe x common variant renders the same bytes as
the stored record (tools/render_golden.py writes it when a change is meant)."""
from __future__ import annotations

import json

from tools.render_golden import GOLDEN, renders


def test_every_recipe_and_variant_renders_the_same_bytes_as_recorded():
    recorded = json.loads(GOLDEN.read_text())
    now = renders()
    changed = sorted(k for k in recorded.keys() | now.keys() if recorded.get(k) != now.get(k))
    assert len(recorded) >= 8 * 9 * 2
    assert not changed, (f"{len(changed)} rendered files differ from the record, first: {changed[:8]}; "
                         "if the change is meant, run `python tools/render_golden.py --write` and say why")
