"""Compare A / B, repair previews, Load JSON and Source & validation scope, as a user drives them."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from conftest import act, assert_clean, reveal, wait_until

from lab.core.recipes import REPO_ROOT

pytestmark = pytest.mark.browser
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def field(page, path: str):
    return page.locator(f'[data-field="{path}"]')


def value(page, path: str) -> str:
    return field(page, path).input_value()


def fill(page, path: str, text: str) -> None:
    reveal(page, path)
    act(page, lambda: field(page, path).fill(text) or field(page, path).press("Enter"))


def test_pd_repair_preview_is_applied_as_one_change_and_one_undo_restores_all_its_fields(new_page):
    page = new_page()
    act(page, lambda: field(page, "model.recipe").select_option("glm4.7-flash"))
    act(page, lambda: field(page, "serving.pd.enabled").check())
    page.locator("#repairs > summary").click()
    preview = page.locator('details.repair[data-repair-id="SGL-4:pd_grow_shared"]')
    assert preview.get_attribute("open") is not None
    # before anything is applied: field changes, allocation, what is still required
    rows = preview.locator("table.repair-changes tr[data-path]")
    assert set(rows.evaluate_all("rs => rs.map(r => r.dataset.path)")) >= {"placement.nodes", "placement.train_gpus", "placement.rollout_gpus"}
    assert preview.locator('[data-alloc="nodes"] dd').inner_text() == "1 → 2"
    assert preview.locator('[data-req="rdma_devices"]').count() == 1
    assert value(page, "placement.nodes") == "1"
    act(page, lambda: preview.locator("[data-apply-repair]").click())
    assert (value(page, "placement.nodes"), value(page, "placement.train_gpus"), value(page, "placement.rollout_gpus")) == ("2", "16", "16")
    assert value(page, "serving.pd.rdma_devices") == "", "RDMA devices are never invented"
    assert page.locator('details.repair[data-repair-id="SGL-4:pd_grow_shared"]').count() == 0
    act(page, lambda: page.locator("#undo").click())
    assert (value(page, "placement.nodes"), value(page, "placement.train_gpus"), value(page, "placement.rollout_gpus")) == ("1", "8", "8")
    assert field(page, "serving.pd.enabled").is_checked(), "one undo takes back the repair only"
    assert page.locator('details.repair[data-repair-id="SGL-4:pd_grow_shared"]').count() == 1
    assert_clean(page)


PRIVATE = {"paths.save": "/home/alice/secret-ckpt", "serving.pd.rdma_devices": "mlx5_alice"}


def test_ab_share_link_opens_in_a_fresh_context_with_no_private_value(new_page, lab_url):
    page = new_page()
    act(page, lambda: field(page, "serving.pd.enabled").check())  # RDMA devices are folded while PD is off
    for path, text in PRIVATE.items():
        fill(page, path, text)
    page.locator("#ab > summary").click()
    act(page, lambda: page.locator("#save-a").click())
    fill(page, "task.num_rollout", "7")
    act(page, lambda: field(page, "placement.scheduling").select_option("async"))
    diff = page.eval_on_selector_all("#ab-diff tr[data-path]", "rs => rs.map(r => r.dataset.path)")
    assert {"task.num_rollout", "placement.scheduling", "placement.ownership"} <= set(diff) or \
        {"task.num_rollout", "placement.scheduling"} <= set(diff)
    page.locator("#copy-share-ab").click()
    link = page.locator("#share-link").input_value()
    assert "#s=" in link and not any(v in link for v in PRIVATE.values())

    other = new_page(link[len(lab_url):])  # a fresh browser context: its own storage
    assert value(other, "task.num_rollout") == "7" and value(other, "placement.scheduling") == "async"
    stored = other.evaluate("localStorage.getItem('slime-lab.workspace')")
    html = other.content()
    for v in PRIVATE.values():
        assert v not in stored and v not in html and v not in other.url
    assert json.loads(stored)["a"]["task"]["num_rollout"] != 7, "A comes from the link's A side"
    other.locator("#ab > summary").click()
    assert "task.num_rollout" in other.eval_on_selector_all("#ab-diff tr[data-path]", "rs => rs.map(r => r.dataset.path)")
    assert_clean(page)
    assert_clean(other)


def test_schema1_file_is_loaded_as_one_change_then_undone(new_page):
    page = new_page()
    fill(page, "paths.save", "/home/bob/ckpt")
    before = page.evaluate("localStorage.getItem('slime-lab.workspace')")
    act(page, lambda: page.set_input_files("#load-json", str(FIXTURES / "schema1_export.json")))
    assert value(page, "model.recipe") == "glm4.7-flash" and value(page, "placement.ownership") == "colocated"
    assert value(page, "paths.hf_checkpoint") == "/mnt/team/GLM-4.7-Flash"
    assert value(page, "paths.save") == "/home/bob/ckpt", "private paths the file lacks are kept"
    assert page.locator("#error").is_hidden()
    act(page, lambda: page.locator("#undo").click())
    assert value(page, "model.recipe") == "glm4-9b" and value(page, "paths.save") == "/home/bob/ckpt"
    assert page.evaluate("localStorage.getItem('slime-lab.workspace')") != before  # redo entry now
    assert page.locator("#redo").is_enabled()
    assert_clean(page)


def test_a_bad_file_is_named_and_changes_nothing(new_page):
    page = new_page()
    fill(page, "task.num_rollout", "5")
    before = page.evaluate("localStorage.getItem('slime-lab.workspace')")
    page.set_input_files("#load-json", files=[
        {"name": "broken.json", "mimeType": "application/json", "buffer": b'{"placement": {"ownrship": "external"}}'}])
    wait_until(page, "document.querySelector('#error').textContent.includes('broken.json')")
    msg = page.locator("#error").inner_text()
    assert "broken.json" in msg and "ownrship" in msg and "unknown field" in msg
    assert page.evaluate("localStorage.getItem('slime-lab.workspace')") == before
    big = b"{" + b" " * (300 * 1024) + b"}"
    page.set_input_files("#load-json", files=[{"name": "huge.json", "mimeType": "application/json", "buffer": big}])
    wait_until(page, "document.querySelector('#error').textContent.includes('huge.json')")
    assert "bytes" in page.locator("#error").inner_text()
    assert page.evaluate("localStorage.getItem('slime-lab.workspace')") == before and value(page, "task.num_rollout") == "5"
    page.lab.errors.clear()  # the 422 of the first file is logged by Chromium as a failed resource load
    assert_clean(page)


def test_source_scope_and_image_panels_show_the_real_hashes_and_say_what_is_not_checked(new_page):
    page = new_page()
    page.locator("#provenance > summary").click()
    row = page.locator('#provenance tr[data-source="recipe"]')
    sha = hashlib.sha256((REPO_ROOT / "recipes" / "glm4-9b.yaml").read_bytes()).hexdigest()
    assert sha in row.inner_text()
    assert page.locator("#provenance [data-not]").count() == 2
    assert page.locator("#provenance tr.selected").count() == 1
    info = page.locator("#image-info").text_content()
    assert "13.0" in info and "0.5.15" in info and "certifies neither" in info
    assert "80 GiB" in page.locator("#hw-context").text_content()
    act(page, lambda: field(page, "install.image").select_option("slimerl/slime:0.1.0-cu130-blackwell"))
    assert "178 GiB" in page.locator("#hw-context").text_content()
    assert_clean(page)


def test_the_first_experiments_cp_refusal_repairs_to_the_nearest_accepted_layout(new_page):
    page = new_page()  # GLM-4-9B at TP 2, CP 2: CP needs Transformer Engine, absent here
    assert value(page, "resources.cp") == "2" and value(page, "resources.tp") == "2"
    page.locator("#repairs > summary").click()
    preview = page.locator('details.repair[data-repair-id="MEG-CP:layout"]')
    rows = preview.locator("table.repair-changes tr[data-path]")
    assert rows.evaluate_all("rs => rs.map(r => r.dataset.path)") == ["resources.cp"]  # TP 2 stays
    assert "TP 2, PP 1, CP 1, EP 1" in preview.inner_text()  # its title names the layout it sets
    act(page, lambda: preview.locator("[data-apply-repair]").click())
    assert (value(page, "resources.cp"), value(page, "resources.tp")) == ("1", "2")
    assert page.locator('details.repair[data-repair-id="MEG-CP:layout"]').count() == 0
    act(page, lambda: page.locator("#undo").click())
    assert value(page, "resources.cp") == "2"
    assert_clean(page)
