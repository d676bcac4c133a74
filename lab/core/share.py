"""Share links: the experiment's architecture choices, never its private fields.

A link is `BASE#s=TOKEN`, TOKEN = base64url(zlib(JSON)) of an envelope `{"v": SHARE_VERSION,
"schema": SCHEMA_VERSION, "choices": {...}}` (A/B links: `"a"` and `"b"` instead of `"choices"`).
The payload is the experiment minus every field in `PRIVATE_FIELDS` (lab/core/experiment.py marks them;
this module keeps no second list). The fragment never reaches a server. Decoding refuses a payload
that contains a private field, so a hand-made link cannot overwrite the opener's paths.
Opening a link applies its choices with their dependent changes, a rule: lab/rules/open_share.py.
"""
from __future__ import annotations

import base64
import binascii
import json
import zlib
from typing import Any

from lab.core import safe_json
from lab.core.experiment import PRIVATE_FIELDS, SCHEMA_VERSION, Experiment, get_path
from lab.core.workspace import LEAF_ORDER, flatten_choices

SHARE_VERSION = 1
DEFAULT_BASE_URL = "http://127.0.0.1:8765/"
MAX_TOKEN_CHARS = 64_000
MAX_JSON_BYTES = 1_000_000


class ShareError(ValueError):
    """A link that cannot be opened; `key` + `params` name its text in lab/locales/messages.*.json."""

    def __init__(self, message: str | None = None, key: str | None = None, params: dict | None = None) -> None:
        if message is None:
            from lab.core.messages import render

            message = render(key or "", params)
        super().__init__(message)
        self.key = key
        self.params = dict(params or {})

    """A link that cannot be opened; the message says why (not a link, corrupt, version, private)."""


def share_payload(exp: Experiment) -> dict[str, Any]:
    """The experiment's non-private fields as a nested choices dict."""
    data = exp.model_dump(mode="json")
    out: dict[str, Any] = {}
    for path in LEAF_ORDER:
        if path in PRIVATE_FIELDS:
            continue
        cur = out
        parts = path.split(".")
        for part in parts[:-1]:
            cur = cur.setdefault(part, {})
        cur[parts[-1]] = get_path(data, path)
    return out


def _encode(envelope: dict[str, Any]) -> str:
    raw = json.dumps(envelope, separators=(",", ":"), sort_keys=True).encode("utf-8")
    return base64.urlsafe_b64encode(zlib.compress(raw, 9)).decode("ascii").rstrip("=")


def _join(base_url: str, token: str) -> str:
    return f"{base_url.split('#', 1)[0]}#s={token}"


def encode_link(exp: Experiment, base_url: str = DEFAULT_BASE_URL) -> str:
    return _join(base_url, _encode({"v": SHARE_VERSION, "schema": SCHEMA_VERSION, "choices": share_payload(exp)}))


def encode_ab_link(a: Experiment, b: Experiment, base_url: str = DEFAULT_BASE_URL) -> str:
    """Both sides stripped of private fields, like ordinary links."""
    return _join(base_url, _encode({"v": SHARE_VERSION, "schema": SCHEMA_VERSION,
                                    "a": share_payload(a), "b": share_payload(b)}))


def _token(link_or_token: str) -> str:
    if not isinstance(link_or_token, str) or not link_or_token.strip():
        raise ShareError(key="error.share.not_link")
    text = link_or_token.strip()
    if "#" in text or "://" in text:
        fragment = text.split("#", 1)[1] if "#" in text else ""
        params = dict(p.split("=", 1) for p in fragment.split("&") if "=" in p)
        if "s" not in params:
            raise ShareError(key="error.share.no_fragment")
        text = params["s"]
    elif text.startswith("s="):
        text = text[2:]
    if len(text) > MAX_TOKEN_CHARS:
        raise ShareError(key="error.share.too_long", params={"n": len(text), "max": MAX_TOKEN_CHARS})
    return text


def _envelope(link_or_token: str) -> dict[str, Any]:
    token = _token(link_or_token)
    bare = isinstance(link_or_token, str) and "s=" not in link_or_token
    try:
        packed = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
        inflater = zlib.decompressobj()
        raw = inflater.decompress(packed, MAX_JSON_BYTES)
        if inflater.unconsumed_tail:
            raise ShareError(key="error.share.too_large")
        envelope = safe_json.loads(raw)
    except ShareError:
        raise
    except safe_json.JSONInputError as exc:
        if exc.key == "input.not_json":  # bytes that are not JSON: a truncated or edited link
            raise ShareError(key="error.share.corrupt") from exc
        raise ShareError(f"share link is corrupt: {exc}", key=exc.key, params=exc.params) from exc
    except (binascii.Error, ValueError, zlib.error, UnicodeDecodeError) as exc:
        if bare:
            raise ShareError(key="error.share.not_link") from exc
        raise ShareError(key="error.share.corrupt") from exc
    if not isinstance(envelope, dict) or "v" not in envelope:
        raise ShareError(key="error.share.corrupt")
    if envelope["v"] != SHARE_VERSION:
        raise ShareError(key="error.share.version", params={"v": repr(envelope["v"]), "current": SHARE_VERSION})
    return envelope


def _check_side(choices: Any, side: str) -> dict[str, Any]:
    if not isinstance(choices, dict):
        raise ShareError(key="error.share.side", params={"side": side})
    try:
        leaves = flatten_choices(choices)
    except ValueError as exc:
        raise ShareError(key="error.share.unknown_field", params={"field": getattr(exc, "field", "") or str(exc)}) from exc
    private = sorted(p for p in leaves if p in PRIVATE_FIELDS)
    if private:
        raise ShareError(key="error.share.private", params={"fields": ", ".join(private)})
    return choices


def decode_link(link_or_token: str) -> dict[str, Any]:
    """The choices dict of an ordinary share link (raises ShareError; A/B links: decode_ab_link)."""
    env = _envelope(link_or_token)
    if "choices" not in env:
        if "a" in env and "b" in env:
            raise ShareError(key="error.share.ab_link")
        raise ShareError(key="error.share.no_choices")
    return _check_side(env["choices"], "choices")


def decode_ab_link(link_or_token: str) -> tuple[dict[str, Any], dict[str, Any]]:
    env = _envelope(link_or_token)
    if "a" not in env or "b" not in env:
        raise ShareError(key="error.share.not_ab")
    return _check_side(env["a"], "a"), _check_side(env["b"], "b")


def is_ab_link(link_or_token: str) -> bool:
    env = _envelope(link_or_token)
    return "a" in env and "b" in env
