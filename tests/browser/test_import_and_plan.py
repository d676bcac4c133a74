"""Load of a hand-written launch script, and the Placement step's Ray plan, as a user sees them."""
from __future__ import annotations

from pathlib import Path

import pytest
from conftest import act, assert_clean, wait_until

pytestmark = pytest.mark.browser
SCRIPTS = Path(__file__).resolve().parents[1] / "fixtures" / "launch_scripts"


def test_a_launch_script_loads_as_b_against_its_recipe_and_the_plan_shows_its_engines(new_page):
    page = new_page()
    act(page, lambda: page.set_input_files("#load-json", str(SCRIPTS / "run-glm4.5-355B-A32B-pd.sh")))
    assert page.locator('[data-field="model.recipe"]').input_value() == "glm4.7"
    assert page.locator('[data-field="serving.pd.enabled"]').is_checked()
    assert page.locator("#restore-a").is_enabled()  # A is the recipe, B the script
    assert "serving.pd.enabled" in page.locator("#ab-diff").inner_html() or page.locator("#ab-diff").text_content().strip()
    plan = page.locator("#placement-plan").text_content()
    assert "trainer ranks 56-63" in plan and "prefill engine 0" in plan and "decode engine" in plan and "router" in plan
    assert_clean(page)


def test_a_script_it_cannot_read_names_the_line_and_changes_nothing(new_page):
    page = new_page()
    before = page.evaluate("localStorage.getItem('slime-lab.workspace')")
    page.set_input_files("#load-json", files=[
        {"name": "run-bad.sh", "mimeType": "text/x-shellscript", "buffer": b"#!/bin/bash\nARGS=(\n  --num-rollout 3\n"}])
    wait_until(page, "document.querySelector('#error').textContent.includes('run-bad.sh')")
    assert "line 2" in page.locator("#error").inner_text()
    assert page.evaluate("localStorage.getItem('slime-lab.workspace')") == before
    page.lab.errors.clear()  # the 422 is logged by Chromium as a failed resource load
    assert_clean(page)


def test_a_script_chosen_with_the_spec_it_sources_imports_as_that_custom_model(new_page):
    page = new_page()
    corpus = SCRIPTS / "corpus"
    act(page, lambda: page.set_input_files("#load-json", [str(corpus / "models" / "qwen3-4B.sh"),
                                                          str(corpus / "run-10-qwen3-4B.sh")]))
    spec_args = page.locator('[data-field="model.spec_args"]').input_value()
    assert "--num-layers 36" in spec_args and "--hidden-size 2560" in spec_args  # Qwen3-4B, not a recipe's model
    assert "--use-kl-loss" in page.locator('[data-field="advanced.unset_flags"]').input_value()  # commented out there
    assert page.locator("#restore-a").is_enabled()
    report = page.locator("#import-report")  # the differences from the script's command, with reasons
    assert report.is_visible() and "--train-backend megatron added" in report.locator("ul").text_content()
    assert_clean(page)
