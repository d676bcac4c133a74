"""Import of hand-written launch scripts in the style of slime's scripts/run-*.sh.

The corpus (tests/fixtures/launch_scripts/corpus, written for these tests: 36 GRPO scripts over nine
architectures and one SFT script) is imported and the train command rendered from each import is
compared with the original's, which is captured by running the original under real bash with
recording stand-ins for `ray` and `python`/`python3` (and no-op stand-ins for `pkill`, `sleep`,
`nvidia-smi`: bench/import_roundtrip.py, named as such there). The stand-ins only record the
arguments bash hands them; they decide nothing that makes a test pass.
"""
from __future__ import annotations

import json
import shlex
import subprocess
from pathlib import Path

import pytest

from bench.import_roundtrip import CORPUS, GOALS, capture_train_argv, measure, summary
from lab.core.argv import runtime_argv
from lab.rules.import_script import ScriptImportError, _same, flag_values, import_script
from lab.web.export import experiment_files

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "launch_scripts"


@pytest.fixture(scope="module")
def corpus_results():
    return measure(CORPUS)


def _import(name: str):
    path = CORPUS / name
    return import_script(path.read_text(), path)


# --- the measured round trip ---------------------------------------------------------------------

def test_corpus_covers_the_architectures_and_script_styles_the_issue_names():
    scripts = sorted(CORPUS.glob("run-*.sh"))
    text = "\n".join(p.read_text() for p in scripts)
    specs = {p.name for p in (CORPUS / "models").glob("*.sh")}
    assert len(scripts) >= 30 and len(specs) >= 8
    for needle in ('RUNTIME_ENV_JSON="{', "--runtime-env-json='{\n", ":-", '"${CKPT_ARGS[@]}"', "${MODEL_ARGS[@]}",
                   'source "${SCRIPT_DIR}/models/', "train_async.py", "--loss-type sft_loss", "$(seq 16 8 256)",
                   "MODEL_ARGS+=(", "<<EOF", "# --use-kl-loss"):
        assert needle in text, needle


def test_corpus_round_trip_meets_the_goals(corpus_results):
    s = summary(corpus_results)
    assert s["crashed"] == 0
    assert s["import_rate"] >= GOALS["import"]
    assert s["arch_right"] == s["imported"]
    assert s["pair_rate"] >= GOALS["pairs"]


def test_every_difference_between_the_original_and_the_rendered_command_is_in_the_import_report(corpus_results):
    imported = [r for r in corpus_results if r.status == "imported"]
    assert imported and all(r.unlisted == [] for r in imported), [(r.name, r.unlisted) for r in imported if r.unlisted]
    assert all(r.added for r in imported)  # the backends the lab always writes are listed, not hidden
    assert all(d.split(":", 1)[1].strip() for r in imported for d in r.differences)  # each says why


def test_the_original_command_is_what_bash_runs(tmp_path):
    """The capture is real bash: `${X:-d}`, `$(seq …)`, quoting and arrays as bash expands them."""
    (tmp_path / "run.sh").write_text(
        '#!/bin/bash\nN=${N:-3}\nA=( --num-rollout "$N" )\nB="x y"\n'
        'ray job submit -- python3 train.py "${A[@]}" --input-key "$B" --sglang-cuda-graph-bs $(seq 1 2 5)\n')
    entry, argv = capture_train_argv(tmp_path / "run.sh")
    assert entry == "train.py"
    assert argv == ["--num-rollout", "3", "--input-key", "x y", "--sglang-cuda-graph-bs", "1", "3", "5"]


# --- the architecture comes from the script ------------------------------------------------------

def test_a_sourced_spec_equal_to_a_shipped_one_opens_its_recipe_matched_by_content():
    imported = _import("run-04-glm4-9B.sh")  # the spec's flags in another order, 1e4 for 10000
    assert imported.model == "scripts/models/glm4-9B.sh"
    assert imported.a.model.recipe == imported.b.model.recipe == "glm4-9b"
    assert imported.b.model.spec_args == ""


def test_a_spec_the_lab_does_not_ship_becomes_a_custom_model_with_its_own_dimensions():
    from lab.rules.derive import derive
    from lab.rules.memory import estimate_memory

    imported = _import("run-01-qwen3-4B.sh")
    assert imported.model == "custom"
    words = shlex.split(imported.b.model.spec_args)
    assert words[words.index("--num-layers") + 1] == "36" and words[words.index("--hidden-size") + 1] == "2560"
    d = derive(imported.b)
    assert 3.5 < d.total_params_b < 4.6 and d.model_kind == "dense"  # Qwen3-4B, not GLM-4-9B's 9.4B
    assert estimate_memory(imported.b)  # the memory estimate reads the custom dimensions


def test_a_custom_moe_model_gets_the_moe_parallel_rules():
    from lab.rules.derive import derive

    imported = _import("run-21-qwen3-30B-A3B.sh")
    assert imported.model == "custom" and derive(imported.b).model_kind == "moe"
    assert derive(imported.b).expert_dp is not None


def test_the_rendered_experiment_sh_writes_the_custom_spec_and_passes_shellcheck(tmp_path):

    imported = _import("run-17-kimi-like.sh")
    sh = experiment_files(imported.b)["experiment.sh"]
    assert 'MODEL_SPEC="${CONFIG_DIR}/model-spec.sh"' in sh and "--num-experts 384" in sh
    (tmp_path / "experiment.sh").write_text(sh)
    proc = subprocess.run(["shellcheck", "-S", "warning", str(tmp_path / "experiment.sh")], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout
    # the spec the script writes is read back by bash into the same MODEL_ARGS
    spec = sh.split("<<'SLIME_LAB_MODEL_SPEC'\n", 1)[1].split("SLIME_LAB_MODEL_SPEC\n", 1)[0]
    (tmp_path / "spec.sh").write_text(spec)
    out = subprocess.run(["bash", "-c", f'source {tmp_path / "spec.sh"}; printf "%s\\n" "${{MODEL_ARGS[@]}}"'],
                         capture_output=True, text=True, check=True).stdout.splitlines()
    assert out == shlex.split(imported.b.model.spec_args)


def test_a_script_without_any_architecture_is_refused_not_given_a_default():
    with pytest.raises(ScriptImportError) as exc:
        import_script("#!/bin/bash\npython3 train.py --num-rollout 2\n")
    assert exc.value.key == "import.no_model" and exc.value.line == 2


# --- the script wins -----------------------------------------------------------------------------

def test_the_scripts_value_of_a_spec_flag_and_its_extra_spec_flags_survive():
    imported = _import("run-12-qwen3-30B-A3B.sh")  # MODEL_ARGS+=(--moe-token-dispatcher-type flex ...)
    model = flag_values(shlex.split(imported.b.model.spec_args))
    assert model["--moe-token-dispatcher-type"] == ["flex"] and "--moe-enable-deepep" in model
    assert model["--moe-router-dtype"] == ["fp32"] and model["--moe-aux-loss-coeff"] == ["0"]


def test_recipe_defaults_the_script_does_not_set_leave_the_rendered_command():
    imported = _import("run-06-deepseek-v3.sh")  # comments --use-kl-loss out, saves nothing
    argv = runtime_argv(imported.b)
    assert "--use-kl-loss" not in argv and "--save" not in argv and "--save-interval" not in argv
    assert "--use-kl-loss" in imported.b.advanced.unset_flags
    kept = _import("run-04-glm4-9B.sh")
    assert "--use-kl-loss" in runtime_argv(kept.b) and "--save" in runtime_argv(kept.b)


def test_values_from_defaults_and_seq_are_evaluated():
    imported = _import("run-10-qwen3-4B.sh")  # NUM_NODES=${NUM_NODES:-1}, --sglang-cuda-graph-bs ... $(seq 16 8 256)
    argv = flag_values(runtime_argv(imported.b))
    assert argv["--actor-num-nodes"] == ["1"]
    assert argv["--sglang-cuda-graph-bs"] == ["1", "2", "4", "8", *[str(v) for v in range(16, 257, 8)]]


def test_a_fully_async_script_imports_as_async():
    imported = _import("run-03-qwen3-30B-A3B-async.sh")
    assert imported.entry == "train_async.py" and imported.b.placement.scheduling == "async"


def test_the_import_opens_as_b_against_the_nearest_recipe_and_the_ab_view_lists_the_fields():
    from fastapi.testclient import TestClient

    from lab.web.app import create_app

    client = TestClient(create_app(), base_url="http://127.0.0.1")
    start = client.post("/api/workspace", json={"action": {"type": "view"}}).json()["workspace"]
    text = (CORPUS / "run-13-glm4-9B-async.sh").read_text()
    r = client.post("/api/workspace", json={"workspace": start, "action": {"type": "import_script", "text": text}})
    assert r.status_code == 200
    view = r.json()
    assert view["workspace"]["a"]["model"]["recipe"] == "glm4-9b"
    fields = {row["path"] for row in view["ab_diff"]}
    assert "placement.scheduling" in fields and "advanced.unset_flags" in fields
    report = {item["flag"]: item for item in view["import_report"]}  # the import report, in the page's language
    assert report["--train-backend"]["kind"] == "normalised" and "megatron" in report["--train-backend"]["why"]
    zh = client.post("/api/workspace", json={"workspace": start, "lang": "zh",
                                             "action": {"type": "import_script", "text": text}}).json()
    assert "上游 slime" in {i["flag"]: i for i in zh["import_report"]}["--train-backend"]["why"]
    assert "import_report" not in client.post("/api/workspace", json={"workspace": start, "action": {"type": "view"}}).json()


# --- SFT and bad input ---------------------------------------------------------------------------

def test_an_sft_script_is_refused_at_import_with_its_line():
    with pytest.raises(ScriptImportError) as exc:
        _import("run-sft-qwen3-4B.sh")
    lines = (CORPUS / "run-sft-qwen3-4B.sh").read_text().splitlines()
    assert exc.value.key == "import.sft" and "--loss-type sft_loss" in lines[exc.value.line - 1]


BAD = {
    "unterminated quote": ("#!/bin/bash\nX='open quote\npython3 train.py\n", 2, "import.syntax.quote"),
    "loop": ("#!/bin/bash\nfor n in 1 2; do\n  echo $n\ndone\npython3 train.py\n", 2, "import.refused.loop"),
    "function": ("#!/bin/bash\nrun() {\n  python3 train.py\n}\nrun\n", 2, "import.refused.function"),
    "binary": ("#!/bin/bash\nA=1\n\x00\x01\x02ELF\n", 3, "import.binary"),
    "10 MB": ("#" * (10 * 1024 * 1024) + "\n", 1, "import.too_large"),
    "array never closed": ("#!/bin/bash\nARGS=(\n  --num-rollout 3\n", 2, "import.array_open"),
    "substitution never closed": ("#!/bin/bash\nX=$(seq 1 3\npython3 train.py\n", 2, "import.syntax.unclosed"),
    "double quote never closed": ('#!/bin/bash\nX="abc\npython3 train.py\n', 2, "import.syntax.quote"),
    "syntax error": ("#!/bin/bash\nA=1\n)\npython3 train.py\n", 3, "import.syntax.error"),
    "no train command": ("#!/bin/bash\necho hello\n", 2, "import.no_entry"),
    "value not evaluable": ("#!/bin/bash\nMODEL_ARGS=(--num-layers 2)\npython3 train.py ${MODEL_ARGS[@]} \\\n"
                            "  --num-rollout $(nproc)\n", 4, "import.unresolved"),
    "missing spec": ('#!/bin/bash\nsource "$(dirname "$0")/models/nowhere.sh"\npython3 train.py\n', 2,
                     "import.source_missing"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_input_gets_a_message_with_its_line(case):
    text, line, key = BAD[case]
    with pytest.raises(ScriptImportError) as exc:
        import_script(text)
    assert exc.value.key == key and exc.value.line == line and f"line {line}" in str(exc.value)


@pytest.mark.parametrize("case", sorted(BAD))
def test_the_page_answers_bad_input_with_a_4xx_naming_the_line(case):
    from fastapi.testclient import TestClient

    from lab.web.app import create_app

    text, line, _ = BAD[case]
    client = TestClient(create_app(), base_url="http://127.0.0.1")
    start = client.post("/api/workspace", json={"action": {"type": "view"}}).json()["workspace"]
    r = client.post("/api/workspace", json={"workspace": start, "action": {"type": "import_script", "text": text}})
    assert 400 <= r.status_code < 500
    assert f"line {line}" in json.dumps(r.json()) or r.status_code == 413


def test_cli_import_prints_b_against_a_with_the_report_and_refuses_bad_scripts(tmp_path, capsys):
    from lab.web.cli import main

    assert main(["import", str(CORPUS / "run-15-deepseek-v3.sh")]) == 0
    captured = capsys.readouterr()
    doc = json.loads(captured.out)
    assert doc["a"] == "deepseek-r1" and doc["model"] == "scripts/models/deepseek-v3.sh"
    assert any(item["flag"] == "--train-backend" and item["kind"] == "normalised" for item in doc["report"])
    for name, (text, line, _) in BAD.items():
        bad = tmp_path / "bad.sh"
        bad.write_bytes(text.encode("utf-8"))
        assert main(["import", str(bad)]) == 1, name
        err = capsys.readouterr().err
        assert f"line {line}" in err and "Traceback" not in err, name


def test_import_executes_nothing(tmp_path):
    marker = tmp_path / "ran"
    text = (f"#!/bin/bash\ntouch {marker}\nX=$(touch {marker})\nMODEL_ARGS=(--num-layers 2)\n"
            f"python3 train.py ${{MODEL_ARGS[@]}} --num-rollout 2 --input-key \"$(touch {marker})\"\n")
    with pytest.raises(ScriptImportError):  # the substitution is named, not run
        import_script(text)
    assert not marker.exists()


# --- the hand-written fixtures of the earlier importer -------------------------------------------

@pytest.mark.parametrize("name,recipe,ownership", [
    ("run-glm4-9B.sh", "glm4-9b", "disaggregated"),
    ("run-glm4.5-355B-A32B-pd.sh", "glm4.7", "colocated"),
    ("run-qwen3.5-27B-external.sh", "qwen3.8-27b", "external"),
])
def test_the_shipped_spec_fixtures_import_with_their_flags(name, recipe, ownership):
    imported = import_script((FIXTURES / name).read_text(), FIXTURES / name)
    assert imported.a.model.recipe == imported.b.model.recipe == recipe
    assert imported.b.placement.ownership == ownership
    ours, theirs = flag_values(imported.script.argv), flag_values(runtime_argv(imported.b))
    listed = {it.flag for it in imported.report}
    for flag, values in ours.items():
        assert _same(theirs.get(flag), values) or flag in listed, flag


def test_pd_import_fills_the_pd_fields():
    b = import_script((FIXTURES / "run-glm4.5-355B-A32B-pd.sh").read_text()).b
    assert b.serving.pd.enabled and b.serving.pd.prefill_engines == 1 and b.serving.pd.rdma_devices == ["mlx5_0"]
    assert b.placement.train_gpus == 64 and b.resources.ep == 16 and b.corrections.tis
