"""TP / PP / EP / CP / ZeRO diagrams are drawn at the experiment's own sizes (lab/render/diagrams.py)."""
from __future__ import annotations

from lab.render.diagrams import MAX_DRAWN, loop_diagram, parallel_diagrams
from lab.rules.dependents import apply_change, new_experiment
from lab.rules.derive import derive, recipe_and_spec


def _diagrams(name: str, **changes):
    e = new_experiment(name)
    for path, value in changes.items():
        e = apply_change(e, path.replace("__", "."), value)[0]
    return parallel_diagrams(e, recipe_and_spec(e)[1], derive(e).dp), e


def test_each_dimension_draws_as_many_cells_as_its_size_when_small():
    d, e = _diagrams("qwen3.8-27b")
    assert d["tp"]["size"] == e.resources.tp == len(d["tp"]["cells"]) == 4
    assert [c["params"]["layers"] for c in d["pp"]["cells"]] == ["0–33", "34–63"]  # last stage holds 30 layers
    assert d["ep"]["cells"] == [] and d["ep"]["key"] == "diag_ep_dense"


def test_large_counts_are_summarised_with_an_elided_run():
    d, e = _diagrams("glm5.3")
    ep = d["ep"]
    assert ep["size"] == e.resources.ep > MAX_DRAWN
    assert len(ep["cells"]) <= MAX_DRAWN
    more = [c for c in ep["cells"] if c.get("ellipsis")]
    assert len(more) == 1 and more[0]["params"]["n"] + len(ep["cells"]) - 1 == ep["size"]
    assert ep["cells"][-1]["params"]["experts"] == "248–255" and ep["params"]["experts"] == 256


def test_cp_is_zigzag_pairs_or_all_gather_by_model_spec():
    d, _ = _diagrams("glm4-9b", resources__cp=2)
    assert d["cp"]["mode"] == "zigzag"
    assert [(c["params"]["a"], c["params"]["b"]) for c in d["cp"]["cells"]] == [(0, 3), (1, 2)]
    d, _ = _diagrams("glm5.3", resources__cp=2)
    assert d["cp"]["mode"] == "allgather"


def test_zero_draws_one_shard_per_data_parallel_rank_and_moves_to_host_with_cpu_adam():
    d, e = _diagrams("glm4-9b", resources__cp=1)
    assert d["zero"]["size"] == derive(e).dp == 2 and d["zero"]["key"] == "diag_zero_note"
    d, _ = _diagrams("glm4-9b", resources__cp=1, resources__cpu_adam=True)
    assert d["zero"]["key"] == "diag_zero_cpu"


def test_a_dimension_of_size_one_says_nothing_is_split_instead_of_one_of_one():
    d, e = _diagrams("glm4-9b", resources__tp=1, resources__cp=1)
    assert (e.resources.tp, e.resources.pp, e.resources.cp) == (1, 1, 1)
    assert [d[k]["key"] for k in ("tp", "pp", "cp")] == ["diag_tp_off", "diag_pp_off", "diag_cp_off"]
    d, e = _diagrams("glm4-9b")  # TP 2 x CP 2 on 4 training GPUs: one data-parallel rank
    assert derive(e).dp == 1 and d["zero"]["key"] == "diag_zero_note_one"


def _loop(name: str, **changes):
    e = new_experiment(name)
    for path, value in changes.items():
        e = apply_change(e, path.replace("__", "."), value)[0]
    recipe = recipe_and_spec(e)[0]
    return loop_diagram(e, recipe.backends.train, recipe.backends.rollout)


def test_the_loop_strip_names_this_experiments_engine_buffer_and_trainer():
    assert _loop("glm4-9b") == {"sample": "loop_sample", "batch": "loop_batch_sync", "update": "loop_update",
                                "weights": "loop_weights"}
    assert _loop("glm4-9b", placement__scheduling="async")["batch"] == "loop_batch_async"
    assert _loop("glm4-9b", placement__scheduling="async", rollout__queue=True)["batch"] == "loop_batch_queue"
    assert _loop("tiny-cpu") == {"sample": "loop_sample_embedded", "batch": "loop_batch_sync",
                                 "update": "loop_update_embedded", "weights": "loop_weights_embedded"}
    external = _loop("glm4-9b", placement__external_engine_addrs=["10.0.0.5:30000"], placement__ownership="external")
    assert external["sample"] == "loop_sample_external" and external["weights"] == "loop_weights"
