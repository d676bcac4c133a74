"""Hostile values in every private field never run as shell: `check`, `help` and `train` (with a
stand-in `ray`) print and pass them literally, and no PWNED file appears."""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from lab.core.experiment import PRIVATE_FIELDS, Experiment, set_path
from lab.core.recipes import REPO_ROOT
from lab.render import write_files
from lab.rules.dependents import new_experiment
from lab.web.export import experiment_files

EVIL = "/tmp/a b/it's \"q\"/$(touch PWNED)/`touch PWNED`/;rm -rf x/$HOME/*"
EVIL_HOOK = "evil$(touch PWNED).m`touch PWNED`;rm -rf x $HOME *.fn"
FAKE_RAY = """#!/usr/bin/env python3
import json, os, sys
with open(os.environ["FAKE_RAY_LOG"], "a") as f:
    f.write(json.dumps({"argv": sys.argv[1:], "RAY_AUTH_MODE": os.environ.get("RAY_AUTH_MODE")}) + "\\n")
"""


def hostile(field: str):
    if field == "placement.external_engine_addrs":
        return [EVIL, "10.0.0.1:30000"]
    if field == "serving.pd.rdma_devices":
        return [EVIL, "mlx5_1"]
    if field.startswith("task.custom_"):
        return EVIL_HOOK
    return EVIL + "/" + field


def scenario(ownership: str) -> Experiment:
    """Every private field set to a hostile value, with the features on that make each one used."""
    data = new_experiment("deepseek-r1").model_dump(mode="json")
    for field in PRIVATE_FIELDS:
        set_path(data, field, hostile(field))
    for path, value in {"placement.ownership": ownership, "precision.rollout": "fp8", "evaluation.enabled": True,
                        "serving.pd.enabled": ownership != "external", "serving.eagle.enabled": True,
                        "serving.eagle.head": "separate", "rollout.queue": True, "task.kind": "custom",
                        "install.image": "img $(touch PWNED); touch PWNED"}.items():
        set_path(data, path, value)
    return Experiment.model_validate(data)


def run(script: Path, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    e = {"PATH": os.environ["PATH"], "HOME": str(script.parent), "LC_ALL": "C.UTF-8"}
    e.update(env or {})
    return subprocess.run(["bash", str(script), *args], cwd=script.parent, env=e, capture_output=True, text=True,
                          timeout=60)


def assert_no_pwned(root: Path) -> None:
    found = [str(p) for p in root.rglob("*PWNED*")] + [str(p) for p in REPO_ROOT.glob("*PWNED*")]
    assert not found, found


def render_into(tmp_path: Path, exp: Experiment) -> Path:
    d = tmp_path / "repo"
    write_files(experiment_files(exp), d)
    return d / "experiment.sh"


def test_every_private_field_is_covered_by_a_hostile_scenario():
    dumped = [json.dumps(scenario(m).model_dump(mode="json")) for m in ("disaggregated", "external")]
    for field in PRIVATE_FIELDS:
        assert any(json.dumps(hostile(field))[1:-1] in d for d in dumped), field


def test_help_prints_hostile_values_literally_and_runs_nothing(tmp_path):
    for mode in ("disaggregated", "external"):
        script = render_into(tmp_path / mode, scenario(mode))
        out = run(script, "help")
        assert out.returncode == 0, out.stderr
        for field in ("paths.hf_checkpoint", "paths.ref_load", "paths.prompt_data", "paths.save", "paths.load",
                      "paths.output_dir", "paths.fp8_source", "paths.serving_checkpoint", "evaluation.data_path",
                      "serving.eagle.draft_head_path", "rollout.queue_state_dir"):
            assert hostile(field) in out.stdout, field
        assert EVIL_HOOK in out.stdout
        if mode == "external":
            assert f"{EVIL} 10.0.0.1:30000" in out.stdout
        else:
            assert f"{EVIL},mlx5_1" in out.stdout
        assert_no_pwned(tmp_path)


def test_check_prints_hostile_values_literally_and_runs_nothing(tmp_path):
    for mode in ("disaggregated", "external"):
        script = render_into(tmp_path / mode, scenario(mode))
        out = run(script, "check")
        assert out.returncode == 1
        for field in ("paths.hf_checkpoint", "paths.ref_load", "paths.prompt_data", "paths.load",
                      "paths.serving_checkpoint", "evaluation.data_path", "serving.eagle.draft_head_path"):
            assert hostile(field) in out.stdout, field
        assert "not importable" in out.stdout
        assert_no_pwned(tmp_path)


def test_train_passes_hostile_values_as_single_arguments(tmp_path):
    script = render_into(tmp_path, scenario("external"))
    (script.parent / "scripts" / "models").mkdir(parents=True)
    spec = new_experiment("deepseek-r1")
    from lab.core.recipes import get_recipe

    rel = get_recipe(spec.model.recipe).model_spec
    (script.parent / rel).write_text((REPO_ROOT / rel).read_text())
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "ray").write_text(FAKE_RAY)
    (bindir / "ray").chmod(0o755)
    log = tmp_path / "ray.log"
    out = run(script, "train", env={"PATH": f"{bindir}:{os.environ['PATH']}", "FAKE_RAY_LOG": str(log),
                                    "SLIME_LAB_ALLOW_ERRORS": "1"})
    assert out.returncode == 0, out.stderr
    argv = json.loads(log.read_text().splitlines()[0])["argv"]
    for flag, field in [("--ref-load", "paths.ref_load"), ("--save", "paths.save"), ("--load", "paths.load"),
                        ("--hf-checkpoint", "paths.serving_checkpoint"), ("--output-dir", "paths.output_dir"),
                        ("--prompt-data", "paths.prompt_data")]:
        assert argv[argv.index(flag) + 1] == hostile(field), flag
    assert argv[argv.index("--custom-rm-path") + 1] == EVIL_HOOK
    i = argv.index("--rollout-external-engine-addrs")
    assert argv[i + 1: i + 3] == [EVIL, "10.0.0.1:30000"]
    assert_no_pwned(tmp_path)
