"""Build megatron-core's GPTModel from the model spec, and move weights between it and HF files.

Used by the trainer (GPU, NCCL) and by conversion (CPU or GPU, gloo): both build the same module
tree, so a torch_dist checkpoint written by one loads in the other with any parallel layout
(megatron-core's dist_checkpointing reshards on load).
"""

from __future__ import annotations

import json
import os
import socket
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

import torch
import torch.distributed as dist

from slime.backends.megatron import hf_mapping as hm
from slime.backends.megatron.model_args import (
    gpt_model_kwargs,
    is_mla,
    layer_spec_kwargs,
    padded_vocab_size,
    parallel_kwargs,
    transformer_config_kwargs,
)
from slime.model_spec import flag_bool

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def init_parallel(megatron: Mapping[str, Any], backend: str | None = None, seed: int = 1234) -> dict[str, int]:
    """torch.distributed (torchrun's env, or a single local process) + megatron's process groups.

    Returns the parallel sizes. ``backend`` defaults to nccl on a GPU, gloo otherwise.
    """
    from megatron.core import parallel_state as ps

    par = parallel_kwargs(megatron)
    if not dist.is_initialized():
        rank = int(os.environ.get("RANK", 0))
        world = int(os.environ.get("WORLD_SIZE", 1))
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(_free_port()))
        use_cuda = torch.cuda.is_available() and backend != "gloo"
        if use_cuda:
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
        dist.init_process_group(backend or ("nccl" if use_cuda else "gloo"), rank=rank, world_size=world)
    if ps.model_parallel_is_initialized() and current_layout() != wanted_layout(par):
        # A second trainer (or conversion) in this process asks for another layout: megatron-core
        # would otherwise keep the first one's groups and build the new model on them.
        ps.destroy_model_parallel()
    if not ps.model_parallel_is_initialized():
        ps.initialize_model_parallel(
            tensor_model_parallel_size=par["tensor_model_parallel_size"],
            pipeline_model_parallel_size=par["pipeline_model_parallel_size"],
            virtual_pipeline_model_parallel_size=par.get("virtual_pipeline_model_parallel_size"),
            context_parallel_size=par["context_parallel_size"],
            expert_model_parallel_size=par["expert_model_parallel_size"],
            expert_tensor_parallel_size=par.get("expert_tensor_parallel_size"),
        )
    if torch.cuda.is_available() and dist.get_backend() == "nccl":
        from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed

        model_parallel_cuda_manual_seed(seed)
    return par


def wanted_layout(par: Mapping[str, Any]) -> tuple[int, int, int, int, int, int | None]:
    """(TP, PP, CP, EP, expert TP, virtual PP) that ``par`` (parallel_kwargs) asks for; expert TP
    defaults to TP, as in megatron-core."""
    tp = par["tensor_model_parallel_size"]
    return (tp, par["pipeline_model_parallel_size"], par["context_parallel_size"],
            par["expert_model_parallel_size"], par.get("expert_tensor_parallel_size") or tp,
            par.get("virtual_pipeline_model_parallel_size"))


def current_layout() -> tuple[int, int, int, int, int, int | None]:
    """The same sizes of megatron-core's initialised process groups."""
    from megatron.core import parallel_state as ps

    return (ps.get_tensor_model_parallel_world_size(), ps.get_pipeline_model_parallel_world_size(),
            ps.get_context_parallel_world_size(), ps.get_expert_model_parallel_world_size(),
            ps.get_expert_tensor_parallel_world_size(), ps.get_virtual_pipeline_model_parallel_world_size())


def make_config(flags: Mapping[str, Any], megatron: Mapping[str, Any] | None = None, **overrides):
    """TransformerConfig (MLATransformerConfig for MLA specs) from the spec + training flags."""
    from megatron.core.transformer import MLATransformerConfig, TransformerConfig

    kw = transformer_config_kwargs(flags, megatron or {})
    kw["activation_func"] = {"silu": torch.nn.functional.silu, "gelu": torch.nn.functional.gelu}[kw["activation_func"]]
    kw["params_dtype"] = DTYPES[kw["params_dtype"]]
    kw["pipeline_dtype"] = kw["params_dtype"]  # what pipeline stages send each other
    kw.update(overrides)
    cls = MLATransformerConfig if is_mla(flags) else TransformerConfig
    return cls(**kw)


def layer_spec(flags: Mapping[str, Any], attention: str = "sdpa", config=None, vp_stage: int | None = None):
    """megatron-core's local layer spec; core attention swapped for SDPA/flash (attention.py).

    With ``config``: the decoder block spec of this stage (layers.py: MoE layer pattern, MLA,
    GLM-4's sandwich norms, the Gated DeltaNet / gated-attention pattern of a hybrid)."""
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

    if attention not in ("sdpa", "local"):
        raise ValueError(f"attention must be 'sdpa' or 'local', got {attention!r}")
    core = None
    if attention == "sdpa":
        from slime.backends.megatron.attention import SDPACoreAttention

        core = SDPACoreAttention
    if config is not None:
        from slime.backends.megatron.layers import decoder_block_spec

        return decoder_block_spec(flags, config, core, vp_stage)
    spec = get_gpt_layer_local_spec(**layer_spec_kwargs(flags))
    if flag_bool(flags, "moe_grouped_gemm"):
        from slime.backends.megatron.grouped_experts import use_grouped_experts

        use_grouped_experts([spec])
    if core is not None:
        spec.submodules.self_attention.submodules.core_attention = core
    return spec


def build_model(flags: Mapping[str, Any], megatron: Mapping[str, Any] | None = None, *, attention: str = "sdpa",
                cpu: bool = False, init_weights: bool = True, vp_stage: int | None = None, **config_overrides):
    """One GPTModel chunk for this rank's pipeline stage (parallel state must be initialised)."""
    from megatron.core import parallel_state as ps
    from megatron.core.models.gpt import GPTModel

    megatron = megatron or {}
    overrides = dict(config_overrides)
    if cpu:
        overrides.update(use_cpu_initialization=True)
    if not init_weights:
        overrides.update(perform_initialization=False)
    config = make_config(flags, megatron, **overrides)
    tp = ps.get_tensor_model_parallel_world_size()
    mkw = gpt_model_kwargs(flags, tp)
    block = layer_spec(flags, attention, config=config, vp_stage=vp_stage)
    mtp = None
    if config.mtp_num_layers:
        from slime.backends.megatron.layers import mtp_block_spec

        mtp = mtp_block_spec(flags, config, block, vp_stage)
    model = GPTModel(
        config, block, mtp_block_spec=mtp,
        pre_process=ps.is_pipeline_first_stage(ignore_virtual=False, vp_stage=vp_stage),
        post_process=ps.is_pipeline_last_stage(ignore_virtual=False, vp_stage=vp_stage),
        parallel_output=True, vp_stage=vp_stage, **mkw,
    )
    if not cpu and torch.cuda.is_available():
        model = model.cuda(torch.cuda.current_device())
    return model


# --- the MTP block in training ------------------------------------------------------------------


def freeze_mtp(model) -> int:
    """Keep the MTP block's weights out of the optimizer (RL without ``--enable-mtp-training``);
    returns how many tensors were frozen. Call before wrapping the model in DDP."""
    m = unwrap(model)
    if getattr(m, "mtp", None) is None:
        return 0
    params = list(m.mtp.parameters())
    for p in params:
        p.requires_grad_(False)
    return len(params)


@contextmanager
def mtp_skipped(model):
    """Run the model without its MTP block: log-probs need only the main head, and a frozen MTP
    layer has no loss to compute. megatron-core's GPTModel runs the block whenever it is built
    (``mtp_process``) and splits its output by ``config.mtp_num_layers``: both are switched off
    for the duration and restored after."""
    m = unwrap(model)
    if not m.config.mtp_num_layers:
        yield
        return
    saved = (getattr(m, "mtp_process", False), m.config.mtp_num_layers)
    m.mtp_process, m.config.mtp_num_layers = False, None
    try:
        yield
    finally:
        m.mtp_process, m.config.mtp_num_layers = saved


# --- names with global layer numbers ----------------------------------------------------------


def unwrap(model):
    while hasattr(model, "module"):
        model = model.module
    return model


_LOCAL_EXPERT = ".mlp.experts.local_experts."


def global_named_parameters(model) -> Iterator[tuple[str, torch.Tensor]]:
    """``named_parameters`` (plus the MoE router's expert-bias buffers, which the checkpoint
    carries as ``e_score_correction_bias``) with pipeline-local layer indices and
    expert-parallel-local expert indices replaced by global ones."""
    from megatron.core import parallel_state as ps

    m = unwrap(model)
    offsets = {}
    if getattr(m, "decoder", None) is not None:
        offsets = {j: layer.layer_number - 1 for j, layer in enumerate(m.decoder.layers)}
    ep_rank = ps.get_expert_model_parallel_rank() if ps.model_parallel_is_initialized() else 0
    tensors = list(m.named_parameters()) + [(n, b) for n, b in m.named_buffers() if n.endswith("router.expert_bias")]
    for name, p in tensors:
        if name.startswith("decoder.layers."):
            j, rest = name[len("decoder.layers."):].split(".", 1)
            name = f"decoder.layers.{offsets[int(j)]}.{rest}"
        if _LOCAL_EXPERT in name and ep_rank:
            head, tail = name.split(_LOCAL_EXPERT)
            e, rest = tail.split(".", 1)
            local = m.config.num_moe_experts // ps.get_expert_model_parallel_world_size()
            name = f"{head}{_LOCAL_EXPERT}{ep_rank * local + int(e)}.{rest}"
        yield name, p


# --- HF -> model ------------------------------------------------------------------------------


class HFReader:
    """Lazy reader of an HF safetensors checkpoint (one tensor at a time, by name)."""

    def __init__(self, hf_dir: str | Path):
        from safetensors import safe_open

        self.dir = Path(hf_dir)
        index = self.dir / "model.safetensors.index.json"
        if index.exists():
            weight_map = json.loads(index.read_text())["weight_map"]
        else:
            files = sorted(self.dir.glob("*.safetensors"))
            if not files:
                raise FileNotFoundError(f"no *.safetensors in {self.dir}")
            weight_map = {}
            for f in files:
                with safe_open(str(f), "pt") as h:
                    weight_map.update({k: f.name for k in h.keys()})
        self.weight_map = weight_map
        self._open = safe_open
        self._handles: dict[str, Any] = {}

    def __contains__(self, name: str) -> bool:
        return name in self.weight_map

    def get(self, name: str) -> torch.Tensor:
        if name not in self.weight_map:
            raise KeyError(f"{name} not found in {self.dir}")
        fname = self.weight_map[name]
        if fname not in self._handles:
            self._handles[fname] = self._open(str(self.dir / fname), "pt")
        return self._handles[fname].get_tensor(name)


@torch.no_grad()
def load_hf_into(model, flags: Mapping[str, Any], get: Callable[[str], torch.Tensor],
                 progress: Callable[[str], None] | None = None) -> int:
    """Fill this rank's shard of ``model`` from HF tensors; returns the bytes copied."""
    from megatron.core import parallel_state as ps

    hm.require_mapped(flags)
    d = hm.dims_from_flags(flags)
    padded = padded_vocab_size(flags, ps.get_tensor_model_parallel_world_size())
    moved = 0
    last_layer = None
    for name, p in global_named_parameters(model):
        full = hm.hf_to_mcore(name, get, d, padded)
        tp, tp_rank, _ = tp_layout(name)
        shard = hm.shard_for_tp(name, full, tp, tp_rank, d)
        if tuple(shard.shape) != tuple(p.shape):
            raise ValueError(f"{name}: HF gives {tuple(shard.shape)}, the model has {tuple(p.shape)}")
        p.copy_(shard.to(dtype=p.dtype, device=p.device))
        moved += shard.numel() * shard.element_size()
        if progress is not None and name.startswith("decoder.layers."):
            layer = int(name.split(".")[2])
            if layer != last_layer:
                last_layer = layer
                progress(f"layer {layer + 1}/{d.num_layers}")
    return moved


# --- model -> HF ------------------------------------------------------------------------------


def is_expert(name: str) -> bool:
    """A routed expert's tensor (split over EP, and over the expert-TP group, not TP)."""
    return _LOCAL_EXPERT in name


def tp_layout(name: str) -> tuple[int, int, Any]:
    """(size, rank, group) of the tensor-parallel group that splits ``name``: the expert-TP group
    for routed experts (``--expert-tensor-parallel-size``, which may differ from TP), TP otherwise."""
    from megatron.core import parallel_state as ps

    if not ps.model_parallel_is_initialized():
        return 1, 0, None
    if is_expert(name):
        return (ps.get_expert_tensor_parallel_world_size(), ps.get_expert_tensor_parallel_rank(),
                ps.get_expert_tensor_parallel_group())
    return (ps.get_tensor_model_parallel_world_size(), ps.get_tensor_model_parallel_rank(),
            ps.get_tensor_model_parallel_group())


def _gather_tp(name: str, t: torch.Tensor, d: hm.Dims | None = None) -> torch.Tensor:
    tp, _, group = tp_layout(name)
    if tp == 1 or hm.tp_axis(name) is None:
        return t
    shards = [torch.empty_like(t) for _ in range(tp)]
    dist.all_gather(shards, t.contiguous(), group=group)
    return hm.merge_tp(name, shards, d)


def writes_tensor(name: str) -> bool:
    """Whether this rank is the one that writes ``name`` after the TP gather: TP rank 0 of the
    first data-parallel replica (for a routed expert, of the first expert-data-parallel replica,
    so that every EP rank writes its own experts)."""
    from megatron.core import parallel_state as ps

    if not ps.model_parallel_is_initialized():
        return True
    if is_expert(name):
        return ps.get_expert_tensor_parallel_rank() == 0 and ps.get_expert_data_parallel_rank() == 0
    return ps.get_tensor_model_parallel_rank() == 0 and ps.get_data_parallel_rank() == 0


@torch.no_grad()
def iter_hf_tensors(model, flags: Mapping[str, Any], dtype: torch.dtype | None = None,
                    device: str | torch.device | None = None, grads: bool = False,
                    only_written: bool = False) -> Iterator[tuple[str, torch.Tensor]]:
    """This pipeline stage's weights under HF names, TP-merged (every TP rank gets them all; this
    EP rank's experts under global names).

    ``dtype`` casts (None keeps the training dtype); ``device`` moves (None keeps them on the GPU).
    ``grads``: the parameters' gradients instead, laid out the same way (``main_grad`` under
    megatron's DDP). ``only_written``: yield only what :func:`writes_tensor` gives this rank (the
    gather still runs on every rank: it is collective).
    """
    hm.require_mapped(flags)
    d = hm.dims_from_flags(flags)
    copy_of_embedding = _holds_embedding_copy()
    for name, p in global_named_parameters(model):
        if d.tied and name == "output_layer.weight":
            continue  # tied: the HF checkpoint has embed_tokens only
        if copy_of_embedding and name.startswith("embedding."):
            continue  # the first stage's embedding, copied here for the MTP block: the first stage exports it
        t = p.data
        if grads:
            g = getattr(p, "main_grad", None)
            g = p.grad if g is None else g
            if g is None:
                continue  # buffers (router expert bias) and frozen weights have no gradient
            t = g
        full = _gather_tp(name, t, d)
        if only_written and not writes_tensor(name):
            continue
        for hf_name, t in hm.mcore_to_hf(name, full, d):
            if dtype is not None and not name.endswith("router.expert_bias"):  # kept fp32, as published
                t = t.to(dtype)
            if device is not None:
                t = t.to(device)
            yield hf_name, t


def _holds_embedding_copy() -> bool:
    """A pipeline stage other than the first that holds word embeddings holds megatron-core's copy
    of the first stage's (the MTP block on the last stage reads them; their gradients are summed
    over the embedding group, so the two stay equal)."""
    from megatron.core import parallel_state as ps

    return ps.model_parallel_is_initialized() and not ps.is_pipeline_first_stage(ignore_virtual=True)


def bucketed(named: Iterator[tuple[str, torch.Tensor]], bucket_bytes: int) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """Group (name, tensor) pairs into lists of at most ``bucket_bytes`` (a bigger tensor alone)."""
    bucket: list[tuple[str, torch.Tensor]] = []
    used = 0
    for name, t in named:
        size = t.numel() * t.element_size()
        if bucket and used + size > bucket_bytes:
            yield bucket
            bucket, used = [], 0
        bucket.append((name, t))
        used += size
    if bucket:
        yield bucket


def hf_config_from_flags(flags: Mapping[str, Any]) -> dict[str, Any]:
    """A config.json for the dense model when no HF template directory is given."""
    d = hm.dims_from_flags(flags)
    qwen = d.qkv_bias
    from slime.model_spec import flag_float, flag_int

    return {
        "architectures": ["Qwen2ForCausalLM" if qwen else "LlamaForCausalLM"],
        "model_type": "qwen2" if qwen else "llama",
        "hidden_size": d.hidden, "intermediate_size": flag_int(flags, "ffn_hidden_size"),
        "num_hidden_layers": d.num_layers, "num_attention_heads": d.heads,
        "num_key_value_heads": d.groups, "head_dim": d.head_dim, "vocab_size": d.vocab,
        "rms_norm_eps": flag_float(flags, "norm_epsilon", 1e-6), "rope_theta": flag_float(flags, "rotary_base", 10000.0),
        "max_position_embeddings": flag_int(flags, "max_position_embeddings", 32768),
        "tie_word_embeddings": d.tied, "hidden_act": "silu", "torch_dtype": "bfloat16",
        **({} if qwen else {"attention_bias": False, "mlp_bias": False}),
    }
