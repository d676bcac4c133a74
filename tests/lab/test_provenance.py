"""Provenance: experiment.json's hashes are the real files' sha256 (checked with `sha256sum`), the
checkout's commit and dirty flag come from git, and a scratch checkout whose recipe is edited
reports the new hash and the dirty flag."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from lab.core import provenance as P
from lab.core.recipes import REPO_ROOT, get_recipe
from lab.rules.dependents import new_experiment
from lab.web.export import experiment_files

pytestmark = pytest.mark.skipif(not shutil.which("git") or not shutil.which("sha256sum"), reason="needs git and sha256sum")


def sha256sum(path: Path) -> str:
    return subprocess.run(["sha256sum", str(path)], capture_output=True, text=True, check=True).stdout.split()[0]


def git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(cwd), *args], capture_output=True, text=True, check=True).stdout.strip()


@pytest.mark.parametrize("recipe", ["glm4-9b", "tiny-cpu"])
def test_experiment_json_hashes_equal_sha256sum_of_the_files(recipe):
    prov = json.loads(experiment_files(new_experiment(recipe))["experiment.json"])["provenance"]
    assert prov["sources"]["recipe"]["path"] == f"recipes/{recipe}.yaml"
    assert prov["sources"]["model_spec"]["path"] == get_recipe(recipe).model_spec
    for name, src in prov["sources"].items():
        assert src["sha256"] == sha256sum(REPO_ROOT / src["path"]), name
    assert prov["not_recorded"] and len(prov["not_recorded"]) == len(prov["not_recorded_ids"])
    assert {im["tag"] for im in prov["known_images"]} >= {prov["image"]["tag"]}


def test_checkout_commit_and_dirty_flag_come_from_git():
    if not (REPO_ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    P.reset_cache()
    ck = P.git_state()
    assert ck["commit"] == git(REPO_ROOT, "rev-parse", "HEAD")
    assert ck["dirty"] == bool(git(REPO_ROOT, "status", "--porcelain"))


def test_the_git_lookup_is_cached_and_a_source_edit_invalidates_it(monkeypatch, tmp_path):
    calls = []
    real = P._run_git
    monkeypatch.setattr(P, "_run_git", lambda *a: calls.append(a) or real(*a))
    P.reset_cache()
    recipe = get_recipe("glm4-9b")
    for _ in range(20):
        P.provenance(recipe, "x")
    assert sum(1 for c in calls if c[0] == "status") == 1
    monkeypatch.setattr(P, "_watch_key", lambda extra=(): ("changed",) + extra)  # e.g. .git/index moved
    P.provenance(recipe, "x")
    assert sum(1 for c in calls if c[0] == "status") == 2


SCRATCH_PARTS = ["lab", "slime", "recipes", "scripts/models", "docker", "tools/tiny"]  # the lab asks the runtime
RENDER = ("import json, sys; from lab.web.export import experiment_files; from lab.rules.dependents import new_experiment; "
          "f = experiment_files(new_experiment('glm4-9b')); "
          "print(json.dumps({'prov': json.loads(f['experiment.json'])['provenance'], 'head': f['experiment.sh'][:1500]}))")


def _render_in(root: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": str(root), "PYTHONDONTWRITEBYTECODE": "1"}
    out = subprocess.run([sys.executable, "-c", RENDER], cwd=root, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_a_scratch_checkout_reports_the_edited_recipe_hash_and_the_dirty_flag(tmp_path):
    root = tmp_path / "checkout"
    for part in SCRATCH_PARTS:
        shutil.copytree(REPO_ROOT / part, root / part, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    git(root, "init", "-q")
    git(root, "add", "-A")
    git(root, "-c", "user.name=lab test", "-c", "user.email=lab@test", "commit", "-q", "-m", "scratch")
    commit = git(root, "rev-parse", "HEAD")
    recipe = root / "recipes" / "glm4-9b.yaml"

    clean = _render_in(root)
    assert clean["prov"]["checkout"] == {"commit": commit, "dirty": False, "repository": "git"}
    assert clean["prov"]["sources"]["recipe"] == {"path": "recipes/glm4-9b.yaml", "sha256": sha256sum(recipe), "modified": False}
    assert f"at commit {commit}" in clean["head"] and "(dirty)" not in clean["head"]

    with recipe.open("a", encoding="utf-8") as f:
        f.write("# a local edit\n")
    dirty = _render_in(root)
    assert dirty["prov"]["checkout"] == {"commit": commit, "dirty": True, "repository": "git"}
    rec = dirty["prov"]["sources"]["recipe"]
    assert rec["sha256"] == sha256sum(recipe) != clean["prov"]["sources"]["recipe"]["sha256"] and rec["modified"] is True
    assert dirty["prov"]["sources"]["model_spec"]["modified"] is False
    assert f"at commit {commit} (dirty)" in dirty["head"] and rec["sha256"] in dirty["head"]


def test_an_expired_git_state_is_answered_at_once_and_refreshed_in_the_background(monkeypatch):
    calls = []
    real = P._run_git
    monkeypatch.setattr(P, "_run_git", lambda *a: calls.append(a) or real(*a))
    P.reset_cache()
    recipe = get_recipe("glm4-9b")
    first = P.provenance(recipe, "x")["checkout"]
    statuses = sum(1 for c in calls if c[0] == "status")
    with P._git_lock:  # age the cached state past its time to live
        P._git_cache = (P._git_cache[0] - P.GIT_TTL_S - 1, *P._git_cache[1:])
    threads_before = {t.ident for t in threading.enumerate()}
    assert P.provenance(recipe, "x")["checkout"] == first  # the cached state, without waiting for git
    refresher = [t for t in threading.enumerate() if t.name == "git-state" and t.ident not in threads_before]
    for t in refresher:
        t.join(30)
    assert sum(1 for c in calls if c[0] == "status") == statuses + 1  # one refresh, in the background
    assert time.monotonic() - P._git_cache[0] < P.GIT_TTL_S  # and the cache is fresh again
    assert P.provenance(recipe, "x")["checkout"] == P.git_state()
    P.reset_cache()
