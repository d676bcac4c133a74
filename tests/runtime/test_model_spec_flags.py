"""Every flag a model spec (scripts/models/*.sh) puts into MODEL_ARGS reaches the Megatron backend:
an experiment.sh sources the spec and passes MODEL_ARGS to train.py, so an unknown one would stop
the run before it starts."""
from __future__ import annotations

from pathlib import Path

from slime.args import _split_passthrough as split_passthrough
from slime.backends.megatron.model_args import read_model_args

SPECS = sorted((Path(__file__).resolve().parents[2] / "scripts" / "models").glob("*.sh"))


def test_the_model_specs_are_all_seen() -> None:
    """The glob finds every spec a recipe names (so the test below checks them all)."""
    import re

    root = Path(__file__).resolve().parents[2]
    named = {m.group(1) for r in (root / "recipes").glob("*.yaml")
             for m in re.finditer(r"^model_spec: scripts/models/(\S+\.sh)$", r.read_text(), re.M)}
    assert len(named) >= 8 and named <= {p.name for p in SPECS}


def test_every_model_spec_flag_is_passed_to_megatron() -> None:
    for spec in SPECS:
        argv = read_model_args(spec)
        rest, megatron, _ = split_passthrough(argv)
        assert rest == [], f"{spec.name}: flags the runtime would refuse: {rest}"
        assert megatron, spec.name


def test_a_megatron_flag_with_several_values_passes_through_whole() -> None:
    rest, megatron, _ = split_passthrough(["--spec", "my_pkg.specs", "layer_spec", "--sequence-parallel",
                                           "--num-layers", "2", "--lr", "1e-6"])
    assert rest == ["--lr", "1e-6"]
    assert megatron == {"spec": ["my_pkg.specs", "layer_spec"], "sequence_parallel": True, "num_layers": "2"}
