"""`slime-lab`: each command, its exit codes, errors that name the field, nothing written on error,
and the same bytes from the CLI, render_all and POST /api/render."""
from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from lab.core.recipes import REPO_ROOT, all_recipes
from lab.rules.dependents import apply_change, new_experiment
from lab.web import cli
from lab.web.app import create_app
from lab.web.export import experiment_files


def slime_lab(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    return subprocess.run([sys.executable, "-m", "lab.web.cli", *args], cwd=REPO_ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


def main(capsys, *args: str) -> tuple[int, str, str]:
    try:
        code = cli.main(list(args))
    except SystemExit as exc:
        code = exc.code
    out = capsys.readouterr()
    return code, out.out, out.err


def export(tmp_path: Path, exp, bare: bool = False) -> Path:
    path = tmp_path / ("bare.json" if bare else "experiment.json")
    path.write_text(json.dumps(exp.model_dump(mode="json")) if bare else experiment_files(exp)["experiment.json"])
    return path


def test_render_via_cli_equals_render_all_equals_api_bytes(tmp_path):
    out = slime_lab("render", "--model", "glm4-9b", "-o", str(tmp_path / "out"))
    assert out.returncode == 0, out.stderr
    expected = experiment_files(new_experiment("glm4-9b"))
    api = TestClient(create_app(), base_url="http://127.0.0.1").post(
        "/api/render", json={"experiment": new_experiment("glm4-9b").model_dump(mode="json")}).json()["files"]
    written = {p.name: p.read_bytes() for p in (tmp_path / "out").iterdir()}
    assert written == {k: v.encode() for k, v in expected.items()} == {k: v.encode() for k, v in api.items()}
    assert os.access(tmp_path / "out" / "experiment.sh", os.X_OK)


def test_recipes_lists_one_line_per_recipe_name_first(capsys):
    code, out, _ = main(capsys, "recipes")
    assert code == 0
    assert [line.split()[0] for line in out.splitlines()] == list(all_recipes())


def test_render_set_applies_dependent_changes(capsys, tmp_path):
    code, _, err = main(capsys, "render", "--model", "glm4-9b", "--set", "placement.ownership=colocated", "-o", str(tmp_path))
    assert code == 0, err
    exp = json.loads((tmp_path / "experiment.json").read_text())["experiment"]
    assert exp["placement"]["ownership"] == "colocated"
    assert exp["placement"]["train_gpus"] == exp["placement"]["rollout_gpus"] == 8


def test_render_set_parses_json_values_else_strings(capsys, tmp_path):
    code, _, err = main(capsys, "render", "--model", "glm4-9b", "--set", "task.num_rollout=7",
                        "--set", "paths.save=/ck/my run", "--set", 'placement.external_engine_addrs=["h:1"]', "-o", str(tmp_path))
    assert code == 0, err
    exp = json.loads((tmp_path / "experiment.json").read_text())["experiment"]
    assert (exp["task"]["num_rollout"], exp["paths"]["save"]) == (7, "/ck/my run")
    assert exp["placement"]["external_engine_addrs"] == ["h:1"]


@pytest.mark.parametrize("args, needle", [
    (["--model", "no-such-model"], "unknown model 'no-such-model'"),
    (["--model", "glm4-9b", "--set", "placement.bogus=1"], "placement.bogus"),
    (["--model", "glm4-9b", "--set", "task.num_rollout=0"], "task.num_rollout"),
    (["--model", "glm4-9b", "--set", "no-equals-sign"], "field.path=value"),
])
def test_render_errors_name_the_field_exit_2_and_write_nothing(capsys, tmp_path, args, needle):
    out_dir = tmp_path / "out"
    code, _, err = main(capsys, "render", *args, "-o", str(out_dir))
    assert code == 2 and needle in err
    assert not out_dir.exists()


def test_render_reads_an_export_or_a_bare_experiment(capsys, tmp_path):
    exp = new_experiment("qwen3.8-27b")
    for source in (export(tmp_path, exp), export(tmp_path, exp, bare=True)):
        out_dir = tmp_path / source.stem
        code, _, err = main(capsys, "render", str(source), "-o", str(out_dir))
        assert code == 0, err
        assert (out_dir / "experiment.sh").read_text() == experiment_files(exp)["experiment.sh"]


def test_validate_exits_0_without_errors_and_1_with_errors(capsys, tmp_path):
    ok = export(tmp_path, new_experiment("tiny-cpu"))  # GPU recipes: the runtime's pending Megatron refusal (#12)
    assert main(capsys, "validate", str(ok))[0] == 0
    data = new_experiment("glm4-9b").model_dump(mode="json")
    data["resources"]["tp"] = 3
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(data))
    code, out, _ = main(capsys, "validate", str(bad))
    assert code == 1 and re.search(r"^error\s+PAR-1", out, re.M)


def test_validate_malformed_json_names_line_and_column(capsys, tmp_path):
    path = tmp_path / "broken.json"
    path.write_text('{\n  "task": {,}\n}')
    code, _, err = main(capsys, "validate", str(path))
    assert code == 2 and "line 2, column 12" in err


def test_validate_unknown_field_names_it(capsys, tmp_path):
    path = tmp_path / "typo.json"
    path.write_text(json.dumps({"placement": {"nodez": 2}}))
    code, _, err = main(capsys, "validate", str(path))
    assert code == 2 and "placement.nodez" in err


def test_schema_prints_the_json_schema_with_private_marks(capsys):
    code, out, _ = main(capsys, "schema")
    assert code == 0 and '"x-private": true' in out and json.loads(out)["x-schema-version"] == 2


def test_share_link_strips_private_fields_and_opens_back(capsys, tmp_path):
    exp = new_experiment("glm4-9b")
    exp, _ = apply_change(exp, "paths.save", "/secret/ckpt")
    code, link, err = main(capsys, "share", str(export(tmp_path, exp)))
    assert code == 0, err
    assert "/secret" not in link
    code, out, _ = main(capsys, "share", "--open", link.strip())
    choices = json.loads(out)
    assert code == 0 and choices["model"]["recipe"] == "glm4-9b" and "/secret/ckpt" not in out


def test_share_open_bad_link_exits_2(capsys):
    code, _, err = main(capsys, "share", "--open", "http://x/#s=not-a-link")
    assert code == 2 and "--open" in err


def test_no_arguments_serves_on_localhost(capsys, monkeypatch):
    seen = {}
    monkeypatch.setattr("uvicorn.run", lambda app, **kw: seen.update(app=app, **kw))
    code, out, _ = main(capsys)
    assert code == 0 and (seen["host"], seen["port"]) == ("127.0.0.1", 8765) and "http://127.0.0.1:8765/" in out
    app = TestClient(seen["app"], base_url="http://127.0.0.1:8765")
    assert app.get("/api/recipes").status_code == 200
    assert app.get("/api/recipes", headers={"host": "evil.example"}).status_code == 400
    assert app.get("/openapi.json").status_code == 404


def test_allow_host_and_openapi_are_passed_to_the_app(capsys, monkeypatch):
    seen = {}
    monkeypatch.setattr("uvicorn.run", lambda app, **kw: seen.update(app=app, **kw))
    code, _, err = main(capsys, "serve", "--host", "0.0.0.0", "--allow-host", "lab.internal", "--openapi")
    assert code == 0 and seen["host"] == "0.0.0.0" and "beyond this machine" in err
    app = TestClient(seen["app"], base_url="http://lab.internal")
    assert app.get("/openapi.json").status_code == 200
    assert app.get("/api/recipes", headers={"host": "192.0.2.7"}).status_code == 400


def test_serve_workers_gives_every_process_the_same_settings(capsys, monkeypatch):
    from lab.web.app import APP_SETTINGS_ENV, app_from_env

    seen = {}
    monkeypatch.setattr("uvicorn.run", lambda app, **kw: seen.update(app=app, **kw))
    monkeypatch.delenv(APP_SETTINGS_ENV, raising=False)
    code, _, _ = main(capsys, "serve", "--workers", "2", "--allow-host", "lab.internal", "--openapi")
    assert code == 0 and seen["workers"] == 2 and seen["factory"] is True
    module, name = seen["app"].split(":")  # uvicorn imports the factory in each worker process
    assert (module, name) == ("lab.web.app", "app_from_env")
    app = TestClient(app_from_env(), base_url="http://lab.internal")  # what a worker builds
    assert app.get("/openapi.json").status_code == 200
    assert app.get("/api/recipes", headers={"host": "192.0.2.7"}).status_code == 400
    assert main(capsys, "serve", "--workers", "0")[0] == 2  # refused with a message, nothing served


def test_bare_port_flag_serves_on_that_port(capsys, monkeypatch):
    seen = {}
    monkeypatch.setattr("uvicorn.run", lambda app, **kw: seen.update(app=app, **kw))
    code, out, _ = main(capsys, "--port", "9123")
    assert code == 0 and (seen["host"], seen["port"]) == ("127.0.0.1", 9123) and "http://127.0.0.1:9123/" in out


def test_serve_answers_http_and_prints_its_url():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "lab.web.cli", "serve", "--port", str(port)], cwd=REPO_ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert f"http://127.0.0.1:{port}/" in proc.stdout.readline()
        deadline = time.time() + 30
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/recipes", timeout=2) as r:
                    assert len(json.loads(r.read())) == len(all_recipes())
                    break
            except OSError:
                if time.time() > deadline:
                    raise
                time.sleep(0.2)
    finally:
        proc.terminate()  # our own child, by its PID
        proc.wait(timeout=10)


def test_validate_reads_a_schema1_export_like_the_page(capsys):
    fixture = REPO_ROOT / "tests" / "fixtures" / "schema1_export.json"
    code, out, err = main(capsys, "validate", str(fixture))
    assert code in (0, 1) and err == "" and "[resources.ep" in out  # loaded, migrated and checked


def _page_repairs(exp) -> list[dict]:
    from lab.core.workspace import Workspace

    client = TestClient(create_app(), base_url="http://127.0.0.1")
    r = client.post("/api/workspace", json={"workspace": Workspace(b=exp).model_dump(mode="json"), "action": {"type": "view"}})
    assert r.status_code == 200, r.text
    return r.json()["repairs"]


def test_repair_previews_the_pages_repairs_and_writes_the_repaired_experiment_on_request(tmp_path):
    exp = new_experiment("glm4-9b")  # CP 2: refused without Transformer Engine; the repair drops CP only
    src = export(tmp_path, exp)
    page = _page_repairs(exp)
    out = slime_lab("repair", str(src))
    assert out.returncode == 0, out.stderr
    shown = re.findall(r"^repair (\S+): (.*)$", out.stdout, re.M)
    assert shown == [(r["id"], r["title"]) for r in page] and shown
    assert "resources.cp: 2 -> 1" in out.stdout and not (tmp_path / "fixed.json").exists()
    fixed = tmp_path / "fixed.json"
    out = slime_lab("repair", str(src), "--apply", page[0]["id"], "-o", str(fixed))
    assert out.returncode == 0, out.stderr
    assert slime_lab("validate", str(fixed)).returncode == 0  # no error left
    again = cli.load_experiment_file(str(fixed))
    assert again.resources.cp == 1 and again.resources.tp == 2
    assert fixed.read_text() == experiment_files(again)["experiment.json"]  # the page's export format


def test_repair_with_an_unknown_id_names_the_repairs_and_writes_nothing(tmp_path):
    src = export(tmp_path, new_experiment("glm4-9b"))
    out = slime_lab("repair", str(src), "--apply", "SGL-4:pd_split", "-o", str(tmp_path / "x.json"))
    assert out.returncode == 2 and "MEG-CP:layout" in out.stderr and "Traceback" not in out.stderr
    assert not (tmp_path / "x.json").exists()
    out = slime_lab("repair", str(src), "--apply", "MEG-CP:layout")
    assert out.returncode == 2 and "-o" in out.stderr


def test_validate_fix_prints_the_findings_then_the_repairs(tmp_path):
    src = export(tmp_path, new_experiment("glm4-9b"))
    out = slime_lab("validate", str(src), "--fix")
    assert out.returncode == 1  # the errors are still there: --fix previews, it applies nothing
    head, _, tail = out.stdout.partition("error(s)\n")
    assert "RUNTIME" in head and "--context-parallel-size" in head
    assert "repair MEG-CP:layout:" in tail and "slime-lab repair" in tail
