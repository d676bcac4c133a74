"""The Quick Start page, driven as a user drives it, in Debian's Chromium.

Each test ends with `assert_clean`: no request left the origin, no console or page error.
"""
from __future__ import annotations

import json

import pytest
from conftest import act, assert_clean, reveal, wait_ready

from lab.core.experiment import PRIVATE_FIELDS, Experiment
from lab.core.recipes import all_recipes

pytestmark = pytest.mark.browser


def field(page, path: str):
    return page.locator(f'[data-field="{path}"]')


def value(page, path: str) -> str:
    return field(page, path).input_value()


def choose(page, path: str, val: str) -> None:
    act(page, lambda: field(page, path).select_option(val))


def layout_signature(page) -> dict:
    return page.evaluate("""() => {
        const cells = [...document.querySelectorAll('#layout .cell')];
        const count = (c) => cells.filter((x) => x.classList.contains(c)).length;
        return {nodes: document.querySelectorAll('#layout .ray-box .node').length,
                train: count('train'), rollout: count('rollout'), shared: count('shared'),
                external: count('external'), idle: count('idle'),
                engines: document.querySelectorAll('#layout .eng-start').length,
                cpu: !!document.querySelector('#layout .note')};
    }""")


def stored_workspace(page) -> dict:
    return json.loads(page.evaluate("localStorage.getItem('slime-lab.workspace')"))


def test_every_model_changes_layout_and_parallelism(new_page):
    page = new_page()
    recipes = all_recipes()
    assert len(recipes) >= 7
    seen = {}
    for name, recipe in recipes.items():
        if value(page, "model.recipe") != name:
            choose(page, "model.recipe", name)
        par = recipe.parallel
        assert [value(page, f"resources.{k}") for k in ("tp", "pp", "cp", "ep")] == \
            [str(par.tp), str(par.pp), str(par.cp), str(par.ep)], name
        assert value(page, "placement.engine_gpus") == str(recipe.rollout.engine_gpus), name
        assert page.locator('[data-diag-value="tp"]').text_content() == str(par.tp)
        sig = layout_signature(page)
        if recipe.training.gpus_per_node == 0:
            assert sig["cpu"], "the CPU recipe says it places no GPUs"
        else:
            assert sig["nodes"] == min(recipe.training.nodes, 64) or sig["nodes"] >= 1
            kind = "shared" if recipe.placement == "colocated" else "rollout"
            assert sig[kind] > 0, (name, sig)
        seen[name] = sig
    distinct = {json.dumps(s, sort_keys=True) for s in seen.values()}
    assert len(distinct) >= 5, seen
    assert_clean(page)


def test_async_from_colocated_moves_pools_and_one_undo_restores_both(new_page):
    page = new_page()
    choose(page, "model.recipe", "glm4.7-flash")
    assert value(page, "placement.ownership") == "colocated"
    assert layout_signature(page)["shared"] > 0
    choose(page, "placement.scheduling", "async")
    assert value(page, "placement.ownership") == "disaggregated"
    sig = layout_signature(page)
    assert sig["shared"] == 0 and sig["train"] > 0 and sig["rollout"] > 0
    # one undo (the keyboard shortcut, focus outside a text field) restores both fields
    page.locator("#step-2 h2").click()
    act(page, lambda: page.keyboard.press("Control+z"))
    assert value(page, "placement.scheduling") == "sync"
    assert value(page, "placement.ownership") == "colocated"
    assert layout_signature(page)["shared"] > 0
    act(page, lambda: page.keyboard.press("Control+Shift+z"))
    assert value(page, "placement.ownership") == "disaggregated"
    assert_clean(page)


def test_the_loop_strip_follows_scheduling_and_the_recipes_engine_in_both_languages(new_page):
    page = new_page()
    batch = page.locator('.loop [data-loop="batch"]')
    assert batch.text_content() == "Rollout batch: the whole rollout, then train"
    choose(page, "placement.scheduling", "async")
    assert batch.text_content() == "One rollout ahead: the next samples while this one trains"
    choose(page, "model.recipe", "tiny-cpu")
    assert page.locator('.loop [data-loop="update"]').text_content() == "Embedded torch trainer: policy update"
    act(page, lambda: page.locator("#lang").select_option("zh"))
    assert page.locator('.loop [data-loop="sample"]').text_content() == "内置引擎生成回答"
    assert_clean(page)


def test_reload_keeps_choices_history_and_a(new_page):
    page = new_page()
    choose(page, "model.recipe", "qwen3.8-27b")
    page.locator("#ab > summary").click()
    act(page, lambda: page.locator("#save-a").click())
    act(page, lambda: field(page, "task.num_rollout").fill("7") or field(page, "task.num_rollout").press("Enter"))
    act(page, lambda: page.locator('[data-field="corrections.tis"]').check())
    before = stored_workspace(page)
    page.reload()
    wait_ready(page)
    assert value(page, "model.recipe") == "qwen3.8-27b"
    assert value(page, "task.num_rollout") == "7"
    assert field(page, "corrections.tis").is_checked()
    assert stored_workspace(page) == before
    assert page.locator("#undo").is_enabled()
    page.locator("#ab > summary").click()
    diff_paths = page.eval_on_selector_all("#ab-diff tr[data-path]", "rows => rows.map(r => r.dataset.path)")
    assert "task.num_rollout" in diff_paths and "corrections.tis" in diff_paths
    act(page, lambda: page.locator("#undo").click())
    assert not field(page, "corrections.tis").is_checked()
    assert_clean(page)


def test_the_page_sends_only_the_tops_of_its_history_and_keeps_the_whole_of_it(new_page):
    """Each request carries the last two entries of each stack and their lengths; the stacks the
    page stores after edits, undos and redos are the ones the server computes from the whole history."""
    from fastapi.testclient import TestClient

    from lab.web.app import create_app

    page = new_page()
    rollouts = [str(n) for n in range(11, 17)]
    for n in rollouts:
        act(page, lambda n=n: field(page, "task.num_rollout").fill(n) or field(page, "task.num_rollout").press("Enter"))
    for _ in range(3):
        act(page, lambda: page.locator("#undo").click())
    act(page, lambda: page.locator("#redo").click())
    assert value(page, "task.num_rollout") == "14"
    bodies = [body for _, body in page.lab.actions]  # by POST or over the socket
    sent = bodies[-1]
    assert sent["history"] == {"undo": 3, "redo": 3}  # what the redo was sent from
    assert len(sent["workspace"]["undo"]) == 2 and len(sent["workspace"]["redo"]) == 2
    stored = stored_workspace(page)
    assert [len(stored["undo"]), len(stored["redo"])] == [4, 2]

    client = TestClient(create_app(), base_url="http://127.0.0.1")  # the same actions, whole history
    ws = client.post("/api/workspace", json={"workspace": None, "action": {"type": "view"}}).json()["workspace"]
    for body in bodies:
        ws = client.post("/api/workspace", json={"workspace": ws, "action": body["action"]}).json()["workspace"]
    assert stored == ws
    assert page.locator("#undo").get_attribute("title") == "Undo: Rollout rounds"  # labelled from the second top
    assert_clean(page)


def _private_controls(page) -> list[str]:
    return page.eval_on_selector_all("[data-field]", "els => els.map(e => e.dataset.field)")


def test_share_link_reproduces_architecture_without_private_fields(new_page, lab_url):
    page = new_page()
    choose(page, "model.recipe", "glm4.7")
    choose(page, "placement.ownership", "external")
    act(page, lambda: page.locator('[data-field="serving.pd.enabled"]').check())
    # the switches that unfold the other private fields (hooks, queue dir, draft head, eval data)
    choose(page, "task.kind", "custom")
    for switch in ("rollout.queue", "serving.eagle.enabled", "evaluation.enabled"):
        reveal(page, switch)
        act(page, lambda: page.locator(f'[data-field="{switch}"]').check())
    choose(page, "serving.eagle.head", "separate")
    paths = _private_controls(page)
    private = sorted(p for p in paths if p in PRIVATE_FIELDS)
    assert sorted(PRIVATE_FIELDS) == private, "every private field has a control"
    for i, path in enumerate(private):
        marker = f"MARKER{i}x" if "addrs" not in path else f"marker{i}.example:30000"
        reveal(page, path)
        el = field(page, path)
        act(page, lambda: (el.fill(marker), el.press("Enter")))
    ws = stored_workspace(page)
    assert "MARKER0x" in json.dumps(ws)  # the markers are in the local workspace ...
    link = page.locator("#share-link").input_value()
    assert link.startswith(lab_url + "/#s=")
    from lab.core.share import decode_link

    decoded = json.dumps(decode_link(link))
    assert "MARKER" not in decoded and "marker" not in decoded  # ... and never in the link
    expected = ws["b"]
    assert_clean(page)

    other = new_page(link.removeprefix(lab_url))
    assert "#s=" not in other.url, "the fragment is cleared after opening"
    for path in ("model.recipe", "placement.ownership", "resources.tp", "resources.pp", "resources.ep",
                 "placement.engine_gpus", "serving.pd.enabled", "placement.nodes"):
        got = other.evaluate("p => JSON.parse(localStorage.getItem('slime-lab.workspace')).b", None)
        cur = got
        exp_cur = expected
        for part in path.split("."):
            cur, exp_cur = cur[part], exp_cur[part]
        assert cur == exp_cur, path
    opened = json.dumps(stored_workspace(other))
    assert "MARKER" not in opened and "marker" not in opened
    for el in other.locator("[data-field]").all():
        assert "MARKER" not in (el.input_value() if el.get_attribute("type") != "checkbox" else "")
    # opening was ONE undoable change
    assert len(stored_workspace(other)["undo"]) == 1
    act(other, lambda: other.locator("#undo").click())
    assert value(other, "model.recipe") == Experiment().model.recipe or value(other, "model.recipe") == "glm4-9b"
    assert_clean(other)


def test_downloaded_experiment_sh_equals_render_all(new_page, tmp_path):
    from lab.web.export import experiment_files

    page = new_page()
    choose(page, "model.recipe", "deepseek-r1")
    page.locator("#gpu-panel > summary").click()
    act(page, lambda: page.locator('[data-field="resources.cpu_adam"]').uncheck())
    exp = Experiment.model_validate(stored_workspace(page)["b"])
    files = experiment_files(exp)
    for name in ("experiment.sh", "experiment.json"):
        with page.expect_download() as dl:
            page.locator(f'[data-download="{name}"]').click()
        target = tmp_path / name
        dl.value.save_as(target)
        assert target.read_bytes() == files[name].encode("utf-8"), name
    assert "--optimizer-cpu-offload" not in files["experiment.sh"]
    assert_clean(page)


def test_walkthrough_numbers_and_adopt_is_one_undoable_change(new_page):
    page = new_page()
    act(page, lambda: field(page, "task.n_samples_per_prompt").fill("4") or field(page, "task.n_samples_per_prompt").press("Enter"))
    before = stored_workspace(page)["b"]
    page.locator("#walk > summary").click()
    page.locator('.walk-stage[data-walk="4"]').click()
    text = page.locator("#walk-panel").inner_text()
    assert "0.5" in text and "√(2/7)" in text and "±0.94" in text and "0.5345" in text
    assert "+0.94" in text and "-0.94" in text
    assert stored_workspace(page)["b"] == before, "the example leaves the saved experiment untouched"
    act(page, lambda: page.locator("#walk-adopt").click())
    assert value(page, "task.n_samples_per_prompt") == "8"
    act(page, lambda: page.locator("#undo").click())
    assert stored_workspace(page)["b"] == before
    assert_clean(page)


def test_bad_value_is_refused_with_the_field_named_and_state_kept(new_page):
    page = new_page()
    before = stored_workspace(page)
    el = field(page, "placement.nodes")
    el.fill("0")
    el.press("Enter")
    page.wait_for_selector("#error:not([hidden])")
    msg = page.locator("#error").inner_text()
    assert "placement.nodes" in msg
    assert stored_workspace(page) == before
    assert value(page, "placement.nodes") == str(before["b"]["placement"]["nodes"])
    # a 422 is logged by Chromium as a failed resource load: that one is expected
    page.lab.errors[:] = [e for e in page.lab.errors if "422" not in e]
    assert_clean(page)


def test_the_memory_panel_shows_a_few_mib_as_under_a_tenth_of_a_gib_never_zero(new_page):
    page = new_page()
    rows = page.evaluate("[...document.querySelectorAll('#memory tbody tr')]"
                         ".map((tr) => [...tr.querySelectorAll('td')].map((td) => td.textContent))")
    cublas = [r for r in rows if "cuBLAS" in r[0]]
    assert cublas and all(r[-1] == "< 0.1" for r in cublas), rows
    assert not [r for r in rows if r[-1] in ("0.0", "0")
                and "Adam" not in r[0]], rows  # Adam reads 0 only when CPU Adam holds it in host memory
    assert_clean(page)


def test_files_rebuilt_from_line_patches_equal_the_rendered_files(new_page):
    """After the first answer, the files come as line patches against the page's copy (and the parts
    it holds unchanged are left out): after edits, a file that appears (external engines bring
    serving-reference.sh), undo, redo and a language switch, every preview is the file the server
    renders for the stored experiment, byte for byte."""
    from lab.web.export import experiment_files

    page = new_page()
    answers = page.lab.answers  # by POST or over the socket

    def previews() -> dict[str, str]:
        return page.evaluate("""() => Object.fromEntries([...document.querySelectorAll('details.preview')]
            .filter((d) => !d.hidden).map((d) => [d.dataset.file, d.querySelector('pre').textContent]))""")

    def check() -> None:
        files = experiment_files(Experiment.model_validate(stored_workspace(page)["b"]))
        assert previews() == files

    steps = [
        lambda: field(page, "task.num_rollout").fill("37") or field(page, "task.num_rollout").press("Enter"),
        lambda: field(page, "placement.ownership").select_option("external"),
        lambda: page.locator("#undo").click(),
        lambda: page.locator("#redo").click(),
        lambda: field(page, "model.recipe").select_option("glm4.7-flash"),
        lambda: page.locator("#lang").select_option("zh"),
        lambda: field(page, "task.num_rollout").fill("38") or field(page, "task.num_rollout").press("Enter"),
    ]
    for step in steps:
        act(page, step)
        check()
    patched = [a for a in answers if "files" in a["patch"]]
    assert len(patched) >= len(steps) - 2 and all("files" not in a for a in patched)
    assert any(a["same"] for a in answers)
    assert_clean(page)
