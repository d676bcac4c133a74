"""slime/ has no back-arrows: no import cycle, no import of another module's private names, no arrow
the layering forbids (tools/import_graph.py computes the graph; its FORBIDDEN rules say why)."""

from __future__ import annotations

import pytest

from tests.tree_files import write_tree
from tools.import_graph import Graph, build


@pytest.fixture(scope="module")
def graph() -> Graph:
    return build()  # parses every module of slime/ once


def test_slime_has_no_import_cycle(graph):
    assert graph.cycles() == []


def test_no_module_of_slime_imports_another_modules_private_names(graph):
    assert graph.private_imports() == []


def test_no_forbidden_arrow(graph):
    assert graph.forbidden() == []


def test_the_graph_reaches_what_the_layers_are_about(graph):
    """The checks above see the real arrows: the parser reaches the registry, a rollout engine the
    inference engine, the loop the Ray runtime (an empty graph would pass them all)."""
    edges = graph.edges
    assert "slime.backends.registry" in edges["slime.args"]
    assert "slime.inference.engine_core" in edges["slime.rollout.engines.embedded"]
    assert {"slime.rollout.generate", "slime.rollout.producers"} <= edges["slime.rollout.manager"]
    assert "slime.ray.runtime" in edges["slime.loop"]


def test_each_kind_of_back_arrow_is_found(tmp_path):
    """A tree with one of each: a cycle hidden in a function, a private name taken (from-import,
    relative import and module attribute), a parser importing a backend, an engine importing Ray."""
    g = build(write_tree(tmp_path, {
        "slime/__init__.py": "",
        "slime/args.py": "from slime.backends.embedded.capabilities import checks\n"
                         "from slime.backends.registry import names\n",
        "slime/backends/__init__.py": "",
        "slime/backends/registry.py": "names = []\n",
        "slime/backends/embedded/__init__.py": "",
        "slime/backends/embedded/capabilities.py": "def checks(): ...\n",
        "slime/rollout/__init__.py": "",
        "slime/rollout/manager.py": "from slime.rollout.producers import sample_id\n_fill = 1\n",
        "slime/rollout/producers.py": "def sample_id(): ...\n\ndef f():\n    from slime.rollout.manager import _fill\n",
        "slime/rollout/queue.py": "from . import manager\nfrom .producers import _hidden\nx = manager._fill\n",
        "slime/inference/__init__.py": "",
        "slime/inference/engine_core.py": "import slime.ray.actors as actors\n",
        "slime/ray/__init__.py": "",
        "slime/ray/actors.py": "",
    }))
    assert g.cycles() == [["slime.rollout.manager", "slime.rollout.producers"]]
    assert g.private_imports() == [
        "slime.rollout.producers:4 takes _fill from slime.rollout.manager",
        "slime.rollout.queue:2 takes _hidden from slime.rollout.producers",
        "slime.rollout.queue:3 takes _fill from slime.rollout.manager",
    ]
    forbidden = g.forbidden()
    assert [f.split(" (")[0] for f in forbidden] == [
        "slime.args:1 -> slime.backends.embedded.capabilities",
        "slime.inference.engine_core:1 -> slime.ray.actors",
    ]
    assert "slime.args:2" not in " ".join(forbidden)  # the registry is the parser's way to a backend
