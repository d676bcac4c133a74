"""experiment.sh's `check`, `convert` guards and `train` submission, run with real bash in a temp
dir that stands in for the slime checkout. `ray` is a stand-in executable that records its argv."""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import yaml

from lab.core.recipes import REPO_ROOT, get_recipe
from lab.render import write_files
from lab.rules.dependents import apply_change, new_experiment
from lab.web.export import experiment_files
from tests.lab.runtime_pending import pending, pending_texts


def runtime_refuses_megatron_placement() -> bool:
    """A GPU recipe's defaults meet a refusal of a capability the runtime lacks today (runtime_pending)."""
    from lab.rules.validate import validate as lab_validate

    return any(pending(f) for f in lab_validate(new_experiment("glm4-9b")))


FAKE_TOOL = """#!/usr/bin/env python3
import json, os, sys
with open(os.environ["FAKE_LOG"], "a") as f:
    f.write(json.dumps({"tool": os.path.basename(sys.argv[0]), "argv": sys.argv[1:],
                        "RAY_AUTH_MODE": os.environ.get("RAY_AUTH_MODE")}) + "\\n")
"""


def make_repo(tmp_path: Path, recipe: str, with_spec: bool = True, **changes) -> Path:
    exp = new_experiment(recipe)
    for path, value in changes.items():
        exp, _ = apply_change(exp, path.replace("__", "."), value)
    repo = tmp_path / "repo"
    write_files(experiment_files(exp), repo)
    for entry in ("train.py", "train_async.py"):  # `check` runs the runtime's dry run from the checkout
        (repo / entry).symlink_to(REPO_ROOT / entry)
    if with_spec:
        rel = get_recipe(recipe).model_spec
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).write_text((REPO_ROOT / rel).read_text())
    return repo / "experiment.sh"


def run(script: Path, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    e = {"PATH": os.environ["PATH"], "HOME": str(script.parent.parent), "LC_ALL": "C.UTF-8",
         "PYTHONPATH": str(REPO_ROOT)}
    e.update(env or {})
    return subprocess.run(["bash", str(script), *args], cwd=script.parent, env=e, capture_output=True, text=True,
                          timeout=60)


def fake_bin(tmp_path: Path, *names: str) -> tuple[dict, Path]:
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    for name in names:
        (bindir / name).write_text(FAKE_TOOL)
        (bindir / name).chmod(0o755)
    log = tmp_path / "tools.log"
    env = {"PATH": f"{bindir}:{os.environ['PATH']}", "FAKE_LOG": str(log)}
    if runtime_refuses_megatron_placement():  # the lab shows that refusal, so `train` stops on it (#12)
        env["SLIME_LAB_ALLOW_ERRORS"] = "1"
    return env, log


def calls(log: Path) -> list[dict]:
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def inputs(tmp_path: Path) -> dict:
    d = tmp_path / "data"
    return {"paths__hf_checkpoint": str(d / "hf"), "paths__ref_load": str(d / "torch_dist"),
            "paths__prompt_data": str(d / "train.jsonl"), "paths__save": str(d / "save"),
            "paths__output_dir": str(d / "out"), "evaluation__enabled": True, "evaluation__data_path": str(d / "eval.jsonl"),
            "precision__rollout": "fp8", "paths__serving_checkpoint": str(d / "fp8"),
            "task__custom_reward_path": "my_hooks.reward", "task__custom_generate_path": "my_hooks.generate",
            "serving__eagle__enabled": True, "serving__eagle__head": "separate", "serving__eagle__draft_head_path": str(d / "draft")}


def create_inputs(tmp_path: Path, repo: Path) -> None:
    d = tmp_path / "data"
    for sub in ("hf", "fp8", "draft"):
        (d / sub).mkdir(parents=True)
        (d / sub / "config.json").write_text(json.dumps({"hidden_size": 4096, "num_hidden_layers": 40}))
    (d / "torch_dist").mkdir()
    (d / "torch_dist" / "latest_checkpointed_iteration.txt").write_text("release")
    (d / "train.jsonl").write_text('{"prompt": "1+1", "label": "2"}\n')
    (d / "eval.jsonl").write_text('{"prompt": "2+2", "label": "4"}\n')
    (repo / "my_hooks.py").write_text("async def reward(*a): return 0.0\nasync def generate(*a): return None\n")


def test_check_in_an_empty_dir_names_every_missing_input(tmp_path):
    script = make_repo(tmp_path, "glm4-9b", with_spec=False, **inputs(tmp_path))
    out = run(script, "check")
    assert out.returncode == 1
    for label in ("model spec", "HF checkpoint", "reference checkpoint (--ref-load)", "prompt data", "eval data",
                  "FP8 serving checkpoint", "generate hook", "reward hook", "EAGLE draft head"):
        assert f"MISSING  {label}" in out.stdout, label
    assert "does not certify" in out.stdout


# What the runtime's pre-flight refuses on this machine and not on the cluster: SGLang is not
# installed here, and the runtime's pending refusals (tests/lab/runtime_pending.py: CP without Transformer Engine).
MACHINE_ONLY = ("needs the optional [sglang] install", *pending_texts())


def test_check_passes_when_every_input_is_present(tmp_path):
    script = make_repo(tmp_path, "glm4-9b", **inputs(tmp_path))
    create_inputs(tmp_path, script.parent)
    out = run(script, "check")
    assert "runtime pre-flight" in out.stdout and "Ray placement plan" in out.stdout
    refusals = [line for line in out.stdout.splitlines() if line.startswith("  - ")]
    unexplained = [r for r in refusals if not any(m in r for m in MACHINE_ONLY)]
    assert unexplained == [], out.stdout + out.stderr
    if not refusals:
        assert out.returncode == 0 and "check passed" in out.stdout


def test_check_says_what_the_cluster_must_have_installed(tmp_path):
    """The lab's verdict never asks what its machine has; `check` (the runtime's dry run with
    environment=True) names the package the flags need on every node."""
    script = make_repo(tmp_path, "glm4-9b", advanced__extra_flags="--use-sglang-router", **inputs(tmp_path))
    create_inputs(tmp_path, script.parent)
    out = run(script, "check")
    assert "the cluster must have sglang_router installed on every node: pip install sglang-router==0.3.2" \
        in out.stdout, out.stdout + out.stderr


def test_check_prints_the_ray_placement_plan_of_glm47_on_8_nodes(tmp_path):
    from lab.rules.runtime_verdict import placement, placement_lines

    script = make_repo(tmp_path, "glm4.7", **{"placement__nodes": 8})
    out = run(script, "check")
    lab_plan = placement(_exp("glm4.7", placement__nodes=8))
    lines = placement_lines(lab_plan)  # the page's Placement step shows these lines, from the same function
    printed = [line.strip() for line in out.stdout.splitlines()]
    assert all(line.strip() in printed for line in lines), out.stdout
    assert sum(s["role"] == "trainer" for s in lab_plan) == 64
    # 64 trainer ranks on 8 nodes read as one line per node, not 64 lines
    assert [line for line in lines if line.startswith("trainer ranks")] == [
        f"trainer ranks {8 * n}-{8 * n + 7}".ljust(22) + f" node {n} GPU 0-7" for n in range(8)]


def _exp(recipe, **changes):
    exp = new_experiment(recipe)
    for path, value in changes.items():
        exp, _ = apply_change(exp, path.replace("__", "."), value)
    return exp


def test_check_refuses_a_save_dir_with_a_checkpoint_that_is_not_loaded(tmp_path):
    script = make_repo(tmp_path, "glm4-9b", **inputs(tmp_path))
    create_inputs(tmp_path, script.parent)
    save = tmp_path / "data" / "save"
    save.mkdir()
    (save / "latest_checkpointed_iteration.txt").write_text("3")
    out = run(script, "check")
    assert out.returncode == 1
    assert "CKP-2" in out.stdout and "must never restart its rollout counter at 0" in out.stdout
    assert "(iteration 3)" in out.stdout


def test_check_refuses_a_load_dir_without_a_checkpoint(tmp_path):
    script = make_repo(tmp_path, "glm4-9b", paths__load=str(tmp_path / "nowhere"), **inputs(tmp_path))
    create_inputs(tmp_path, script.parent)
    out = run(script, "check")
    assert out.returncode == 1 and "no latest_checkpointed_iteration.txt" in out.stdout


def test_check_reports_a_model_spec_that_disagrees_with_config_json(tmp_path):
    script = make_repo(tmp_path, "glm4-9b", **inputs(tmp_path))
    create_inputs(tmp_path, script.parent)
    (tmp_path / "data" / "hf" / "config.json").write_text(json.dumps({"hidden_size": 5120}))
    out = run(script, "check")
    assert out.returncode == 1 and "PAR-7" in out.stdout and "hidden size" in out.stdout


def test_check_prints_the_labs_findings_as_findings_with_their_id_and_fix(tmp_path):
    from lab.rules.validate import validate as lab_validate

    exp, _ = apply_change(new_experiment("glm4-9b"), "resources.tp", 3)
    (par1,) = [f for f in lab_validate(exp) if f.id == "PAR-1"]
    script = make_repo(tmp_path, "glm4-9b", resources__tp=3, **inputs(tmp_path))
    create_inputs(tmp_path, script.parent)
    out = run(script, "check")
    assert out.returncode == 1, out.stdout
    lines = out.stdout.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("  finding  PAR-1: "))
    assert lines[at] == f"  finding  PAR-1: {par1.message}".replace("`", "")
    assert lines[at + 1] == f"           fix: {par1.fix}".replace("`", "")
    assert "lab validation" not in out.stdout and "MISSING  PAR-1" not in out.stdout
    assert "lab finding(s); nothing was started" in out.stdout


def test_convert_on_four_nodes_requires_master_addr_and_node_rank(tmp_path):
    script = make_repo(tmp_path, "glm4.7")
    out = run(script, "convert")
    assert out.returncode == 1 and "CONVERT_MASTER_ADDR" in out.stderr and "4-node" in out.stderr
    out = run(script, "convert", env={"CONVERT_MASTER_ADDR": "10.0.0.1"})
    assert out.returncode == 1 and "CONVERT_NODE_RANK is not set" in out.stderr
    out = run(script, "convert", env={"CONVERT_MASTER_ADDR": "10.0.0.1", "CONVERT_NODE_RANK": "4"})
    assert out.returncode == 1 and "out of range: use 0..3" in out.stderr


def test_unknown_command_prints_usage_and_exits_2(tmp_path):
    script = make_repo(tmp_path, "glm4-9b", with_spec=False)
    out = run(script, "frobnicate")
    assert out.returncode == 2 and "usage: bash experiment.sh" in out.stderr


def test_help_prints_this_experiments_ray_start_lines(tmp_path):
    out = run(make_repo(tmp_path, "glm4.7", with_spec=False), "help")
    assert "ray start --head --node-ip-address HEAD_IP --num-gpus 8 --dashboard-host 0.0.0.0 --dashboard-port 8265" in out.stdout
    assert "each of the 7 other nodes" in out.stdout and "ray start --address HEAD_IP:6379 --num-gpus 8" in out.stdout


def test_train_submits_with_an_explicit_runtime_env(tmp_path):
    script = make_repo(tmp_path, "glm4-9b")
    env, log = fake_bin(tmp_path, "ray")
    out = run(script, "train", env={**env, "NCCL_SOCKET_IFNAME": "eth0"})
    assert out.returncode == 0, out.stderr
    (call,) = calls(log)
    argv = call["argv"]
    assert argv[:4] == ["job", "submit", "--address", "http://127.0.0.1:8265"]
    runtime_env = json.loads(argv[argv.index("--runtime-env-json") + 1])["env_vars"]
    assert runtime_env["PYTHONPATH"] == str(script.parent)
    assert runtime_env["CUDA_DEVICE_MAX_CONNECTIONS"] == "1" and runtime_env["NCCL_SOCKET_IFNAME"] == "eth0"
    entry = argv[argv.index("--") + 1:]
    assert entry[:2] == ["python3", str(script.parent / "train.py")]
    assert entry[2:4] == ["--num-layers", "40"]  # MODEL_ARGS from the sourced spec come first


def test_train_honours_ray_dashboard(tmp_path):
    env, log = fake_bin(tmp_path, "ray")
    out = run(make_repo(tmp_path, "glm4-9b"), "train", env={**env, "RAY_DASHBOARD": "http://10.1.2.3:8265"})
    assert out.returncode == 0
    assert calls(log)[0]["argv"][3] == "http://10.1.2.3:8265"


def test_train_never_starts_or_stops_a_cluster_or_kills_processes(tmp_path):
    env, log = fake_bin(tmp_path, "ray", "pkill", "killall", "kill")
    assert run(make_repo(tmp_path, "glm5.3"), "train", env=env).returncode == 0
    recorded = calls(log)
    assert [c["tool"] for c in recorded] == ["ray"] and recorded[0]["argv"][:2] == ["job", "submit"]


def test_train_uses_token_auth_when_a_token_is_available(tmp_path):
    script = make_repo(tmp_path, "glm4-9b")
    env, log = fake_bin(tmp_path, "ray")
    assert run(script, "train", env=env).returncode == 0
    (tmp_path / ".ray").mkdir()
    (tmp_path / ".ray" / "auth_token").write_text("t0k3n")
    assert run(script, "train", env=env).returncode == 0
    assert run(script, "train", env={**env, "RAY_AUTH_MODE": "disabled"}).returncode == 0
    assert [c["RAY_AUTH_MODE"] for c in calls(log)] == [None, "token", "disabled"]


def test_train_writes_the_embedded_sglang_yaml_next_to_the_script(tmp_path):
    script = make_repo(tmp_path, "glm5.3")
    env, log = fake_bin(tmp_path, "ray")
    assert run(script, "train", env=env).returncode == 0
    config = script.parent / ".slime-lab.glm5.3.run-001" / "sglang.yaml"
    doc = yaml.safe_load(config.read_text())
    assert doc["sglang"][0]["update_weights"] is True
    argv = calls(log)[0]["argv"]
    assert argv[argv.index("--sglang-config") + 1] == str(config)


def test_train_refuses_while_the_lab_found_errors(tmp_path):
    env, log = fake_bin(tmp_path, "ray")
    env.pop("SLIME_LAB_ALLOW_ERRORS", None)
    out = run(make_repo(tmp_path, "glm4-9b", resources__tp=3), "train", env=env)
    assert out.returncode == 1 and "PAR-1" in out.stderr and not calls(log)


def test_check_finds_hook_modules_without_running_any_of_their_code(tmp_path):
    """A hook `pkg.sub.fn`: check reads the file system along sys.path; pkg/__init__.py and
    pkg/sub.py would write a file if imported, and no file appears."""
    changes = {**inputs(tmp_path), "task__custom_reward_path": "evilpkg.sub.reward",
               "task__custom_generate_path": "evilpkg.nested.gen.generate"}
    script = make_repo(tmp_path, "glm4-9b", **changes)
    create_inputs(tmp_path, script.parent)
    marker = tmp_path / "EXECUTED"
    payload = f"open({str(marker)!r}, 'a').write(__name__ + '\\n')\n"
    pkg = script.parent / "evilpkg"
    (pkg / "nested").mkdir(parents=True)
    (pkg / "__init__.py").write_text(payload)
    (pkg / "sub.py").write_text(payload + "def reward(*a): return 0.0\n")
    (pkg / "nested" / "__init__.py").write_text(payload)
    (pkg / "nested" / "gen.py").write_text(payload + "def generate(*a): return None\n")
    out = run(script, "check")
    refusals = [line for line in out.stdout.splitlines() if line.startswith("  - ")]
    assert [r for r in refusals if not any(m in r for m in MACHINE_ONLY)] == [], out.stdout + out.stderr
    assert "hook" not in out.stdout.replace("hook modules", ""), out.stdout
    assert not marker.exists(), marker.read_text()

    (pkg / "sub.py").unlink()  # a missing module is still named
    out = run(script, "check")
    assert out.returncode == 1 and not marker.exists()
    assert "reward hook (--custom-rm-path): module evilpkg.sub is not importable here" in out.stdout
    assert "generate hook" not in out.stdout


FLAKY_RAY = """#!/usr/bin/env python3
import json, os, sys
state = os.environ["FAKE_STATE"]
n = int(open(state).read()) if os.path.exists(state) else 0
open(state, "w").write(str(n + 1))
with open(os.environ["FAKE_LOG"], "a") as f:
    f.write(json.dumps({"tool": "ray", "argv": sys.argv[1:]}) + "\\n")
if n < int(os.environ["FAKE_FAILURES"]):
    print("RuntimeError: Request failed with status code 500: No available agent to submit job, please try again later.")
    sys.exit(1)
if os.environ.get("FAKE_JOB_FAILS"):
    print("Job 'x' submitted successfully")
    print("Connection refused (a line of the job's own log)")
    sys.exit(1)
"""


def flaky_ray(tmp_path: Path, failures: int, **extra: str) -> tuple[dict, Path]:
    env, log = fake_bin(tmp_path, "ray")
    (tmp_path / "bin" / "ray").write_text(FLAKY_RAY)
    return {**env, "FAKE_STATE": str(tmp_path / "state"), "FAKE_FAILURES": str(failures), **extra}, log


def test_train_waits_for_rays_job_agent_and_submits_once_it_is_there(tmp_path):
    env, log = flaky_ray(tmp_path, failures=2)
    out = run(make_repo(tmp_path, "glm4-9b"), "train", env=env)
    assert out.returncode == 0, out.stdout + out.stderr
    attempts = calls(log)
    assert len(attempts) == 3
    assert out.stdout.count("Ray is not ready to take the job yet (No available agent)") == 2
    ids = {a["argv"][a["argv"].index("--submission-id") + 1] for a in attempts}
    assert len(ids) == 1  # every attempt is the same submission: Ray refuses a duplicate


def test_train_gives_up_with_a_clear_error_when_the_agent_never_comes(tmp_path):
    env, log = flaky_ray(tmp_path, failures=1000, SLIME_RAY_SUBMIT_WAIT="4")
    out = run(make_repo(tmp_path, "glm4-9b"), "train", env=env)
    assert out.returncode == 1
    assert "did not accept the job within 4 s (last answer: No available agent)" in out.stderr
    assert "SLIME_RAY_SUBMIT_WAIT" in out.stderr and 2 <= len(calls(log)) <= 3


def test_train_never_resubmits_a_job_that_was_submitted_and_failed(tmp_path):
    env, log = flaky_ray(tmp_path, failures=0, FAKE_JOB_FAILS="1")
    out = run(make_repo(tmp_path, "glm4-9b"), "train", env=env)
    assert out.returncode == 1 and len(calls(log)) == 1
