"""The group sizes a parallel layout implies (TP x PP x CP, ETP x EP x PP, the data-parallel sizes)
have one home, slime/parallel_sizes.py: the runtime's validation and placement and the lab's rules
read it, and no other module multiplies the sizes itself."""

from __future__ import annotations

import ast
import itertools
from pathlib import Path

import pytest

from slime.parallel_sizes import (
    data_parallel_size,
    expert_data_parallel_size,
    model_parallel_size,
    train_unit,
)
from slime.ray.placement import parallel_layout

ROOT = Path(__file__).resolve().parents[2]
HOME = ROOT / "slime" / "parallel_sizes.py"
SIZE_NAMES = {"tp", "pp", "cp", "ep", "etp", "ETP"}


def _factors(node: ast.expr) -> list[ast.expr]:
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult):
        return _factors(node.left) + _factors(node.right)
    return [node]


def _size_name(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name) and node.id in SIZE_NAMES:
        return node.id
    if isinstance(node, ast.Attribute) and node.attr in SIZE_NAMES:
        return node.attr
    return None


def _group_products(path: Path) -> list[str]:
    """Products of three or more parallel sizes (a group size computed in place)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult):
            names = [_size_name(f) for f in _factors(node)]
            if len(names) >= 3 and all(names):
                found.append(f"{path.name}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_group_sizes_are_computed_only_in_their_home():
    files = [p for d in ("slime", "lab") for p in (ROOT / d).rglob("*.py") if p != HOME]
    found = [hit for p in files for hit in _group_products(p)]
    assert not found, "compute these with slime.parallel_sizes:\n" + "\n".join(found)


def test_the_scan_sees_a_group_size_computed_in_place(tmp_path):
    planted = tmp_path / "planted.py"
    planted.write_text("def f(r, n, ep, pp):\n    return n % (r.tp * r.pp * r.cp) or n % (ep * pp)\n")
    assert _group_products(planted) == ["planted.py:2: r.tp * r.pp * r.cp"]


@pytest.mark.parametrize("ranks", [1, 2, 4, 6, 8, 12, 16])
def test_placement_forms_exactly_the_groups_the_sizes_allow(ranks):
    for tp, pp, cp, ep in itertools.product((1, 2, 4), (1, 2), (1, 2), (1, 2, 4)):
        megatron = {"tensor_model_parallel_size": tp, "pipeline_model_parallel_size": pp,
                    "context_parallel_size": cp, "expert_model_parallel_size": ep}
        dp, edp = data_parallel_size(ranks, tp, pp, cp), expert_data_parallel_size(ranks, tp, ep, pp)
        if not dp or not edp:
            with pytest.raises(ValueError):
                parallel_layout(megatron, ranks)
            continue
        layout = parallel_layout(megatron, ranks)
        assert len(layout) == ranks == dp * model_parallel_size(tp, pp, cp)
        assert {r.dp for r in layout} == set(range(dp))


def test_a_moe_pool_tiles_both_the_dense_and_the_expert_groups():
    assert train_unit(2, 2, 1) == 4
    assert train_unit(2, 1, 1, moe=True, etp=1, ep=4) == 4
    assert train_unit(2, 2, 2, moe=True, etp=1, ep=8) == 16  # lcm(8, 16)
    assert data_parallel_size(6, 4, 1) == 0 and data_parallel_size(8, 2, 2, 2) == 1
