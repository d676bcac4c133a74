"""The page, the recipe and the docs agree on the fresh page's reward and say why it is `math`
for a non-reasoning model (no </think>: deepscaler would score 0) and when to pick deepscaler."""
from __future__ import annotations

import json

import pytest

from lab.core.recipes import REPO_ROOT, get_recipe
from lab.rules.dependents import new_experiment

LANGS = ("en", "zh")


def _step1(lang: str) -> str:
    return json.loads((REPO_ROOT / "lab" / "static" / "locales" / f"{lang}.json").read_text())["ui"]["step1_lead"]


def test_the_fresh_pages_reward_is_the_first_recipes_math_for_a_non_reasoning_model():
    exp = new_experiment()
    recipe = get_recipe(exp.model.recipe)
    assert recipe.rm_type == exp.task.rm_type == "math", (recipe.name, recipe.rm_type, exp.task.rm_type)


@pytest.mark.parametrize("lang", LANGS)
def test_step1_text_names_the_default_reward_why_and_when_to_pick_deepscaler(lang):
    exp = new_experiment()
    text = _step1(lang)
    assert exp.task.rm_type in text and "deepscaler" in text and "</think>" in text and "<think>" in text
    assert get_recipe(exp.model.recipe).display_name in text
    assert ("built-in deepscaler reward" not in text) and ("内置 deepscaler 奖励" not in text)


def test_the_served_page_shows_that_step1_text():
    from html import escape

    from fastapi.testclient import TestClient

    from lab.web.app import create_app

    page = TestClient(create_app(), base_url="http://127.0.0.1").get("/")
    assert page.status_code == 200 and escape(_step1("en")) in page.text.replace("&#39;", "&#x27;")


@pytest.mark.parametrize("lang", LANGS)
def test_the_recipe_notes_say_why_its_reward_is_math(lang):
    recipe = get_recipe(new_experiment().model.recipe)
    _, notes = recipe.texts(lang)
    assert any("math" in n and "</think>" in n and "deepscaler" in n for n in notes), notes


@pytest.mark.parametrize("lang", LANGS)
@pytest.mark.parametrize("doc", ["tutorial.md", "hooks.md"])
def test_the_docs_say_math_for_a_non_reasoning_model_and_deepscaler_for_a_reasoning_one(lang, doc):
    text = (REPO_ROOT / "docs" / lang / doc).read_text()
    assert "`math`" in text and "`deepscaler`" in text and "`<think>…</think>`" in text
    assert "GLM-4-9B" in text
    assert "built-in `deepscaler` reward" not in text and "内置 `deepscaler` 奖励" not in text
