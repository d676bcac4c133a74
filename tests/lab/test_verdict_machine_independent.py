"""One verdict everywhere: the lab's verdict (runtime validate(environment=False) through
lab/rules/runtime_verdict.py) never depends on what the lab's own machine has installed.

Both sides run in a fresh subprocess. In one, mooncake and sglang_router import as installed (CI
has both). In the other, an import blocker on sys.meta_path -- a stand-in for a laptop without
them, named as such: uninstalling packages from the shared environment is not an option -- makes
`import` and `importlib.util.find_spec` treat them as absent. The verdicts must be identical. What
the cluster must have stays `check`'s job (validate(environment=True)), tested last.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

from lab.core.recipes import REPO_ROOT, all_recipes
from tests.refusal_codes import codes

BLOCKED = ("mooncake", "sglang_router")

# The stand-in for a machine without these packages: every finder on sys.meta_path is wrapped so
# that it finds nothing for a blocked name (import fails, importlib.util.find_spec answers None).
BLOCKER = """
class NotInstalledHere:
    def __init__(self, finder):
        self.finder = finder

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            return None
        return self.finder.find_spec(name, path, target)

    def __getattr__(self, attr):
        return getattr(self.finder, attr)

sys.meta_path[:] = [NotInstalledHere(f) if hasattr(f, "find_spec") else f for f in sys.meta_path]
"""

# Each recipe's default, plus the default with each flag that needs one of the blocked packages.
VERDICTS = r"""
import json, sys

if sys.argv[1] == "blocked":
    exec(BLOCKER)

import importlib.util

from lab.core.recipes import all_recipes
from lab.rules.dependents import apply_change, new_experiment
from lab.rules.validate import validate

installed = {m: importlib.util.find_spec(m) is not None for m in BLOCKED}
out = {}
for name in all_recipes():
    for extra in ("", "--use-sglang-router", "--update-weight-transport mooncake"):
        exp = new_experiment(name)
        if extra:
            exp, _ = apply_change(exp, "advanced.extra_flags", extra)
        out[f"{name} {extra}"] = [f.model_dump(mode="json") for f in validate(exp)]
print(json.dumps({"installed": installed, "verdicts": out}))
"""


def _verdicts(mode: str) -> dict:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    code = f"BLOCKED = {BLOCKED!r}\nBLOCKER = {BLOCKER!r}\n" + VERDICTS
    out = subprocess.run([sys.executable, "-c", code, mode], cwd=REPO_ROOT, env=env, capture_output=True,
                         text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_the_labs_verdict_on_every_recipe_is_the_same_with_and_without_mooncake_and_sglang_router():
    present, blocked = _verdicts("installed"), _verdicts("blocked")
    assert present["installed"] == {m: True for m in BLOCKED}  # CI has both: the comparison means something
    assert blocked["installed"] == {m: False for m in BLOCKED}
    assert set(present["verdicts"]) == set(blocked["verdicts"]) and len(present["verdicts"]) == 3 * len(all_recipes())
    for case, findings in present["verdicts"].items():
        assert blocked["verdicts"][case] == findings, case


def test_check_says_what_the_cluster_must_have_and_refuses_when_it_is_missing():
    """`check` runs the runtime's dry run with environment=True: it names each package the flags
    need on the cluster, and refuses (with the pip line) where that package is absent."""
    from slime.args import cluster_packages, parse_args, validate

    base = ["--prompt-data", "d.jsonl", "--hf-checkpoint", "hf", "--num-rollout", "1", "--rm-type", "math"]
    cfg = parse_args([*base, "--use-sglang-router", "--update-weight-transport", "mooncake"])
    assert [m for m, _, _ in cluster_packages(cfg)] == ["mooncake", "sglang_router"]
    flag_only = codes(validate(cfg, environment=False))
    assert "args.mooncake_missing" not in flag_only and "args.sglang_router_missing" not in flag_only
    code = (f"import sys\nBLOCKED = {BLOCKED!r}\n{BLOCKER}\n"
            "from slime.dry_run import main\n"
            f"sys.exit(main({[*base, '--use-sglang-router']!r}))\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
                         capture_output=True, text=True, timeout=300)
    assert "the cluster must have sglang_router installed on every node: pip install sglang-router==0.3.2" in out.stdout
    assert out.returncode == 1 and "sglang-router is not installed" in out.stdout, out.stdout
