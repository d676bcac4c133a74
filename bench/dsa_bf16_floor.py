#!/usr/bin/env python3
"""GLM-5 (DSA) in bf16 on the CPU: how far HF's own bf16 forward is from HF in fp32 (same bf16
weights), beside Megatron's bf16 forward against both. The DSA top-k over a random model's
near-flat index scores turns bf16 rounding into different key choices, in any implementation.

    PYTHONPATH=$PWD python3 bench/dsa_bf16_floor.py [--seq 300] [--out /tmp/dsa_floor]

Prints one JSON line. Reference: tools/reference_models.py's glm_moe_dsa fixture, built bf16.
Fake (as in tests/runtime/megatron_cpu_fakes.py): torch.cuda.current_device returns "cpu"; the
allgather token dispatcher stands in for alltoall.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
sys.path.insert(0, str(ROOT))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seq", type=int, default=300)
    ap.add_argument("--out", default="/tmp/dsa_floor")
    a = ap.parse_args()
    import reference_models as rm

    hf, spec = rm.build("glm_moe_dsa", Path(a.out), dtype="bfloat16")
    sys.modules["fla"] = None  # type: ignore[assignment]  # transformers' torch path
    import transformers

    ids = torch.randint(1, 256, (1, a.seq), generator=torch.Generator().manual_seed(0))
    tgt = ids[0, 1:, None]

    def tok_lp(logits: torch.Tensor) -> torch.Tensor:
        return torch.log_softmax(logits[0, :-1, :256].float(), -1).gather(-1, tgt)[:, 0]

    lp = {}
    seen: dict[int, dict] = {}  # HF bf16's indexer inputs and top-k, per layer that computes one
    for name, dt in (("hf_bf16", torch.bfloat16), ("hf_fp32", torch.float32)):
        m = transformers.AutoModelForCausalLM.from_pretrained(hf, dtype=dt, attn_implementation="eager").eval()
        if dt == torch.bfloat16:
            for i, layer in enumerate(m.model.layers):
                ix = getattr(layer.self_attn, "indexer", None)
                if ix is not None:
                    ix.register_forward_hook(lambda mod, args, kw, out, i=i: seen.__setitem__(
                        i, {"x": kw.get("hidden_states", args[0] if args else None),
                            "qr": kw.get("q_resid", args[1] if len(args) > 1 else None), "top": out}),
                        with_kwargs=True)
        with torch.no_grad():
            lp[name] = tok_lp(m(input_ids=ids).logits)
    from tests.runtime.megatron_cpu_fakes import install

    install(gated_delta_net=False)
    from slime.backends.megatron.model import HFReader, build_model, init_parallel, load_hf_into
    from slime.model_spec import load_flags

    flags = load_flags(spec)
    init_parallel({}, backend="gloo")
    model = build_model(flags, {}, cpu=True, init_weights=False, params_dtype=torch.bfloat16,
                        pipeline_dtype=torch.bfloat16, bf16=True, moe_token_dispatcher_type="allgather",
                        variable_seq_lengths=False)
    for p in model.parameters():
        p.data = p.data.to(torch.bfloat16)
    load_hf_into(model, flags, HFReader(hf).get)
    model.eval()
    with torch.no_grad():
        lp["megatron_bf16"] = tok_lp(model(ids, torch.arange(a.seq)[None], None))

    # Megatron's indexer on HF's own inputs: does it pick the same keys?
    causal = torch.full((a.seq, a.seq), float("-inf")).triu(1)
    differ, queries = 0, 0
    for i, c in seen.items():
        ix = model.decoder.layers[i].self_attention.core_attention.indexer
        with torch.no_grad():
            top = ix(c["x"].transpose(0, 1).contiguous(), c["qr"].transpose(0, 1).contiguous(), mask=causal)
        valid = torch.arange(a.seq) >= top.shape[-1]  # before that every key is picked
        mine, theirs = top[0].sort(-1).values, c["top"][0].long().sort(-1).values
        differ += int(((mine != theirs).any(-1) & valid).sum())
        queries += int(valid.sum())

    def gap(x: str, y: str) -> dict:
        d = (lp[x] - lp[y]).abs()
        return {"mean": round(float(d.mean()), 5), "max": round(float(d.max()), 4)}

    print(json.dumps({"seq": a.seq, "hf_bf16_vs_hf_fp32": gap("hf_bf16", "hf_fp32"),
                      "megatron_bf16_vs_hf_bf16": gap("megatron_bf16", "hf_bf16"),
                      "megatron_bf16_vs_hf_fp32": gap("megatron_bf16", "hf_fp32"),
                      "indexer_on_hf_inputs": {"layers": sorted(seen), "queries": queries, "topk_sets_differ": differ}}))


if __name__ == "__main__":
    main()
