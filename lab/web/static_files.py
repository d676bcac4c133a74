"""GET /static/…: the page's scripts and stylesheets, from memory, gzipped once, revalidated by ETag.

Starlette's StaticFiles opens and reads the file in a worker thread on every request and sends it
uncompressed: a first load asks for seven files at once, so each answer waited for a thread and
moved the whole file. Here each file is read and gzipped once and kept with its ETag (a hash of
its bytes): an answer is a dict lookup, a `stat` and one write, and a browser that holds the file
gets 304 without a body.

Never stale: every request `stat`s the file, and a changed size or modification time reads it
again, so an edit to lab/static/ is served at once, as StaticFiles did. Only regular files under
lab/static/ are served, by a path of plain name parts (no `..`, no hidden names, no backslashes);
anything else is 404. GET and HEAD only (405 otherwise); errors are JSON as the API's. A pure ASGI app: no thread, no
dependency injection per request.
"""
from __future__ import annotations

import gzip
import hashlib
import json
import os
import re
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lab.web.guard import Receive, Scope, Send

STATIC_DIR = Path(__file__).resolve().parents[1] / "static"
MEDIA_TYPES = {
    ".js": b"text/javascript; charset=utf-8",
    ".css": b"text/css; charset=utf-8",
    ".json": b"application/json",
    ".svg": b"image/svg+xml",
    ".png": b"image/png",
    ".txt": b"text/plain; charset=utf-8",
}
COMPRESSIBLE = frozenset({".js", ".css", ".json", ".svg", ".txt"})
# One path part: letters, digits, '.', '_', '-', not starting with '.' (no `..`, no hidden files).
_PART = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]*\Z")


@dataclass(frozen=True)
class StaticFile:
    stamp: tuple[int, int]  # (st_mtime_ns, st_size) the bytes were read at
    body: bytes
    zipped: bytes | None  # None: not worth compressing (already compressed, or gzip is no smaller)
    etag: bytes
    media_type: bytes


def load(path: Path, stamp: tuple[int, int]) -> StaticFile:
    body = path.read_bytes()
    zipped = gzip.compress(body, compresslevel=9, mtime=0) if path.suffix in COMPRESSIBLE else None
    if zipped is not None and len(zipped) >= len(body):
        zipped = None
    etag = b'"' + hashlib.sha256(body).hexdigest()[:32].encode() + b'"'
    return StaticFile(stamp, body, zipped, etag, MEDIA_TYPES.get(path.suffix, b"application/octet-stream"))


def safe_parts(rel: str) -> list[str] | None:
    """The name parts of a requested path, or None when it may leave lab/static/ or name a hidden file."""
    parts = rel.split("/")
    return parts if parts and all(_PART.match(p) for p in parts) else None


def etag_matches(header: bytes, etag: bytes) -> bool:
    """If-None-Match holds `etag` (one of a comma-separated list, weak or strong) or `*`."""
    for tag in header.split(b","):
        tag = tag.strip()
        if tag == b"*" or tag == etag or tag == b"W/" + etag:
            return True
    return False


class StaticFiles:
    """The ASGI app mounted at /static (`root`: the folder served)."""

    def __init__(self, root: Path = STATIC_DIR) -> None:
        self.root = root
        self._files: dict[str, StaticFile] = {}
        self._lock = threading.Lock()

    def get(self, rel: str) -> StaticFile | None:
        """The file at `rel` as it is on disk now (read again when it changed), or None."""
        parts = safe_parts(rel)
        if parts is None:
            return None
        path = self.root.joinpath(*parts)
        try:
            st = os.stat(path)
        except OSError:
            return None
        if not os.path.isfile(path):
            return None
        stamp = (st.st_mtime_ns, st.st_size)
        hit = self._files.get(rel)
        if hit is not None and hit.stamp == stamp:
            return hit
        try:
            fresh = load(path, stamp)
        except OSError:
            return None
        with self._lock:
            self._files[rel] = fresh
        return fresh

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        method = scope["method"]
        if method not in ("GET", "HEAD"):
            await _error(send, 405, "Method Not Allowed", [(b"allow", b"GET, HEAD")])
            return
        f = self.get(_relative(scope))
        if f is None:
            await _error(send, 404, "Not Found")
            return
        headers = dict(scope["headers"])
        common = [(b"etag", f.etag), (b"cache-control", b"no-cache"), (b"vary", b"accept-encoding")]
        if etag_matches(headers.get(b"if-none-match", b""), f.etag):
            await send({"type": "http.response.start", "status": 304, "headers": common})
            await send({"type": "http.response.body", "body": b""})
            return
        gz = f.zipped is not None and b"gzip" in headers.get(b"accept-encoding", b"")
        body = f.zipped if gz and f.zipped is not None else f.body
        out = [(b"content-type", f.media_type), (b"content-length", str(len(body)).encode()), *common]
        if gz:
            out.append((b"content-encoding", b"gzip"))
        await send({"type": "http.response.start", "status": 200, "headers": out})
        await send({"type": "http.response.body", "body": b"" if method == "HEAD" else body})


def _relative(scope: Scope) -> str:
    """The path below the mount point (Starlette's Mount sets root_path to it; the path keeps it)."""
    path: str = scope["path"]
    root: str = scope.get("root_path", "")
    if root and path.startswith(root):
        path = path[len(root):]
    return path.lstrip("/")


async def _error(send: Send, status: int, detail: str, extra: list[tuple[bytes, bytes]] | None = None) -> None:
    """JSON, as every other answer of the lab (`{"detail": ...}`, what FastAPI answered for StaticFiles)."""
    body = json.dumps({"detail": detail}).encode()
    headers: list[Any] = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                          *(extra or [])]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
