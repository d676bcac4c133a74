"""Share links carry choices, never private fields; decoding refuses bad links with a clear reason."""
from __future__ import annotations

import base64
import json
import zlib

import pytest

from lab.core import workspace as W
from lab.core.change import validated
from lab.core.experiment import LEAF_FIELDS, PRIVATE_FIELDS, Experiment, get_path, set_path
from lab.core.share import ShareError, decode_ab_link, decode_link, encode_ab_link, encode_link, share_payload
from lab.core.workspace import flatten_choices
from lab.rules import edit as E
from lab.rules.dependents import new_experiment
from lab.rules.open_share import open_share_link


def marked(recipe="glm4.7") -> Experiment:
    """Every private field filled with a marker MARK-<path>."""
    data = new_experiment(recipe).model_dump(mode="json")
    for path in PRIVATE_FIELDS:
        value = f"MARK-{path}"
        set_path(data, path, [value] if isinstance(get_path(data, path), list) else value)
    return validated(data)


def _raw_token(link: str) -> str:
    token = link.split("#s=", 1)[1]
    return zlib.decompress(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))).decode()


def _token_of(envelope: dict) -> str:
    return base64.urlsafe_b64encode(zlib.compress(json.dumps(envelope).encode())).decode().rstrip("=")


def test_there_are_private_fields_to_strip():
    assert {"paths.hf_checkpoint", "placement.external_engine_addrs", "task.custom_reward_path"} <= PRIVATE_FIELDS


def test_link_and_payload_contain_no_private_value():
    exp = marked()
    assert all("MARK-" in str(get_path(exp.model_dump(), p)) for p in PRIVATE_FIELDS)
    link = encode_link(exp)
    assert "MARK-" not in link and "MARK-" not in _raw_token(link)
    payload = decode_link(link)
    assert "MARK-" not in json.dumps(payload)
    assert set(flatten_choices(payload)) == LEAF_FIELDS - PRIVATE_FIELDS


def test_ab_link_strips_both_sides():
    a, b = marked("glm4.7"), marked("deepseek-r1")
    link = encode_ab_link(a, b)
    assert "MARK-" not in _raw_token(link)
    pa, pb = decode_ab_link(link)
    assert pa["model"]["recipe"] == "glm4.7" and pb["model"]["recipe"] == "deepseek-r1"


def test_link_is_a_url_fragment_on_the_base():
    link = encode_link(new_experiment(), base_url="https://lab.example/q?x=1")
    assert link.startswith("https://lab.example/q?x=1#s=")


def test_opening_a_link_reproduces_the_choices_and_keeps_my_paths():
    src = E.edit(W.Workspace(b=new_experiment("qwen3.8-27b")), "placement.scheduling", "async").b
    mine = E.edit(E.fresh_workspace(), "paths.save", "/my/ckpt")
    opened = open_share_link(mine, encode_link(src))
    assert share_payload(opened.b) == share_payload(src)
    assert opened.b.paths.save == "/my/ckpt"
    assert len(opened.undo) == len(mine.undo) + 1 and opened.undo[-1].label == "open share link"
    assert W.undo(opened).b == mine.b


def test_opening_an_ab_link_sets_a_and_b_keeping_my_paths():
    mine = E.edit(E.fresh_workspace(), "paths.save", "/my/ckpt")
    opened = open_share_link(mine, encode_ab_link(new_experiment("glm4.7"), new_experiment("deepseek-r1")))
    assert opened.a.model.recipe == "glm4.7" and opened.b.model.recipe == "deepseek-r1"
    assert opened.a.paths.save == opened.b.paths.save == "/my/ckpt"


def test_token_alone_decodes():
    link = encode_link(new_experiment())
    assert decode_link(link.split("#s=")[1]) == decode_link(link)


@pytest.mark.parametrize("bad", ["", "hello", "http://127.0.0.1:8765/#x=1", "http://127.0.0.1:8765/"])
def test_not_a_link_is_refused(bad):
    with pytest.raises(ShareError, match="not a share link"):
        decode_link(bad)


def test_corrupt_link_is_refused():
    link = encode_link(new_experiment())
    with pytest.raises(ShareError, match="corrupt"):
        decode_link(link[:-10])
    with pytest.raises(ShareError, match="corrupt"):
        decode_link("http://h/#s=!!!notbase64")


def test_unknown_version_is_refused():
    token = _token_of({"v": 99, "choices": {}})
    with pytest.raises(ShareError, match="version 99"):
        decode_link(token)


def test_link_with_a_private_field_is_refused():
    token = _token_of({"v": 1, "choices": {"model": {"recipe": "glm4.7"}, "paths": {"save": "/evil"}}})
    with pytest.raises(ShareError, match="private fields.*paths.save"):
        decode_link(token)


def test_link_with_an_unknown_field_is_refused():
    with pytest.raises(ShareError, match="does not know"):
        decode_link(_token_of({"v": 1, "choices": {"resources": {"tpp": 2}}}))


def test_oversized_payload_is_refused():
    big = base64.urlsafe_b64encode(zlib.compress(b"{" + b" " * 5_000_000 + b"}")).decode()
    with pytest.raises(ShareError, match="too large|too long"):
        decode_link(big)
