"""Renderers: every recipe and ownership mode renders, passes `bash -n` and shellcheck, and the
files say what the spec asks (flags by the runtime's names, embedded sglang.yaml, schema 2 JSON)."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from lab.core.experiment import PRIVATE_FIELDS, Experiment
from lab.core.recipes import RECIPES_DIR, all_recipes
from lab.render import write_files
from lab.rules.dependents import apply_change, new_experiment
from lab.web.export import experiment_files

SHELLCHECK = shutil.which("shellcheck")
MODES = ["colocated", "disaggregated", "external"]


def experiment_for(recipe: str, ownership: str | None = None, **changes) -> Experiment:
    exp = new_experiment(recipe)
    if ownership:
        exp, _ = apply_change(exp, "placement.ownership", ownership)
        if ownership == "external":
            exp, _ = apply_change(exp, "placement.external_engine_addrs", ["10.0.0.1:30000", "10.0.0.2:30000"])
    for path, value in changes.items():
        exp, _ = apply_change(exp, path.replace("__", "."), value)
    return exp


def train_args(tmp_path: Path, files: dict[str, str]) -> list[str]:
    """TRAIN_ARGS as bash expands them (the script minus its last line, `main "$@"`)."""
    write_files(files, tmp_path)
    body = (tmp_path / "experiment.sh").read_text()
    assert body.rstrip().endswith('main "$@"')
    lib = tmp_path / "lib.sh"
    lib.write_text(body.rstrip()[: -len('main "$@"')])
    out = subprocess.run(["bash", "-c", 'source "$1"; printf "%s\\0" "${TRAIN_ARGS[@]}"', "x", str(lib)],
                         capture_output=True, check=True)
    return out.stdout.decode().split("\0")[:-1]


def test_all_recipes_sees_every_recipe_file():
    files = sorted(p.stem for p in RECIPES_DIR.glob("*.yaml"))
    assert len(all_recipes()) == len(files) and sorted(all_recipes()) == files


def _render_every_mode(root: Path, recipes: list[str] | None = None) -> list[Path]:
    scripts = []
    for recipe in all_recipes() if recipes is None else recipes:
        for mode in MODES:
            files = experiment_files(experiment_for(recipe, mode))
            assert ("serving-reference.sh" in files) == (mode == "external")
            scripts += [p for p in write_files(files, root / recipe / mode) if p.suffix == ".sh"]
    return scripts


def test_every_recipe_renders_in_every_ownership_mode_and_passes_bash_n(tmp_path):
    scripts = _render_every_mode(tmp_path)
    assert len(scripts) == len(all_recipes()) * (len(MODES) + 1)
    for path in scripts:
        out = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
        assert out.returncode == 0, f"{path}: {out.stderr}"


def test_every_rendered_script_passes_shellcheck(tmp_path):
    if SHELLCHECK is None:
        pytest.skip("shellcheck is not installed (apt-get install shellcheck); test_shellcheck_present_in_ci guards CI")
    # The six tiny-gpu-<family> twins render the same shell (one template branch, prepare --family)
    # with other quoted values: one of them stands for all, as shellcheck is most of this file's time.
    # Every twin still goes through bash -n above and the render record.
    twins = [r for r in all_recipes() if r.startswith("tiny-gpu-")]
    recipes = [r for r in all_recipes() if r not in twins[1:]]
    scripts = [str(p) for p in _render_every_mode(tmp_path, recipes)]
    half = len(scripts) // 2  # two processes: shellcheck is single-threaded and CPU-bound
    procs = [subprocess.Popen([SHELLCHECK, "--severity=style", *part], stdout=subprocess.PIPE, text=True)
             for part in (scripts[:half], scripts[half:])]
    outputs = [(p.communicate()[0], p.returncode) for p in procs]
    assert all(rc == 0 for _, rc in outputs), "\n".join(o for o, _ in outputs)


def test_shellcheck_present_in_ci():
    if os.environ.get("CI", "").lower() in ("1", "true", "yes") and SHELLCHECK is None:
        pytest.fail("CI must install shellcheck: every generated script is checked with it")


def test_render_is_deterministic():
    exp = experiment_for("glm5.3")
    assert experiment_files(exp) == experiment_files(exp.model_copy(deep=True))


def test_experiment_json_is_schema_2_with_private_fields_sorted_and_indented():
    exp = experiment_for("glm4-9b", paths__hf_checkpoint="/secret/model")
    text = experiment_files(exp)["experiment.json"]
    doc = json.loads(text)
    assert doc["schema"] == 2 and set(doc) == {"schema", "experiment", "findings", "derived", "provenance"}
    assert doc["experiment"]["paths"]["hf_checkpoint"] == "/secret/model"
    assert Experiment.model_validate(doc["experiment"]) == exp
    assert text == json.dumps(doc, sort_keys=True, indent=2, ensure_ascii=False) + "\n"
    prov = doc["provenance"]
    assert prov["sources"]["recipe"]["path"] == "recipes/glm4-9b.yaml" and len(prov["sources"]["recipe"]["sha256"]) == 64
    assert prov["sources"]["model_spec"]["path"] == "scripts/models/glm4-9B.sh"


def test_header_names_recipe_commit_and_do_not_edit():
    sh = experiment_files(experiment_for("glm4-9b"))["experiment.sh"]
    lines = sh.splitlines()
    assert lines[0] == "#!/usr/bin/env bash"
    assert re.match(r"# generated by slime-lab from glm4-9b at commit .+, do not edit$", lines[1])
    assert "set -euo pipefail" in lines


def test_flags_follow_runtime_cli_names(tmp_path):
    args = train_args(tmp_path, experiment_files(experiment_for("glm5.3")))
    joined = " ".join(args)
    for expected in ["--actor-num-nodes 32", "--actor-num-gpus-per-node 8", "--colocate",
                     "--rollout-num-gpus-per-engine 64", "--eps-clip 0.2", "--eps-clip-high 0.28",
                     "--kl-loss-coef 0", "--kl-loss-type low_var_kl", "--lr 1e-6", "--lr-decay-style constant",
                     "--weight-decay 0.1", "--adam-beta1 0.9", "--adam-beta2 0.98", "--use-tis",
                     "--tensor-model-parallel-size 4", "--pipeline-model-parallel-size 8", "--sequence-parallel",
                     "--decoder-first-pipeline-num-layers 14", "--decoder-last-pipeline-num-layers 16",
                     "--recompute-granularity full --recompute-method uniform --recompute-num-layers 1",
                     "--optimizer-cpu-offload --overlap-cpu-optimizer-d2h-h2d --use-precision-aware-optimizer",
                     "--train-backend megatron", "--rollout-backend sglang", "--sglang-enable-dp-attention"]:
        assert expected in joined, expected
    assert args[args.index("--sglang-config") + 1].endswith("/.slime-lab.glm5.3.run-001/sglang.yaml")
    assert "--load" not in args


def test_disaggregated_flags_and_eval(tmp_path):
    exp = experiment_for("glm4-9b", evaluation__enabled=True, paths__load="/ck/run")
    args = train_args(tmp_path, experiment_files(exp))
    assert args[args.index("--rollout-num-gpus") + 1] == "4" and "--colocate" not in args
    i = args.index("--eval-prompt-data")
    assert args[i + 1: i + 3] == ["aime", "/data/aime-2024/aime-2024.jsonl"]
    assert args[args.index("--load") + 1] == "/ck/run"


def test_resuming_is_the_one_line_edit_of_load_dir(tmp_path):
    """A user resumes by setting LOAD_DIR in the variables block of an already rendered script: train
    must then pass --load (a check that passes while train silently starts fresh is the trap)."""
    files = experiment_files(experiment_for("glm4-9b"))
    assert "--load" not in train_args(tmp_path / "fresh", files)
    body = files["experiment.sh"]
    assert body.count("\nLOAD_DIR=''") == 1
    edited = {**files, "experiment.sh": body.replace("\nLOAD_DIR=''", "\nLOAD_DIR='/ck/my run'")}
    args = train_args(tmp_path / "edited", edited)
    assert args[args.index("--load") + 1] == "/ck/my run"


def test_external_mode_passes_engine_addresses(tmp_path):
    args = train_args(tmp_path, experiment_files(experiment_for("glm4-9b", "external")))
    i = args.index("--rollout-external-engine-addrs")
    assert args[i + 1: i + 3] == ["10.0.0.1:30000", "10.0.0.2:30000"]
    assert "--rollout-num-gpus-per-engine" not in args


def test_async_submits_train_async():
    sh = experiment_files(experiment_for("glm4-9b", placement__scheduling="async"))["experiment.sh"]
    assert 'python3 "${SLIME_ROOT}/train_async.py"' in sh


def _embedded_yaml(sh: str) -> dict:
    m = re.search(r"<<'SLIME_LAB_SGLANG_YAML'\n(.*?)^SLIME_LAB_SGLANG_YAML$", sh, re.S | re.M)
    assert m, "no embedded sglang.yaml heredoc"
    return yaml.safe_load(m.group(1))


def test_server_groups_are_embedded_sglang_yaml_with_update_weights():
    sh = experiment_files(experiment_for("glm5.3", serving__eagle__enabled=True))["experiment.sh"]
    doc = _embedded_yaml(sh)
    actor = doc["sglang"][0]
    assert actor["update_weights"] is True
    assert [g["worker_type"] for g in actor["server_groups"]] == ["regular"]
    assert actor["server_groups"][0]["num_gpus"] == 256
    assert actor["server_groups"][0]["overrides"]["speculative_algorithm"] == "EAGLE"


def test_pd_yaml_has_hicache_on_prefill_only_and_mooncake(tmp_path):
    exp = experiment_for("glm4-9b", serving__pd__enabled=True, serving__pd__prefill_engines=1,
                         serving__pd__decode_engines=1, serving__hicache__enabled=True,
                         serving__pd__rdma_devices=["mlx5_0", "mlx5_1"])
    files = experiment_files(exp)
    groups = _embedded_yaml(files["experiment.sh"])["sglang"][0]["server_groups"]
    prefill, decode = groups
    assert (prefill["worker_type"], decode["worker_type"]) == ("prefill", "decode")
    assert prefill["overrides"]["enable_hierarchical_cache"] is True
    assert "enable_hierarchical_cache" not in decode["overrides"]
    assert {g["overrides"]["disaggregation_transfer_backend"] for g in groups} == {"mooncake"}
    args = train_args(tmp_path, files)
    assert args[args.index("--sglang-disaggregation-ib-device") + 1] == "mlx5_0,mlx5_1"


def test_eagle_without_server_groups_uses_speculative_flags(tmp_path):
    args = train_args(tmp_path, experiment_files(experiment_for("glm4.7-flash", serving__eagle__enabled=True)))
    joined = " ".join(args)
    assert "--sglang-speculative-algorithm EAGLE --sglang-speculative-num-steps 3" in joined
    assert "--sglang-speculative-eagle-topk 1 --sglang-speculative-num-draft-tokens 4" in joined
    assert "--sglang-config" not in args


def test_tiny_recipe_uses_embedded_backends_and_local_prepare(tmp_path):
    files = experiment_files(experiment_for("tiny-cpu"))
    args = train_args(tmp_path, files)
    assert args[args.index("--train-backend") + 1] == "embedded"
    assert not any(a.startswith("--sglang-") and a != "--sglang-server-concurrency" for a in args)
    assert "tools/tiny/prepare.py" in files["experiment.sh"] and "hf_download \"$HF_REPO\"" not in files["experiment.sh"]
    assert "--backend embedded" in files["experiment.sh"]


def test_every_recipes_default_flags_parse_with_the_runtime_parser(tmp_path):
    args_mod = pytest.importorskip("slime.args")
    for name in all_recipes():
        args = train_args(tmp_path / name, experiment_files(experiment_for(name)))
        cfg = args_mod.parse_args(args)  # raises UsageError naming any unknown flag
        assert cfg.rollout.rollout_batch_size > 0, name


def test_fp8_published_model_prepares_bf16_then_fp8_serving_weights():
    sh = experiment_files(experiment_for("deepseek-r1", precision__rollout="fp8"))["experiment.sh"]
    assert 'hf_download "$HF_REPO" --local-dir "$FP8_SOURCE"' in sh
    assert "tools/fp8_cast_bf16.py\" --input-fp8-hf-path \"$FP8_SOURCE\" --output-bf16-hf-path \"$HF_CHECKPOINT\"" in sh
    assert "tools/convert_hf_to_fp8.py" in sh
    assert '--hf-checkpoint "${SERVING_CHECKPOINT}"' in sh


def test_multi_node_conversion_for_large_recipes():
    for name in ("glm4.7", "glm5.3", "deepseek-r1"):
        sh = experiment_files(experiment_for(name))["experiment.sh"]
        assert "--nnodes 4 --nproc-per-node 8" in sh and "CONVERT_NODE_RANK" in sh
    assert "--nnodes 1 --nproc-per-node 8" in experiment_files(experiment_for("glm4-9b"))["experiment.sh"]


def test_runtime_env_sets_cuda_device_max_connections_only_with_tp_or_cp():
    assert "CUDA_DEVICE_MAX_CONNECTIONS=1" in experiment_files(experiment_for("glm4-9b"))["experiment.sh"]
    tp1 = experiment_for("glm4-9b", resources__tp=1, resources__cp=1)
    assert "CUDA_DEVICE_MAX_CONNECTIONS" not in experiment_files(tp1)["experiment.sh"]


def test_serving_reference_lists_launch_flags_and_verification():
    ref = experiment_files(experiment_for("glm4.7-flash", "external", serving__eagle__enabled=True))["serving-reference.sh"]
    assert "--tp-size 8" in ref and "--speculative-algorithm EAGLE" in ref
    assert "/server_info" in ref and "/model_info" in ref and "set -euo pipefail" in ref
    assert "belong to your external launcher" in ref


def test_private_fields_are_all_known_to_the_renderer():
    # test_shell_safety covers each of them with hostile values; a new private field must be added there.
    assert PRIVATE_FIELDS == {
        "task.custom_generate_path", "task.custom_reward_path", "placement.external_engine_addrs",
        "rollout.queue_state_dir", "serving.pd.rdma_devices", "serving.eagle.draft_head_path",
        "paths.hf_checkpoint", "paths.fp8_source", "paths.serving_checkpoint", "paths.ref_load",
        "paths.prompt_data", "paths.save", "paths.load", "paths.output_dir", "evaluation.data_path",
        "advanced.extra_flags"}
