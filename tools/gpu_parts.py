#!/usr/bin/env python3
"""The GPU suite (``pytest -m gpu tests/gpu``) cut into parts that each finish well inside one
device command (10 minutes; each part is planned for under 8 on one H200).

The table below is the one source of truth; ``tools/run_gpu_tests.sh --list`` / ``--part N`` read
it through this module:

    python3 tools/gpu_parts.py list               # parts, their pytest selections and budgets
    python3 tools/gpu_parts.py args N             # part N's pytest arguments, one per line
    python3 tools/gpu_parts.py summary N XML OUT  # part N's junit XML -> a JSON summary

Budgets are estimates from the H200 runs in docs/benchmarks.md: the six glm4 / glm4_moe family
tests (two fixtures with a conversion each) passed inside a 170 s limit, ~30 s per family test
with its share of the conversion; the tiny-Qwen2 correctness tests (5 with the round trip)
fit in one run with the 3B benchmark shapes. Each part holds at most three families' worth
of conversions so that a slow family (Qwen3.5's DeltaNet, DeepSeek-V3's 16 experts) still fits.
The family recipes (parts 6 and 7: three recipes each through experiment.sh, one Ray head per part)
are planned from the tiny-gpu loop on the H200 (prepare 14 s, convert 20 s, ray start 13 s) plus
about a minute and a half per recipe for the job's start-up and its 3 rollouts: not yet measured.
"""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Part:
    name: str
    what: str
    args: tuple[str, ...]  # pytest arguments after ``-m gpu``
    budget_s: int  # planned wall time on one H200 (estimate, see the module docstring)


_FAM = "tests/gpu/test_families_gpu.py"
_B = "deepseek_v3 or glm_moe_dsa or qwen3_5"  # families-b; families-a is the rest of the file
_RECIPES = "tests/gpu/test_family_recipes_gpu.py"
_RB = _B  # family-recipes-b: the same three families, one recipe each
PARTS: tuple[Part, ...] = (
    Part("megatron-core", "tiny Qwen2: round trip, refusal, forward vs HF, GRPO step + sync, resume, CPU Adam, SC; "
         "packing 1/2/4/8 micro-batches; grouped-GEMM experts vs SequentialMLP in bf16",
         ("tests/gpu/test_megatron_gpu.py", "tests/gpu/test_megatron_packing.py",
          "tests/gpu/test_grouped_experts_gpu.py"), 390),
    Part("families-a", "glm4, glm4_moe, glm4_moe_lite: round trip, forward vs HF, GRPO step-1 KL 0",
         (_FAM, "-k", f"not ({_B})"), 300),
    Part("families-b", "deepseek_v3, glm_moe_dsa, qwen3_5: round trip, forward vs HF, GRPO step-1 KL 0",
         (_FAM, "-k", _B), 420),
    Part("mtp-critic", "MTP layers (round trip, head vs published formula, frozen unless trained) of 4 families; "
         "the PPO critic on the GPU with offload; offload's host buffers kept between steps",
         ("tests/gpu/test_mtp_gpu.py", "tests/gpu/test_embedded_critic_gpu.py", "tests/gpu/test_offload_gpu.py"), 420),
    Part("engine-memory", "embedded engine (graph decoding, bf16 default); memory estimates (Megatron 1.5B / 7B-16L, "
         "engine)",
         ("tests/gpu/test_embedded_engine_gpu.py", "tests/gpu/test_memory_estimate_gpu.py"), 360),
    Part("family-recipes-a", "tiny-gpu-glm4, -glm4-moe, -glm4-moe-lite through experiment.sh: prepare, convert, check, "
         "train 3 rollouts colocated (KL 0 at step 1, |Δ log-prob| and post-sync check <= 0.1)",
         (_RECIPES, "-k", f"not ({_RB})"), 450),
    Part("family-recipes-b", "tiny-gpu-deepseek-v3, -glm-moe-dsa, -qwen3-5 through experiment.sh (Qwen3.5 on Hopper: "
         "the wheel set of tools/build_device_wheels.py --with-tilelang)",
         (_RECIPES, "-k", _RB), 470),
)


def part(n: int | str) -> Part:
    """Part ``n`` (1-based), or a ValueError naming the valid numbers."""
    try:
        i = int(n)
    except (TypeError, ValueError):
        i = 0
    if not 1 <= i <= len(PARTS):
        raise ValueError(f"--part must be a number from 1 to {len(PARTS)} (got {n!r}); see --list")
    return PARTS[i - 1]


def listing() -> str:
    lines = []
    for i, p in enumerate(PARTS, 1):
        lines.append(f"part {i}: {p.name} (~{p.budget_s // 60} min {p.budget_s % 60:02d} s planned): {p.what}")
        lines.append(f"    pytest -m gpu {' '.join(_quote(a) for a in p.args)}")
    return "\n".join(lines)


def _quote(a: str) -> str:
    return f'"{a}"' if " " in a else a


def summary(n: int, junit_xml: str | Path, out_json: str | Path, rc: int | None = None) -> dict:
    """pytest's junit XML of part ``n`` -> {part, name, counts, seconds, tests: [{id, outcome, seconds, message}]}."""
    p = part(n)
    tests = []
    root = ET.parse(str(junit_xml)).getroot()
    for case in root.iter("testcase"):
        outcome, message = "passed", ""
        for tag in ("failure", "error", "skipped"):
            el = case.find(tag)
            if el is not None:
                outcome = {"failure": "failed", "error": "error", "skipped": "skipped"}[tag]
                message = (el.get("message") or "")[:500]
                break
        cls = case.get("classname", "")
        tests.append({"id": f"{cls.replace('.', '/')}.py::{case.get('name')}" if cls else case.get("name"),
                      "outcome": outcome, "seconds": round(float(case.get("time") or 0.0), 2), "message": message})
    counts: dict[str, int] = {}
    for t in tests:
        counts[t["outcome"]] = counts.get(t["outcome"], 0) + 1
    res = {"part": n, "name": p.name, "budget_s": p.budget_s, "pytest_exit": rc, "counts": counts,
           "seconds": round(sum(t["seconds"] for t in tests), 1), "tests": tests}
    Path(out_json).write_text(json.dumps(res, indent=1) + "\n")
    return res


def main(argv: list[str]) -> int:
    try:
        if argv[:1] == ["list"]:
            print(listing())
        elif argv[:1] == ["count"]:
            print(len(PARTS))
        elif argv[:1] == ["args"] and len(argv) == 2:
            print("\n".join(part(argv[1]).args))
        elif argv[:1] == ["summary"] and len(argv) in (4, 5):
            part(argv[1])
            res = summary(int(argv[1]), argv[2], argv[3], int(argv[4]) if len(argv) == 5 else None)
            print(f"part {res['part']} ({res['name']}): {res['counts']} in {res['seconds']} s -> {argv[3]}")
        else:
            print("usage: gpu_parts.py list | count | args N | summary N JUNIT_XML OUT_JSON [PYTEST_EXIT]",
                  file=sys.stderr)
            return 2
    except ValueError as exc:
        print(str(exc), file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
