"""`rayjob.yaml`: the same run as `experiment.sh train`, as a KubeRay `RayJob` for Ray on Kubernetes.

The Ray cluster is sized from the experiment's placement: one worker group of `nodes` pods with
`gpus_per_node` GPUs each (the nodes `ray start` would join by hand), plus a head pod that holds no
GPU. The entrypoint is the command `train` submits, with the flags of `experiment.sh` (the same
groups, the same values) and the model spec sourced from the image's checkout. Private paths appear
here exactly as they do in `experiment.sh`; share links never carry this file.

Pure: the build context of `experiment.sh` in, text out.
"""
from __future__ import annotations

import re
import shlex
from typing import Any

import yaml

from lab.core.images import get_image
from lab.render.env import Var, comment

# The image's checkout (WORKDIR of docker/gpu.Dockerfile and docker/cpu.Dockerfile): relative paths
# resolve against it, as experiment.sh resolves them against its own checkout.
IMAGE_SLIME_ROOT = "/opt/slime"
# libyaml's emitter when PyYAML has it: the pure-Python one costs milliseconds per edit.
_Dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
# Where the sglang.yaml ConfigMap is mounted on every pod (every Ray worker must see it).
SGLANG_CONFIG_DIR = "/etc/slime-lab"
# experiment.sh resolves these against the checkout when they are relative.
_PATH_VARS = frozenset({"HF_CHECKPOINT", "FP8_SOURCE", "SERVING_CHECKPOINT", "REF_LOAD", "PROMPT_DATA", "EVAL_DATA",
                        "SAVE_DIR", "LOAD_DIR", "OUTPUT_DIR", "QUEUE_STATE_DIR", "DRAFT_HEAD_PATH"})


def resource_name(experiment_id: str) -> str:
    """A DNS-1123 name KubeRay can derive its pod and service names from (≤ 40 characters)."""
    name = re.sub(r"[^a-z0-9-]+", "-", f"slime-{experiment_id}".lower()).strip("-")
    return name[:40].rstrip("-") or "slime"


def _values(c: dict[str, Any]) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for name, value, _help in c["scalars"]:
        if name in _PATH_VARS and value and not str(value).startswith("/"):
            value = f"{IMAGE_SLIME_ROOT}/{value}"
        values[name] = value
    for name, items, _help in c["arrays"]:
        values[name] = list(items)
    values["RDMA_IB_DEVICES"] = ",".join(values.get("RDMA_DEVICES", []))
    values["SGLANG_CONFIG"] = f"{SGLANG_CONFIG_DIR}/sglang.yaml"
    return values


def _word(token: Any) -> str:
    if isinstance(token, bool):
        return "true" if token else "false"
    return "" if token is None else str(token)


def train_argv(c: dict[str, Any]) -> list[str]:
    """The flags `experiment.sh train` passes after MODEL_ARGS, with every variable resolved."""
    values = _values(c)
    argv: list[str] = []
    for group in c["groups"]:
        for line in group.lines:
            for token in line:
                if isinstance(token, Var):
                    value = values[token.name]
                    if token.array:
                        argv.extend(str(v) for v in value)
                    else:
                        argv.append(f"{value}{token.suffix}")
                else:
                    argv.append(_word(token))
    if values.get("LOAD_DIR"):  # experiment.sh appends it the same way, from its variables block
        argv += ["--load", str(values["LOAD_DIR"])]
    return argv


def entrypoint(c: dict[str, Any]) -> str:
    """The job's command: bash sources the model spec from the image's checkout, then runs the loop."""
    spec = shlex.quote(f"{IMAGE_SLIME_ROOT}/{c['recipe'].model_spec}")
    script = (f"source {spec} && exec python3 {shlex.quote(IMAGE_SLIME_ROOT + '/' + c['entry'])} "
              f'"${{MODEL_ARGS[@]}}" ' + " ".join(shlex.quote(a) for a in train_argv(c)))
    return f"bash -c {shlex.quote(script)}"


def _runtime_env(c: dict[str, Any]) -> str:
    env = {"PYTHONPATH": IMAGE_SLIME_ROOT}
    for kv in c["runtime_env_fixed"]:
        key, _, value = kv.partition("=")
        env[key] = value
    return yaml.dump({"env_vars": env}, Dumper=_Dumper, sort_keys=True)


def _container(name: str, image: str, gpus: int, with_yaml: bool) -> dict[str, Any]:
    container: dict[str, Any] = {"name": name, "image": image}
    if gpus:
        container["resources"] = {"limits": {"nvidia.com/gpu": gpus}, "requests": {"nvidia.com/gpu": gpus}}
    mounts: list[dict[str, Any]] = [{"name": "dshm", "mountPath": "/dev/shm"}]
    if with_yaml:
        mounts.append({"name": "sglang-config", "mountPath": SGLANG_CONFIG_DIR, "readOnly": True})
    container["volumeMounts"] = mounts
    return container


def _pod(name: str, image: str, gpus: int, with_yaml: bool, config_map: str) -> dict[str, Any]:
    # SGLang and NCCL need far more shared memory than a container's default 64 MiB.
    volumes: list[dict[str, Any]] = [{"name": "dshm", "emptyDir": {"medium": "Memory"}}]
    if with_yaml:
        volumes.append({"name": "sglang-config", "configMap": {"name": config_map}})
    return {"spec": {"containers": [_container(name, image, gpus, with_yaml)], "volumes": volumes}}


def cluster_shape(c: dict[str, Any]) -> dict[str, int]:
    """Worker pods and GPUs per pod: the placement's nodes, each with its GPUs (CPU only: 1 x 0)."""
    if c["tiny"]:
        return {"workers": 1, "gpus_per_worker": 0}
    return {"workers": int(c["ray_nodes"]), "gpus_per_worker": int(c["ray_gpus"])}


def rayjob_yaml(c: dict[str, Any]) -> str:
    exp = c["exp"]
    name = resource_name(c["experiment_id"])
    config_map = f"{name}-sglang"
    image_tag = exp.install.image
    image = get_image(image_tag)
    shape = cluster_shape(c)
    with_yaml = bool(c["with_yaml"])
    gpus = shape["gpus_per_worker"]
    head_params = {"dashboard-host": "0.0.0.0", "num-gpus": "0"}
    worker_params = {"num-gpus": str(gpus)}
    cluster: dict[str, Any] = {
        "headGroupSpec": {
            "rayStartParams": head_params,
            "template": _pod("ray-head", image_tag, 0, with_yaml, config_map),
        },
        "workerGroupSpecs": [{
            "groupName": "gpu-workers" if gpus else "cpu-workers",
            "replicas": shape["workers"],
            "minReplicas": shape["workers"],
            "maxReplicas": shape["workers"],
            "rayStartParams": worker_params,
            "template": _pod("ray-worker", image_tag, gpus, with_yaml, config_map),
        }],
    }
    if image is not None and image.ray:
        cluster = {"rayVersion": image.ray, **cluster}
    job = {
        "apiVersion": "ray.io/v1",
        "kind": "RayJob",
        "metadata": {"name": name, "labels": {"app.kubernetes.io/part-of": "slime"}},
        "spec": {
            "entrypoint": entrypoint(c),
            "runtimeEnvYAML": _runtime_env(c),
            "shutdownAfterJobFinishes": True,
            "ttlSecondsAfterFinished": 3600,
            "rayClusterSpec": cluster,
        },
    }
    docs: list[dict[str, Any]] = []
    if with_yaml:
        docs.append({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": config_map},
                     "data": {"sglang.yaml": c["sglang_yaml"]}})
    docs.append(job)
    header = (
        f"# generated by slime-lab from {comment(c['recipe'].name)} at commit {comment(c['commit'])}, do not edit\n"
        f"# KubeRay RayJob: the run `bash experiment.sh train` submits, on Ray on Kubernetes.\n"
        f"#   kubectl apply -f rayjob.yaml\n"
        f"# Cluster: {shape['workers']} worker pod(s) x {gpus} GPU(s) (the placement's nodes) and a head pod\n"
        f"# without GPUs; image {comment(image_tag)}.\n"
        f"# Paths are those of experiment.sh, relative ones under {IMAGE_SLIME_ROOT}: every pod must see\n"
        f"# them at the same place (mount your shared storage into both pod templates).\n"
    )
    return header + yaml.dump_all(docs, Dumper=_Dumper, sort_keys=False, allow_unicode=True, width=4096)
