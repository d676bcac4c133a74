"""Every Experiment field, section and leaf, has a description (the page and the docs show it)."""
from __future__ import annotations

from pydantic import BaseModel

from lab.core.experiment import LEAF_FIELDS, Experiment, iter_field_paths


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


def test_english_field_help_is_the_field_description_and_en_json_keeps_no_copy():
    """One source: the page's English help of a field is its description in lab/core/experiment.py."""
    from lab.web.page import load_locale, page_locale

    assert [p for p, f in load_locale("en")["fields"].items() if "help" in f] == []
    en = page_locale("en")["fields"]
    assert {p: en[p]["help"] for p, _ in iter_field_paths()} == {p: info.description for p, info in iter_field_paths()}
    zh = page_locale("zh")["fields"]
    assert [p for p, _ in iter_field_paths() if not zh[p].get("help", "").strip()] == []  # translated, not copied
    assert all(zh[p]["help"] != en[p]["help"] for p, _ in iter_field_paths())


def test_the_page_and_its_locale_route_show_the_description_as_help():
    from fastapi.testclient import TestClient

    from lab.web.app import create_app

    client = TestClient(create_app(), base_url="http://127.0.0.1")
    info = dict(iter_field_paths())["advanced.extra_flags"]
    assert client.get("/locales/en.json").json()["fields"]["advanced.extra_flags"]["help"] == info.description
    html = client.get("/").text + client.get("/later-steps.html").text  # steps 2-6 come apart (lab/page.py)
    assert f'data-part="help">{info.description.replace(chr(39), "&#39;")}</small>' in html
