"""Every Experiment field, section and leaf, has a description (the page and the docs show it)."""
from __future__ import annotations

from pydantic import BaseModel

from lab.experiment import LEAF_FIELDS, Experiment, iter_field_paths


def _all_fields(model: type[BaseModel], prefix: str = ""):
    for name, info in model.model_fields.items():
        yield f"{prefix}{name}", info
        ann = info.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            yield from _all_fields(ann, f"{prefix}{name}.")


def test_walk_sees_every_field():
    seen = [p for p, _ in _all_fields(Experiment)]
    assert len(LEAF_FIELDS) > 60 and set(LEAF_FIELDS) <= set(seen)


def test_every_experiment_field_has_a_description():
    missing = [p for p, info in _all_fields(Experiment) if not (info.description or "").strip()]
    assert missing == []


def test_descriptions_are_sentences_not_placeholders():
    short = [p for p, info in iter_field_paths() if len((info.description or "").strip()) < 8]
    assert short == []
