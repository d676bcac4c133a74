"""CPU time of one lab edit, one client, in-process: what the server computes per `POST /api/workspace`.

    python bench/bench_lab_edit.py [--edits 300] [--history 200] [--out FILE]

Runs the route's own steps on the request bytes a page sends (the body reader `lab.core.safe_json.loads`,
`WorkspaceRequest` validation, then `respond`: `check_workspace`, the history's unsent entries stood
in for, `_answer` and the encoded answer), without HTTP,
threads or other clients, so the figure is the cost of one answer whatever else runs on the machine
(CPU time of this process, not wall time). Two streams of edits, each after `--history` edits of
warm-up so the undo history sent back is as long as the load test's:

- `repeat`: the load test's edits (bench/bench_lab_load.py), which come back to experiments already
  seen, as a user going back and forth does;
- `new`: every edit makes an experiment not seen before (`task.num_rollout` counts up), so nothing
  computed for an earlier experiment can be reused.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import report
from bench_lab_load import (  # the load test's edits and page: one definition
    EDITS,
    page_applies,
    page_holds,
    page_request,
)


def _route(body: bytes) -> bytes:
    """What the server does for one request body, up to the answer's bytes."""
    from lab.core.safe_json import loads
    from lab.web import api_workspace as api

    answer = api.respond(api.WorkspaceRequest.model_validate(loads(body)))
    assert answer.status_code == 200, answer.body[:300]
    return bytes(answer.body)


def _body(ws: dict | None, action: dict, held: dict[str, str]) -> bytes:
    """What the page sends: B, A, the tops of the history stacks, their lengths and the tags of the parts it holds."""
    return json.dumps(page_request(ws, action, held) if ws is not None else {"workspace": None, "action": action}).encode()


def _stream(kind: str, k: int) -> tuple[str, object]:
    if kind == "new":
        return "task.num_rollout", 1000 + k
    field, values = EDITS[k % len(EDITS)]
    return field, values[(k // len(EDITS)) % len(values)]


def measure(kind: str, edits: int, history: int) -> dict[str, float]:
    first = json.loads(_route(_body(None, {"type": "view"}, {})))
    ws, held = first["workspace"], first["tags"]
    k = 0
    for _ in range(history):
        field, value = _stream(kind, k)
        k += 1
        data = json.loads(_route(_body(ws, {"type": "edit", "path": field, "value": value}, held)))
        ws, held = page_applies(ws, data), page_holds(held, data)
    cpu = 0.0
    for _ in range(edits):
        field, value = _stream(kind, k)
        k += 1
        body = _body(ws, {"type": "edit", "path": field, "value": value}, held)  # the client's part: not counted
        t = time.process_time()
        answer = _route(body)
        cpu += time.process_time() - t
        data = json.loads(answer)
        ws, held = page_applies(ws, data), page_holds(held, data)
    return {"cpu_ms_per_edit": round(1000 * cpu / edits, 2), "history": len(ws["undo"]), "body_bytes": len(body),
            "answer_bytes": len(answer)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--edits", type=int, default=300)
    ap.add_argument("--history", type=int, default=200)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "lab_edit.json"))
    args = ap.parse_args()
    load_at_start = os.getloadavg()
    result = {
        "edits": args.edits,
        "repeat": measure("repeat", args.edits, args.history),
        "new": measure("new", args.edits, args.history),
        "machine": report.machine(load_at_start),
    }
    report.write(result, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
