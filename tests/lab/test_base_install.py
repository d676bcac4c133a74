"""The base install is the lab alone: it must run without torch, Ray or transformers."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import tomllib

REPO = Path(__file__).resolve().parents[2]
HEAVY = ("torch", "ray", "transformers", "numpy", "megatron", "sglang")


def test_base_dependencies_pull_no_torch_or_ray() -> None:
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    names = {d.split(">")[0].split("=")[0].split("[")[0].split(";")[0].strip().lower() for d in deps}
    assert names == {"fastapi", "uvicorn", "httptools", "uvloop", "websockets", "pydantic", "jinja2", "pyyaml",
                     "markdown-it-py", "latex2mathml", "tree-sitter", "tree-sitter-bash"}
    # httptools, uvloop: uvicorn's C parts; websockets: its WebSocket support (the workspace socket);
    # tree-sitter: the import's bash reader


def test_the_lab_serves_renders_and_shows_grpo_numbers_with_heavy_packages_blocked() -> None:
    # Blocking the imports proves the lab never reaches for them, even lazily on these paths.
    code = f"""
import sys
for name in {HEAVY!r}:
    sys.modules[name] = None
from fastapi.testclient import TestClient
from lab.web.app import create_app
client = TestClient(create_app(), base_url="http://127.0.0.1")
assert client.get("/").status_code == 200
assert "<math" in client.get("/docs/en/corrections.md").text
view = client.post("/api/workspace", json={{"workspace": None, "action": {{"type": "view"}}}})
assert view.status_code == 200, view.text
assert "experiment.sh" in view.json()["files"]
example = client.get("/api/grpo-example").json()
assert client.post("/api/run-metrics", json={{"text": '{{"step": 1, "phase/rollout": 1.0, "perf/step_time": 1.0}}'}}).status_code == 200
print(example)
"""
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "0.935" in out.stdout  # the walkthrough's advantages, computed by slime.data.batch_builder
