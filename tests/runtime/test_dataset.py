"""Prompt data: formats, keys, chat template, seeded epochs, positions; errors name the cause."""

from __future__ import annotations

import json

import pytest

from slime.data.dataset import DataError, DataPosition, PromptSource, check_data, load_prompts, read_records
from tests.refusal_codes import raised


def _jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_malformed_jsonl_line_is_named_by_file_and_line(tmp_path):
    p = tmp_path / "d.jsonl"
    p.write_text('{"prompt": "1", "label": "1"}\n{"prompt": "2", "label": \n')
    with pytest.raises(DataError) as e:
        read_records(p)
    assert raised(e.value, "data.bad_json", path=str(p), line=2)


def test_missing_key_names_the_key_the_line_and_the_keys_present(tmp_path):
    p = _jsonl(tmp_path / "d.jsonl", [{"prompt": "1", "label": "1"}, {"question": "2", "label": "2"}])
    with pytest.raises(DataError) as e:
        check_data(p, "prompt", "label", "--prompt-data")
    assert raised(e.value, "data.missing_key", line=2, key="prompt", flag="--input-key")
    assert "'label', 'question'" in str(e.value.args[0].params["keys"])


def test_missing_file_names_the_flag_and_the_path(tmp_path):
    with pytest.raises(DataError) as e:
        read_records(tmp_path / "nope.jsonl", "--prompt-data")
    assert raised(e.value, "data.not_found", flag="--prompt-data", path=str(tmp_path / "nope.jsonl"))


def test_parquet_reads_like_jsonl(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist([{"prompt": "123", "label": "3"}]), tmp_path / "d.parquet")
    assert read_records(tmp_path / "d.parquet") == [{"prompt": "123", "label": "3"}]


def test_chat_template_wraps_the_prompt_with_a_generation_prompt(tiny):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny["model"])
    recs = load_prompts(tiny["eval"], tok, "prompt", "label", apply_chat_template=True)
    r = recs[0]
    assert r.prompt_text == f"<|user|>{r.prompt}<|assistant|>"
    assert list(r.prompt_tokens) == tok(r.prompt_text, add_special_tokens=False)["input_ids"]


def _source(n=10, shuffle=True, pos=None):
    from slime.data.dataset import PromptRecord

    pos = pos if pos is not None else DataPosition()  # a fresh position per source: it advances
    recs = [PromptRecord(i, str(i), str(i), (i,), None, {}) for i in range(n)]
    return PromptSource(recs, shuffle, seed=42, position=pos)


def test_each_epoch_is_a_fresh_seeded_permutation():
    s = _source()
    e0 = [r.prompt_id for _, r in s.next_batch(10)]
    e1 = [r.prompt_id for _, r in s.next_batch(10)]
    assert sorted(e0) == sorted(e1) == list(range(10)) and e0 != e1
    assert e0 == [r.prompt_id for _, r in _source().next_batch(10)]  # seed + epoch: reproducible


def test_a_saved_position_continues_exactly_where_the_run_stopped():
    full = _source()
    ids_full = [r.prompt_id for _ in range(5) for _, r in full.next_batch(4)]
    first = _source()
    ids = [r.prompt_id for _ in range(2) for _, r in first.next_batch(4)]
    resumed = _source(pos=DataPosition.from_dict(first.position.to_dict()))
    ids += [r.prompt_id for _ in range(3) for _, r in resumed.next_batch(4)]
    assert ids == ids_full
