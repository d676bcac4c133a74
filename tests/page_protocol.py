"""What the page sends and keeps (lab/static/app.js), for the tests that speak to the API as it does."""
from __future__ import annotations

import random

from lab.core.history_tail import TAIL_SENT


def tail_request(ws: dict, action: dict, lang: str = "en") -> dict:
    """What the page sends (lab/static/app.js)."""
    sent = {"b": ws["b"], "a": ws["a"], "undo": ws["undo"][-TAIL_SENT:], "redo": ws["redo"][-TAIL_SENT:]}
    return {"workspace": sent, "history": {"undo": len(ws["undo"]), "redo": len(ws["redo"])}, "action": action,
            "lang": lang}


def applied(ws: dict, answer: dict) -> dict:
    """What the page stores after the answer: B and A from it, each stack changed as it says."""
    h = answer["history"]
    return {**answer["workspace"],
            **{side: ws[side][h[side]["start"]:h[side]["stop"]] + h[side]["push"] for side in ("undo", "redo")}}


def actions(rng: random.Random):
    edits = [("task.num_rollout", lambda: rng.randint(1, 50)), ("rollout.temperature", lambda: rng.choice([0.6, 0.8, 1.0])),
             ("placement.ownership", lambda: rng.choice(["colocated", "disaggregated"])),
             ("model.recipe", lambda: rng.choice(["glm4-9b", "qwen3.8-27b"]))]
    while True:
        r = rng.random()
        if r < 0.5:
            path, value = rng.choice(edits)
            yield {"type": "edit", "path": path, "value": value()}
        elif r < 0.7:
            yield {"type": "undo"}
        elif r < 0.82:
            yield {"type": "redo"}
        else:
            yield rng.choice([{"type": "reset"}, {"type": "save_a"}, {"type": "restore_a"}, {"type": "clear_a"},
                              {"type": "adopt_grpo"}, {"type": "view"}])
