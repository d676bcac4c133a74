"""`rayjob.yaml`: the run `experiment.sh train` submits, as a KubeRay RayJob sized from the placement."""
from __future__ import annotations

import json
import shlex
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml

from lab.core.recipes import all_recipes
from lab.core.share import encode_link
from lab.render import RAYJOB_YAML
from lab.rules.dependents import apply_change, new_experiment
from lab.rules.derive import derive
from lab.web.export import experiment_files

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = json.loads((ROOT / "docker" / "kuberay" / "rayjob-v1.schema.json").read_text())
K8S_VERSION = "1.30"


def _docs(exp) -> list[dict]:
    return [d for d in yaml.safe_load_all(experiment_files(exp)[RAYJOB_YAML]) if d]


def _job(exp) -> dict:
    return next(d for d in _docs(exp) if d["kind"] == "RayJob")


def _validate(doc: dict) -> None:
    if doc["kind"] == "RayJob":
        jsonschema.validate(doc, SCHEMA)
        cluster = doc["spec"]["rayClusterSpec"]
        for template in [cluster["headGroupSpec"]["template"], *(g["template"] for g in cluster["workerGroupSpecs"])]:
            kubernetes_validate.validate({"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "t"},
                                          "template": template}, K8S_VERSION, strict=True)
    else:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


@pytest.mark.parametrize("recipe", sorted(all_recipes()))
def test_every_recipe_exports_a_rayjob_that_validates(recipe):
    exp = new_experiment(recipe)
    for doc in _docs(exp):
        _validate(doc)


def test_glm47_rayjob_matches_the_placement_plan_check_prints_on_8_nodes():
    from lab.rules.runtime_verdict import placement

    exp = new_experiment("glm4.7")
    d = derive(exp)
    assert exp.placement.nodes == 8
    plan = placement(exp)  # the plan `experiment.sh check` prints (train.py --dry-run)
    nodes_in_plan = {n for s in plan for n in ([s["node"]] if s["node"] is not None else []) + s["nodes"]}
    gpus_per_node: dict[int, set[int]] = {}
    for s in plan:
        if s["role"] == "trainer" and s["node"] is not None:
            gpus_per_node.setdefault(s["node"], set()).update(s["gpus"])
    job = _job(exp)
    _validate(job)
    workers = job["spec"]["rayClusterSpec"]["workerGroupSpecs"]
    assert len(workers) == 1
    group = workers[0]
    assert group["replicas"] == group["minReplicas"] == group["maxReplicas"] == d.ray_nodes == len(nodes_in_plan) == 8
    gpus = group["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"]
    assert gpus == int(group["rayStartParams"]["num-gpus"]) == d.ray_gpus_per_node == 8
    assert all(len(g) == gpus for g in gpus_per_node.values()) and len(gpus_per_node) == 8
    assert job["spec"]["rayClusterSpec"]["headGroupSpec"]["rayStartParams"]["num-gpus"] == "0"
    assert group["template"]["spec"]["containers"][0]["image"] == exp.install.image


def test_rayjob_entrypoint_runs_the_same_flags_as_experiment_sh(tmp_path):
    exp = new_experiment("glm4-9b")
    files = experiment_files(exp)
    entry = _job(exp)["spec"]["entrypoint"]
    words = shlex.split(entry)
    assert words[:2] == ["bash", "-c"] and len(words) == 3
    script = shlex.split(words[2])
    assert script[0] == "source" and script[1].endswith("/scripts/models/glm4-9B.sh")
    train = script[script.index("exec") + 1:]
    assert train[:2] == ["python3", "/opt/slime/train.py"] and train[2] == "${MODEL_ARGS[@]}"
    # every flag of experiment.sh's TRAIN_ARGS appears, in order, with its value
    sh = files["experiment.sh"]
    block = sh[sh.index("TRAIN_ARGS=(") + len("TRAIN_ARGS=("):sh.index("\n)\n", sh.index("TRAIN_ARGS=("))]
    sh_flags = [w for line in block.splitlines() if not line.strip().startswith("#")
                for w in shlex.split(line) if w.startswith("--")]
    assert [w for w in train[3:] if w.startswith("--")] == sh_flags
    assert "--hf-checkpoint" in train and train[train.index("--hf-checkpoint") + 1] == exp.paths.hf_checkpoint


def test_relative_paths_resolve_under_the_image_checkout():
    exp = new_experiment("tiny-cpu")
    train = shlex.split(shlex.split(_job(exp)["spec"]["entrypoint"])[2])
    value = train[train.index("--prompt-data") + 1]
    assert value.startswith("/opt/slime/") and value.endswith(exp.paths.prompt_data)


def test_sglang_yaml_travels_as_a_configmap_every_pod_mounts():
    exp = new_experiment("glm4.7-flash")
    exp = apply_change(exp, "serving.pd.enabled", True)[0]
    docs = _docs(exp)
    sh = experiment_files(exp)["experiment.sh"]
    if "SLIME_LAB_SGLANG_YAML" not in sh:
        pytest.skip("this configuration embeds no sglang.yaml")
    cm = next(d for d in docs if d["kind"] == "ConfigMap")
    job = next(d for d in docs if d["kind"] == "RayJob")
    _validate(cm)
    _validate(job)
    assert cm["data"]["sglang.yaml"] in sh
    cluster = job["spec"]["rayClusterSpec"]
    for template in [cluster["headGroupSpec"]["template"], *(g["template"] for g in cluster["workerGroupSpecs"])]:
        assert {"name": "sglang-config", "configMap": {"name": cm["metadata"]["name"]}} in template["spec"]["volumes"]
    assert "/etc/slime-lab/sglang.yaml" in job["spec"]["entrypoint"]


def test_private_paths_stay_out_of_share_links_but_reach_rayjob():
    exp = new_experiment("glm4-9b")
    exp = apply_change(exp, "paths.hf_checkpoint", "/secret/MARK-hf")[0]
    assert "/secret/MARK-hf" in experiment_files(exp)[RAYJOB_YAML]
    assert "MARK-hf" not in encode_link(exp)


def test_hostile_values_stay_literal_in_the_entrypoint():
    exp = new_experiment("glm4-9b")
    hostile = "/data/$(touch PWNED) `id`; rm -rf x 'q\"\nline"
    exp = apply_change(exp, "paths.save", hostile.replace("\n", ""))[0]
    job = _job(exp)
    _validate(job)
    script = shlex.split(shlex.split(job["spec"]["entrypoint"])[2])
    assert script[script.index("--save") + 1] == hostile.replace("\n", "")


def test_a_checkpoint_to_resume_from_reaches_the_rayjob_entrypoint():
    exp = new_experiment("glm4-9b")
    fresh = shlex.split(shlex.split(_job(exp)["spec"]["entrypoint"])[2])
    assert "--load" not in fresh
    exp = apply_change(exp, "paths.load", "/ck/my run")[0]
    train = shlex.split(shlex.split(_job(exp)["spec"]["entrypoint"])[2])
    assert train[train.index("--load") + 1] == "/ck/my run"
