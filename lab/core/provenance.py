"""Provenance of a generated file: which sources made it (never which versions run on a server).

Recorded (the same record in `experiment.json`, the page's "Source & validation scope" panel and,
as comments, the shell header):
- `checkout`: the commit of the lab's checkout and whether it is dirty (uncommitted or untracked
  changes), or null values when the lab does not run from a git checkout;
- `sources`: the recipe file and the model-spec file (and the tiny recipe's tuned flags), each with
  the sha256 of the file AS IT IS ON DISK NOW, so a dirty build is described by its real sources,
  and `modified`: whether that file differs from the commit (null outside git);
- `image`: the selected installation image and the versions `docker/images.yaml` records for it;
  `known_images`: every known image with its build versions;
- `not_recorded` (+ `not_recorded_ids`, the page's locale keys): what is NOT known, explicitly.

Fast: file hashes are cached per (path, mtime, size); the git state (one `git status` call) is
read again at once when a watched mtime changes (.git/index, .git/HEAD and the hashed source files),
and in the background once GIT_TTL_S has passed (the expired state is answered meanwhile), so a
burst of renders costs one git call, an edited recipe is seen at once and no answer waits for git.
The whole record is remembered per (recipe, image, the sources' mtime and size, the git state's
generation): every call still `stat`s the sources and asks `_git`, so a remembered record is only
answered while everything it was built from is unchanged (a new git state, even an equal one, is a
new generation). Remembered records are shared: callers must not modify them.
"""
from __future__ import annotations

import hashlib
import os
import subprocess
import threading
import time
from functools import lru_cache
from pathlib import Path
from typing import Any

from lab.core.memo import Memo
from lab.core.recipes import REPO_ROOT, Recipe

GIT_TTL_S = 5.0
NOT_RECORDED = [
    "versions installed on your servers (SGLang, Megatron, CUDA, driver): this record describes generation only",
    "GPU validation of this configuration: static checks do not certify capacity or memory fit",
]
NOT_RECORDED_IDS = ["server_versions", "gpu_validation"]  # the page's locale keys (prov_not_<id>), same order

_git_lock = threading.Lock()
_git_cache: tuple[float, tuple[Any, ...], dict[str, Any], frozenset[str]] | None = None
_git_generation = 0  # counts every state read into _git_cache: the provenance memo's key part


def _run_git(*args: str) -> str | None:
    try:
        out = subprocess.run(
            ["git", "-C", str(REPO_ROOT), *args], capture_output=True, text=True, timeout=5, check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout if out.returncode == 0 else None


def _prefix() -> str:
    """REPO_ROOT relative to the git top level ("" when the lab is the top level)."""
    if (REPO_ROOT / ".git").exists():
        return ""
    out = _run_git("rev-parse", "--show-prefix")
    return (out or "").strip()


def _read_git_state() -> tuple[dict[str, Any], frozenset[str]]:
    """One `git status --porcelain=v2 --branch` call: commit, dirty flag and the changed paths."""
    status = _run_git("status", "--porcelain=v2", "--branch", "--untracked-files=normal")
    if status is None:
        return {"commit": None, "dirty": None, "repository": None}, frozenset()
    commit = None
    changed: set[str] = set()
    prefix = _prefix()
    for line in status.splitlines():
        if line.startswith("# branch.oid "):
            oid = line.split()[2]
            commit = None if oid == "(initial)" else oid
        elif line.startswith(("1 ", "u ")):
            changed.add(line.split(" ", 8 if line[0] == "1" else 10)[-1])
        elif line.startswith("2 "):
            changed.add(line.split(" ", 9)[-1].split("\t", 1)[0])
        elif line.startswith("? "):
            changed.add(line[2:])
    if prefix:
        changed = {p[len(prefix):] if p.startswith(prefix) else "../" + p for p in changed}
    return {"commit": commit, "dirty": bool(changed), "repository": "git"}, frozenset(changed)


_GIT_INDEX = str(REPO_ROOT / ".git" / "index")
_GIT_HEAD = str(REPO_ROOT / ".git" / "HEAD")


def _mtime(path: str) -> int | None:
    try:
        return os.stat(path).st_mtime_ns
    except OSError:
        return None


def _watch_key(extra: tuple[Any, ...] = ()) -> tuple[Any, ...]:
    return (_mtime(_GIT_INDEX), _mtime(_GIT_HEAD)) + extra


def _set_git_cache(entry: tuple[float, tuple[Any, ...], dict[str, Any], frozenset[str]] | None) -> None:
    """Replace the cached git state (under _git_lock): a new generation for the provenance memo."""
    global _git_cache, _git_generation
    _git_cache = entry
    _git_generation += 1


_refreshing = False  # a background refresh of an expired state is running


def _refresh(key: tuple[Any, ...]) -> None:
    global _refreshing
    try:
        state, changed = _read_git_state()
        with _git_lock:
            if _git_cache is not None and _git_cache[1] == key:  # not reset or replaced meanwhile
                _set_git_cache((time.monotonic(), key, state, changed))
    finally:
        with _git_lock:
            _refreshing = False


def _git(extra_key: tuple[Any, ...] = ()) -> tuple[dict[str, Any], frozenset[str]]:
    """The git state: read now when none is cached or a watched mtime changed; when it has only
    expired, the cached one is answered and a refresh starts in the background, so the server's
    answers never wait for `git status` (tens to hundreds of ms on a busy machine) to change nothing."""
    state, changed, _ = _git_entry(extra_key)
    return dict(state), changed


def _git_entry(extra_key: tuple[Any, ...] = ()) -> tuple[dict[str, Any], frozenset[str], int]:
    """`_git`'s state (shared: not to be modified), with its generation."""
    global _refreshing
    now = time.monotonic()
    key = _watch_key(extra_key)
    with _git_lock:
        if _git_cache is None or _git_cache[1] != key:
            state, changed = _read_git_state()
            _set_git_cache((now, key, state, changed))
        elif now - _git_cache[0] > GIT_TTL_S and not _refreshing:
            _refreshing = True
            threading.Thread(target=_refresh, args=(key,), name="git-state", daemon=True).start()
        assert _git_cache is not None
        return _git_cache[2], _git_cache[3], _git_generation


def git_state() -> dict[str, Any]:
    """{"commit": sha or None, "dirty": bool or None, "repository": "git" or None} (cached briefly)."""
    return _git()[0]


def reset_cache() -> None:
    """Forget the cached git state and the remembered records (tests that change the checkout call this)."""
    with _git_lock:
        _set_git_cache(None)
    _RECORDS.clear()


@lru_cache(maxsize=256)
def _sha256_cached(path: str, mtime_ns: int, size: int) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 16), b""):
            h.update(chunk)
    return h.hexdigest()


def _stat(rel_path: str) -> tuple[Path, os.stat_result | None]:
    p = Path(rel_path)
    full = p if p.is_absolute() else REPO_ROOT / p
    try:
        return full, os.stat(full)
    except OSError:
        return full, None


def _is_changed(rel_path: str, changed: frozenset[str]) -> bool:
    # Untracked directories are listed once, with a trailing slash.
    return rel_path in changed or any(c.endswith("/") and rel_path.startswith(c) for c in changed)


def file_record(rel_path: str, changed: frozenset[str] | None = None, in_git: bool = False) -> dict[str, Any]:
    """{"path": rel, "sha256": hex, "modified": bool|None} for a repo file, or sha256 None + "missing"."""
    full, st = _stat(rel_path)
    if st is None:
        return {"path": rel_path, "sha256": None, "missing": True}
    rec: dict[str, Any] = {"path": rel_path, "sha256": _sha256_cached(str(full), st.st_mtime_ns, st.st_size)}
    if changed is not None:
        rec["modified"] = _is_changed(rel_path, changed) if in_git else None
    return rec


def _image_versions(image: Any) -> dict[str, Any]:
    return {
        "tag": image.tag,
        "known": True,
        "name": image.name,
        "cuda": image.cuda,
        "sglang": image.sglang,
        "megatron_core": image.megatron_core,
        "torch": image.torch,
        "gpu_family": image.gpu_family,
    }


def image_record(tag: str) -> dict[str, Any]:
    """The selected image and the versions docker/images.yaml knows for it (build facts only)."""
    try:
        from lab.core.images import get_image

        image = get_image(tag)
    except Exception:  # images.yaml missing or malformed: say so instead of failing a render
        image = None
    if image is None:
        return {"tag": tag, "known": False}
    return _image_versions(image)


def known_images() -> list[dict[str, Any]]:
    """Every image docker/images.yaml knows, with its build versions ([] when the file is unreadable)."""
    try:
        from lab.core.images import all_images

        return [_image_versions(im) for im in all_images().values()]
    except Exception:
        return []


def _source_paths(recipe: Recipe) -> dict[str, str]:
    paths = {"recipe": f"recipes/{recipe.name}.yaml", "model_spec": recipe.model_spec}
    if recipe.backends.train == "embedded":  # the tiny recipe's measured flags (lab/core/train_flags.py)
        paths["tiny_train_args"] = "tools/tiny/TRAIN_ARGS.yaml"
    return paths


def _stamp(rel_path: str) -> tuple[str, int | None, int | None]:
    st = _stat(rel_path)[1]
    return (rel_path, None, None) if st is None else (rel_path, st.st_mtime_ns, st.st_size)


# The last records built; each answer asks for B's (and A's) record, nearly always one seen before.
_RECORDS: Memo[dict[str, Any]] = Memo(64)


def provenance(recipe: Recipe, image_tag: str) -> dict[str, Any]:
    """The record (shared with other callers: do not modify it)."""
    paths = _source_paths(recipe)
    stamps = tuple(_stamp(p) for p in paths.values())
    git, changed, generation = _git_entry(tuple((p, mtime) for p, mtime, _ in stamps))
    key = (recipe.name, tuple(paths.items()), image_tag, stamps, generation)
    return _RECORDS.get(key, lambda: _record(paths, image_tag, git, changed))


def _record(paths: dict[str, str], image_tag: str, git: dict[str, Any], changed: frozenset[str]) -> dict[str, Any]:
    in_git = git["repository"] == "git"
    return {
        "generator": "slime-lab",
        "checkout": dict(git),
        "sources": {name: file_record(p, changed, in_git) for name, p in paths.items()},
        "image": image_record(image_tag),
        "known_images": known_images(),
        "not_recorded": list(NOT_RECORDED),
        "not_recorded_ids": list(NOT_RECORDED_IDS),
    }


def commit_label(prov: dict[str, Any]) -> str:
    """"abc123… (dirty)" for the shell header."""
    ck = prov["checkout"]
    label = ck["commit"] or "an uncommitted checkout"
    if ck.get("dirty"):
        label += " (dirty)"
    return label
