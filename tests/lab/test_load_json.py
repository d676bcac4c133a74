"""Load JSON accepts our exports, schema-1 exports and bare choices; bad files are named, not applied."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from lab.core.experiment import Experiment
from lab.core.load_json import MAX_BYTES, SCHEMA1_KEYS, LoadError, parse_document

FIXTURE = Path(__file__).resolve().parent.parent / "fixtures" / "schema1_export.json"


def test_schema1_export_migrates_to_field_paths() -> None:
    loaded = parse_document(FIXTURE.read_text())
    assert loaded.form == "schema1"
    c = loaded.choices
    assert c["model"]["recipe"] == "glm4.7-flash"
    assert c["placement"]["ownership"] == "colocated"
    assert c["precision"]["rollout"] == "fp8"
    assert c["serving"]["eagle"]["enabled"] is True
    assert c["evaluation"] == {"enabled": True, "name": "aime", "data_path": "/mnt/team/aime-2024.jsonl",
                               "interval": 10, "n_samples": 4}
    assert c["paths"]["hf_checkpoint"] == "/mnt/team/GLM-4.7-Flash"


def test_every_schema1_key_maps_to_a_real_field() -> None:
    from lab.core.experiment import LEAF_FIELDS
    assert set(SCHEMA1_KEYS.values()) <= LEAF_FIELDS


def test_our_export_round_trips_to_the_same_experiment() -> None:
    exp = Experiment()
    doc = {"schema": 2, "experiment": exp.model_dump(mode="json"), "provenance": {"ignored": True}}
    loaded = parse_document(json.dumps(doc))
    assert loaded.form == "export"
    assert Experiment.model_validate(loaded.choices) == exp


def test_bare_choices_nested_and_dotted_are_accepted() -> None:
    nested = parse_document('{"placement": {"scheduling": "async"}}')
    dotted = parse_document('{"placement.scheduling": "async"}')
    assert nested.form == dotted.form == "choices"
    assert nested.choices == dotted.choices == {"placement": {"scheduling": "async"}}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("{not json", "not valid JSON"),
        ("[1, 2]", "expected a JSON object"),
        ('{"placement": {"owner": "x"}}', "unknown field 'placement.owner'"),
        ('{"schema": 7, "experiment": {}}', "unknown schema 7"),
        ('{"schema": 1, "choices": {"modle": "glm4-9b"}}', "did you mean 'model'"),
        ('{"schema": 2, "experiment": "glm"}', '"experiment" must be an object'),
    ],
)
def test_bad_files_get_a_message_naming_what_is_wrong(text: str, expected: str) -> None:
    with pytest.raises(LoadError) as err:
        parse_document(text)
    assert expected in str(err.value)


def test_not_json_message_gives_line_and_column() -> None:
    with pytest.raises(LoadError, match=r"line 2, column \d+"):
        parse_document('{"a": 1,\n oops}')


def test_too_large_file_is_refused_before_parsing() -> None:
    with pytest.raises(LoadError, match="at most"):
        parse_document("{" + " " * (MAX_BYTES + 1) + "}")
