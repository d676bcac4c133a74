"""Import of hand-written launch scripts (tests/fixtures/launch_scripts, in the style of slime's
scripts/run-*.sh): B against the closest recipe as A, unknown flags listed in the extra-flags field,
import then render gives the script's flags back; bad scripts name their line and change nothing."""
from __future__ import annotations

from pathlib import Path

import pytest

from lab.import_script import ScriptImportError, _same, _split, import_script
from lab.render import render_all
from lab.runtime_verdict import runtime_argv

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "launch_scripts"
CASES = {
    "run-glm4-9B.sh": ("glm4-9b", "disaggregated", ["--lr-warmup-iters"]),
    "run-glm4.5-355B-A32B-pd.sh": ("glm4.7", "colocated", []),
    "run-qwen3.5-27B-external.sh": ("qwen3.8-27b", "external", ["--update-weight-transport"]),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_import_opens_as_b_against_the_closest_recipe_with_unknown_flags_listed(name):
    recipe, ownership, unknown = CASES[name]
    result = import_script((FIXTURES / name).read_text())
    assert result.a.model.recipe == result.b.model.recipe == recipe
    assert result.b.placement.ownership == ownership
    assert result.unknown == unknown
    text = (FIXTURES / name).read_text().splitlines()
    for flag in unknown:  # each unknown flag is listed with the line that names it
        assert flag in text[result.lines[flag] - 1]
    for flag in unknown:
        assert flag in result.b.advanced.extra_flags
    assert result.a != result.b


@pytest.mark.parametrize("name", sorted(CASES))
def test_import_then_render_reproduces_the_scripts_flags(name):
    result = import_script((FIXTURES / name).read_text())
    rendered = dict(_split(runtime_argv(result.b)))
    model_flags = {f for f, _ in _split(result.script.model_args)}
    sh = render_all(result.b)["experiment.sh"]
    for flag, values in _split(result.script.argv):
        if flag in model_flags:
            continue
        if flag == "--prefill-num-servers":  # PD is written as the prefill group of sglang.yaml
            assert "worker_type: prefill" in sh
            continue
        assert _same(rendered.get(flag), values), (flag, values, rendered.get(flag))


def test_pd_import_fills_the_pd_fields():
    b = import_script((FIXTURES / "run-glm4.5-355B-A32B-pd.sh").read_text()).b
    assert b.serving.pd.enabled and b.serving.pd.prefill_engines == 1 and b.serving.pd.rdma_devices == ["mlx5_0"]
    assert b.placement.train_gpus == 64 and b.resources.ep == 16 and b.corrections.tis


@pytest.mark.parametrize("text,line", [
    ("#!/bin/bash\nARGS=(\n  --num-rollout 3\n", 2),                      # array never closed
    ("#!/bin/bash\nX='open quote\npython3 train.py\n", 2),                  # shell syntax it cannot read
    ("#!/bin/bash\necho hello\n", 2),                                       # no train.py command
    ("#!/bin/bash\npython3 train.py \\\n  --num-rollout 2 \\\n  --rollout-batch-size\n", 4),  # a flag missing its value
    ("#!/bin/bash\nA=(\n  --num-rollout three\n)\npython3 train.py ${A[@]}\n", 3),  # a value of the wrong type
])
def test_a_script_it_cannot_read_names_the_line(text, line):
    with pytest.raises(ScriptImportError) as exc:
        import_script(text)
    assert exc.value.line == line and f"line {line}" in str(exc.value)


def test_import_executes_nothing(tmp_path):
    marker = tmp_path / "ran"
    text = f"#!/bin/bash\ntouch {marker}\nX=$(touch {marker})\npython3 train.py --num-rollout 2 $(touch {marker})\n"
    result = import_script(text)
    assert not marker.exists() and result.b.task.num_rollout == 2


def test_cli_import_prints_b_against_a_and_refuses_a_bad_script(tmp_path, capsys):
    import json

    from lab.cli import main

    assert main(["import", str(FIXTURES / "run-glm4-9B.sh")]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["a"] == "glm4-9b" and doc["unknown_flags"] == ["--lr-warmup-iters"]
    bad = tmp_path / "bad.sh"
    bad.write_text("#!/bin/bash\nARGS=(\n --num-rollout 3\n")
    assert main(["import", str(bad)]) == 1
    assert "line 2" in capsys.readouterr().err


def test_page_load_of_a_launch_script_opens_b_against_a_and_a_bad_one_changes_nothing():
    from fastapi.testclient import TestClient

    from lab.app import create_app

    client = TestClient(create_app(), base_url="http://127.0.0.1")
    start = client.post("/api/workspace", json={"action": {"type": "view"}}).json()["workspace"]
    r = client.post("/api/workspace", json={"workspace": start, "action": {
        "type": "import_script", "text": (FIXTURES / "run-glm4.5-355B-A32B-pd.sh").read_text()}})
    assert r.status_code == 200
    view = r.json()
    assert view["workspace"]["a"]["model"]["recipe"] == "glm4.7" and view["workspace"]["b"]["serving"]["pd"]["enabled"]
    assert view["ab_diff"]  # the differences show
    roles = [s["role"] for s in view["placement_plan"]]
    assert "prefill" in roles and "decode" in roles and roles.count("trainer") == 64
    bad = client.post("/api/workspace", json={"workspace": start, "action": {
        "type": "import_script", "text": "#!/bin/bash\npython3 train.py --rm-type 'math\n"}})
    assert bad.status_code == 422 and "line 2" in bad.json()["detail"][0]["msg"]
