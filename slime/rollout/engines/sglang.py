"""SGLang engines: `sglang.yaml` + `--sglang-*` flags -> one `python -m sglang.launch_server` argv
per engine, and the Ray actor that runs it.

Translation (pure, tested on CPU against slime/rollout/engines/sglang_flags.py):
- server groups from `--sglang-config` (the lab's sglang.yaml: `sglang: [{name, model_path?,
  update_weights, server_groups: [{worker_type, num_gpus, num_gpus_per_engine?, overrides}]}]`),
  or `--prefill-num-servers` (PD from flags), or one regular group of `--rollout-num-gpus`.
- precedence per engine: slime's own per-engine values (tp, ports, base GPU, seed, nnodes/node
  rank, memory saver) > group `overrides` > `--sglang-*` flags > defaults below.
- PD: prefill engines get `--disaggregation-mode prefill`, the bootstrap port and
  `--load-balance-method follow_bootstrap_room`; decode engines `--disaggregation-mode decode`
  and `--prefill-round-robin-balance`; both the transfer backend (default mooncake) and
  `--disaggregation-ib-device` (from `--sglang-disaggregation-ib-device`). HiCache is kept on
  prefill engines only (decode runs without radix cache), SGL-5.
- EAGLE/MTP: the speculative fields pass through; without an explicit max_running_requests the
  translation sets it to `--sglang-server-concurrency` (SGL-7: SGLang's small default cap).
- DP attention: dp > 1 requires enable_dp_attention and dp | tp (SGL-3).

The GPU launch path (SGLangEngineActor) is written but # UNTESTED on GPU: SGLang cannot be
installed on the CPU machines and the GPU machine has no SGLang (docs/en/rollout-engines.md).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from slime.refusals import declare
from slime.rollout.engines.sglang_flags import (
    DISAGGREGATION_TRANSFER_BACKENDS,
    FLAGS,
    LIST,
    RESERVED,
    SGLANG_VERSION,
    SWITCH,
    WORKER_TYPES,
    canonical,
    flag,
)

DEFAULT_BOOTSTRAP_PORT = 8998
# Fields that are slime's own (not SGLang flags) but may arrive with the --sglang- prefix.
SLIME_OWN = {"server_concurrency", "config"}
HICACHE_FIELDS = ("enable_hierarchical_cache", "hicache_ratio", "hicache_size", "hicache_write_policy",
                  "hicache_storage_backend", "hicache_io_backend", "hicache_mem_layout", "release_hicache")


_R = declare("sglang", {
    "rollout_gpus_whole": ("gpus", "per_engine"),
    "prefill_no_decode": ("prefill", "per_engine", "gpus"),
    "groups_total": ("total", "gpus"),
    "transfer_backend": ("backend", "backends"),
    "pp_divides": ("per_engine", "pp"),
    "dp_attention": ("dp",),
    "dp_divides": ("dp", "tp"),
    "dp_lm_head": (),
    "hicache_radix": (),
    "unknown_fields": ("version", "fields"),
    "yaml_unreadable": ("path", "error"),
    "yaml_syntax": ("path", "error"),
    "yaml_models": ("path",),
    "worker_type": ("path", "name", "worker_type", "known"),
    "group_gpus": ("path", "name", "worker_type", "gpus"),
    "group_whole": ("path", "name", "worker_type", "gpus", "per_engine"),
    "group_mixed": ("path", "name"),
    "pd_pair": ("path", "name"),
    "dist_init_addr": ("index", "nodes"),
    "flag_table": ("field",),
})


class TranslationError(ValueError):
    """sglang.yaml / --sglang-* flags that cannot become a valid SGLang launch."""


@dataclass
class ServerGroup:
    worker_type: str
    num_gpus: int
    num_gpus_per_engine: int
    overrides: dict[str, Any] = field(default_factory=dict)
    model: str = "actor"
    model_path: str | None = None
    update_weights: bool = True


@dataclass
class EngineSpec:
    """One engine: which group, which GPUs of the rollout pool, its resolved ServerArgs fields."""

    index: int
    group: ServerGroup
    first_gpu: int  # index into the rollout pool's GPUs
    num_gpus: int
    fields: dict[str, Any]
    notices: list[str] = field(default_factory=list)

    @property
    def worker_type(self) -> str:
        return self.group.worker_type

    def nodes(self, gpus_per_node: int) -> int:
        return max(1, math.ceil(self.num_gpus / gpus_per_node))


def _yaml_load(path: str | Path) -> Any:
    import yaml

    try:
        return yaml.safe_load(Path(path).read_text())
    except OSError as e:
        raise TranslationError(_R("yaml_unreadable", path=str(path), error=e.strerror or type(e).__name__)) from None
    except yaml.YAMLError as e:
        raise TranslationError(_R("yaml_syntax", path=str(path), error=str(e).splitlines()[0])) from None


def load_server_groups(path: str | Path, hf_checkpoint: str | None = None) -> list[ServerGroup]:
    """The policy's server groups from a lab-rendered sglang.yaml (SGL-4, SYN-4 checks)."""
    data = _yaml_load(path) or {}
    models = data.get("sglang") if isinstance(data, dict) else None
    if not isinstance(models, list) or not models:
        raise TranslationError(_R("yaml_models", path=str(path)))
    groups: list[ServerGroup] = []
    for m in models:
        name = m.get("name", "actor")
        mpath = m.get("model_path")
        upd = m.get("update_weights")
        if upd is None:
            upd = not mpath or not hf_checkpoint or os.path.realpath(mpath) == os.path.realpath(hf_checkpoint)
        kinds = set()
        for g in m.get("server_groups") or []:
            wt = g.get("worker_type", "regular")
            if wt not in WORKER_TYPES:
                raise TranslationError(_R("worker_type", path=str(path), name=name, worker_type=wt, known=str(WORKER_TYPES)))
            n = int(g.get("num_gpus", 0))
            if n <= 0:
                raise TranslationError(_R("group_gpus", path=str(path), name=name, worker_type=wt, gpus=n))
            e = int(g.get("num_gpus_per_engine", 1))
            if e <= 0 or n % e:
                raise TranslationError(_R("group_whole", path=str(path), name=name, worker_type=wt, gpus=n, per_engine=e))
            kinds.add(wt)
            overrides = {canonical(k): v for k, v in (g.get("overrides") or {}).items()}
            groups.append(ServerGroup(wt, n, e, overrides, name, mpath, bool(upd)))
        if "regular" in kinds and kinds & {"prefill", "decode"}:
            raise TranslationError(_R("group_mixed", path=str(path), name=name))
        if bool(kinds & {"prefill"}) != bool(kinds & {"decode"}):
            raise TranslationError(_R("pd_pair", path=str(path), name=name))
    return groups


def default_groups(rollout_gpus: int, gpus_per_engine: int, prefill_num_servers: int | None) -> list[ServerGroup]:
    if rollout_gpus % gpus_per_engine:
        raise TranslationError(_R("rollout_gpus_whole", gpus=rollout_gpus, per_engine=gpus_per_engine))
    if prefill_num_servers:
        prefill = prefill_num_servers * gpus_per_engine
        if prefill >= rollout_gpus:
            raise TranslationError(_R("prefill_no_decode", prefill=prefill_num_servers, per_engine=gpus_per_engine,
                                      gpus=rollout_gpus))
        return [ServerGroup("prefill", prefill, gpus_per_engine), ServerGroup("decode", rollout_gpus - prefill,
                                                                              gpus_per_engine)]
    return [ServerGroup("regular", rollout_gpus, gpus_per_engine)]


def _flag_fields(sglang_flags: dict[str, Any], notices: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in sglang_flags.items():
        f = canonical(k)
        if f in SLIME_OWN:
            continue
        if f in RESERVED:
            notices.append(f"--sglang-{k.replace('_', '-')} is set by slime per engine and is ignored "
                           f"(SGL-1{'; use --rollout-num-gpus-per-engine' if f == 'tp_size' else ''})")
            continue
        out[f] = v
    return out


def _truthy(v: Any) -> bool:
    return v is True or (isinstance(v, str) and v.lower() in ("1", "true", "yes"))


def plan_engines(groups: list[ServerGroup], sglang_flags: dict[str, Any], *, server_concurrency: int = 512,
                 rollout_gpus: int | None = None) -> list[EngineSpec]:
    """Resolve each engine's ServerArgs fields (without per-engine host/port/GPU values)."""
    total = sum(g.num_gpus for g in groups)
    if rollout_gpus is not None and total != rollout_gpus:
        raise TranslationError(_R("groups_total", total=total, gpus=rollout_gpus))
    notices: list[str] = []
    base = _flag_fields(sglang_flags, notices)
    specs: list[EngineSpec] = []
    gpu = 0
    for g in groups:
        for _ in range(g.num_gpus // g.num_gpus_per_engine):
            f = {**base, **g.overrides}
            own: list[str] = []
            for k in list(f):
                if k in RESERVED:
                    own.append(f"{g.worker_type} override {k} is set by slime per engine and is ignored (SGL-1)")
                    del f[k]
            if g.worker_type in ("prefill", "decode"):
                f["disaggregation_mode"] = g.worker_type
                f.setdefault("disaggregation_transfer_backend", "mooncake")
                if f["disaggregation_transfer_backend"] not in DISAGGREGATION_TRANSFER_BACKENDS:
                    raise TranslationError(_R("transfer_backend", backend=f["disaggregation_transfer_backend"],
                                              backends=", ".join(DISAGGREGATION_TRANSFER_BACKENDS)))
                if g.worker_type == "prefill":
                    f.setdefault("disaggregation_bootstrap_port", DEFAULT_BOOTSTRAP_PORT)
                    f.setdefault("load_balance_method", "follow_bootstrap_room")
                else:
                    f.pop("disaggregation_bootstrap_port", None)
                    f["prefill_round_robin_balance"] = True
                    dropped = [k for k in HICACHE_FIELDS if k in f]
                    for k in dropped:
                        del f[k]
                    if dropped:
                        own.append(f"decode engines run without HiCache: dropped {', '.join(dropped)} (SGL-5)")
            else:
                f.pop("disaggregation_mode", None)
            tp = g.num_gpus_per_engine // int(f.get("pp_size", 1))
            if g.num_gpus_per_engine % int(f.get("pp_size", 1)):
                raise TranslationError(_R("pp_divides", per_engine=g.num_gpus_per_engine, pp=f.get("pp_size")))
            dp = int(f.get("dp_size", 1))
            if dp > 1 and not _truthy(f.get("enable_dp_attention")):
                raise TranslationError(_R("dp_attention", dp=dp))
            if dp > 1 and tp % dp:
                raise TranslationError(_R("dp_divides", dp=dp, tp=tp))
            if _truthy(f.get("enable_dp_lm_head")) and not _truthy(f.get("enable_dp_attention")):
                raise TranslationError(_R("dp_lm_head"))
            if _truthy(f.get("enable_hierarchical_cache")) and _truthy(f.get("disable_radix_cache")):
                raise TranslationError(_R("hicache_radix"))
            if f.get("speculative_algorithm") and "max_running_requests" not in f:
                f["max_running_requests"] = server_concurrency  # SGL-7
            f["tp_size"] = tp
            unknown = sorted(k for k in f if k not in FLAGS)
            if unknown:
                raise TranslationError(_R("unknown_fields", version=SGLANG_VERSION, fields=", ".join(unknown)))
            specs.append(EngineSpec(len(specs), g, gpu, g.num_gpus_per_engine, f, notices + own))
            gpu += g.num_gpus_per_engine
    return specs


def launch_fields(spec: EngineSpec, *, model_path: str, host: str, port: int, nccl_port: int, seed: int,
                  base_gpu_id: int, offload_rollout: bool, node_rank: int = 0, nnodes: int = 1,
                  dist_init_addr: str | None = None) -> dict[str, Any]:
    """The engine's complete ServerArgs fields, slime's per-engine values last (they win)."""
    f = dict(spec.fields)
    f.update(model_path=spec.group.model_path or model_path, trust_remote_code=True, skip_server_warmup=True,
             enable_metrics=True, random_seed=seed, host=host, port=port, nccl_port=nccl_port,
             base_gpu_id=base_gpu_id, gpu_id_step=1, enable_draft_weights_cpu_backup=True)
    if offload_rollout:
        f["enable_memory_saver"] = True
    if nnodes > 1:
        if not dist_init_addr:
            raise TranslationError(_R("dist_init_addr", index=spec.index, nodes=nnodes))
        f.update(nnodes=nnodes, node_rank=node_rank, dist_init_addr=dist_init_addr)
    return f


def to_argv(fields: dict[str, Any]) -> list[str]:
    """ServerArgs fields -> `python -m sglang.launch_server` arguments (flag names from FLAGS)."""
    argv: list[str] = []
    for k, v in fields.items():
        if k not in FLAGS:
            raise TranslationError(_R("flag_table", field=k))
        if FLAGS[k] == SWITCH:
            if _truthy(v):
                argv.append(flag(k))
            continue
        if v is None or v is False:
            continue
        if FLAGS[k] == LIST:  # --cuda-graph-bs 1 2 4 8 16 …: one flag, every value after it
            argv += [flag(k), *(str(x) for x in (v if isinstance(v, (list, tuple)) else str(v).split()))]
            continue
        argv += [flag(k), str(v)]
    return argv


def launch_command(fields: dict[str, Any], python: str = "python3") -> list[str]:
    return [python, "-m", "sglang.launch_server", *to_argv(fields)]


def sglang_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("sglang") is not None


# -- the GPU launch path ---------------------------------------------------------------------------
def sglang_engine_actor_cls():
    import ray

    @ray.remote
    class SGLangEngineActor:
        """# UNTESTED on GPU. One node of one SGLang engine: runs launch_server as a child process
        on the GPUs Ray gave this actor's bundle; node rank 0 serves HTTP."""

        def __init__(self) -> None:
            self.proc: Any = None  # the launch_server child (a subprocess.Popen) once started
            self.url = ""
            self.cmd: list[str] = []
            self.staged: dict = {}
            self.tp_size = 1

        def free_addr(self) -> str:
            """host:port for --dist-init-addr (node rank 0 of a multi-node engine)."""
            from slime.rollout.engines.embedded import free_port

            return f"{ray.util.get_node_ip_address()}:{free_port('0.0.0.0')}"

        def start(self, spec: EngineSpec, model_path: str, seed: int, offload_rollout: bool,
                  node_rank: int = 0, nnodes: int = 1, dist_init_addr: str | None = None) -> str:
            import subprocess

            from slime.rollout.engines.embedded import free_port

            gpu_ids = [int(float(g)) for g in ray.get_gpu_ids()]
            host = ray.util.get_node_ip_address()
            port = free_port("0.0.0.0")
            fields = launch_fields(spec, model_path=model_path, host=host, port=port,
                                   nccl_port=free_port("0.0.0.0"), seed=seed,
                                   base_gpu_id=min(gpu_ids) if gpu_ids else 0,
                                   offload_rollout=offload_rollout, node_rank=node_rank, nnodes=nnodes,
                                   dist_init_addr=dist_init_addr)
            env = dict(os.environ)
            env.pop("CUDA_VISIBLE_DEVICES", None)  # SGLang counts from base_gpu_id itself
            self.tp_size = int(fields.get("tp_size") or fields.get("tensor_parallel_size") or 1)
            self.cmd = launch_command(fields)
            self.proc = subprocess.Popen(self.cmd, env=env)
            self.url = f"http://{host}:{port}"
            return self.url

        def get_url(self) -> str:
            return self.url

        def stage_bucket(self, key: str, payload) -> None:
            """# UNTESTED on GPU. The out-of-band half of a colocated "tensor" sync (weight_sync.py):
            safetensors bytes (ray_staged) or a CUDA IPC handle of the trainer's bucket (cuda_ipc)."""
            self.staged[key] = payload

        def apply_staged(self, key: str, version: int, last: bool, load_format: str) -> None:
            """# UNTESTED on GPU. POST the staged bucket to SGLang's /update_weights_from_tensor in
            its own form: named tensors serialized by sglang's MultiprocessingSerializer (CUDA
            tensors travel as IPC handles), one entry per TP rank. Generation is paused around the
            whole sync by the caller (pause_generation / continue_generation)."""
            import httpx
            from sglang.srt.utils import MultiprocessingSerializer

            payload = self.staged.pop(key)
            if load_format == "cuda_ipc":
                from slime.sync.cuda_ipc import open_bucket

                named = list(open_bucket(payload).items())
            else:
                from slime.hf.weights import decode_bucket

                named = list(decode_bucket(payload).items())
            data = MultiprocessingSerializer.serialize(named, output_str=True)
            r = httpx.post(self.url + "/update_weights_from_tensor", timeout=600.0, json={
                "serialized_named_tensors": [data] * self.tp_size, "flush_cache": last,
                "weight_version": str(version)})
            body = r.json() if r.headers.get("content-type", "").startswith("application/json") else {}
            if r.status_code != 200 or body.get("success") is False:
                raise RuntimeError(f"{self.url}/update_weights_from_tensor: {r.status_code} {str(body or r.text)[:500]}")

        def command(self) -> list[str]:
            return self.cmd

        def alive(self) -> bool:
            return self.proc is not None and self.proc.poll() is None

        def shutdown(self) -> None:
            if self.proc is None:
                return
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except Exception:  # noqa: BLE001
                self.proc.kill()

    return SGLangEngineActor
