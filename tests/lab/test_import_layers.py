"""lab/'s arrows point one way, web → render → rules → core: no import cycle, no import of another
module's private names, no arrow from a lower layer to a higher one (tools/import_graph.py computes
the graph; LAB_FORBIDDEN says which arrows point the wrong way)."""

from __future__ import annotations

import pytest

from tests.tree_files import write_tree
from tools.import_graph import LAB_FORBIDDEN, LAB_LAYERS, ROOT, Graph, build, modules


@pytest.fixture(scope="module")
def graph() -> Graph:
    return build(package="lab")  # parses every module of lab/ once


def test_lab_has_no_import_cycle(graph):
    assert graph.cycles() == []


def test_no_module_of_lab_imports_another_modules_private_names(graph):
    assert graph.private_imports() == []


def test_no_arrow_points_from_a_lower_layer_to_a_higher_one(graph):
    assert graph.forbidden(LAB_FORBIDDEN) == []


def test_every_module_of_lab_lives_in_a_layer():
    """A module beside the layers would sit outside every rule: each one is in a layer's folder."""
    loose = [m for m in modules(ROOT, "lab") if m != "lab" and not any(m == layer or m.startswith(layer + ".")
                                                                       for layer in LAB_LAYERS)]
    assert loose == []


def test_the_graph_reaches_each_layer_from_the_one_above(graph):
    """The checks above see the real arrows (an empty graph would pass them all)."""
    edges = graph.edges
    assert "lab.render" in edges["lab.web.export"] and "lab.rules.validate" in edges["lab.web.export"]
    assert "lab.rules.derive" in edges["lab.web.workspace_view"]
    assert "lab.core.train_flags" in edges["lab.render"]
    assert "lab.core.argv" in edges["lab.rules.runtime_verdict"]
    assert "lab.core.workspace" in edges["lab.rules.edit"]


def test_each_kind_of_wrong_way_arrow_is_found(tmp_path):
    """A lab with one of each: core importing rules (inside a function), rules importing render,
    render importing web, and a private name taken across modules."""
    g = build(write_tree(tmp_path, {
        "lab/__init__.py": "",
        "lab/core/__init__.py": "",
        "lab/core/workspace.py": "def edit():\n    from lab.rules.dependents import apply_change\n",
        "lab/rules/__init__.py": "",
        "lab/rules/dependents.py": "from lab.core.workspace import edit\ndef apply_change(): ...\n",
        "lab/rules/validate.py": "from lab.render.context import yaml_value\n",
        "lab/render/__init__.py": "from lab.web import body\n",
        "lab/render/context.py": "from lab.core.workspace import _hidden\n",
        "lab/web/__init__.py": "",
        "lab/web/body.py": "from lab.render import context\n",
    }), package="lab")
    assert g.cycles() == [["lab.core.workspace", "lab.rules.dependents"]]
    assert g.private_imports() == ["lab.render.context:1 takes _hidden from lab.core.workspace"]
    assert [f.split(" (")[0] for f in g.forbidden(LAB_FORBIDDEN)] == [
        "lab.core.workspace:2 -> lab.rules.dependents",
        "lab.render:1 -> lab.web.body",
        "lab.rules.validate:1 -> lab.render.context",
    ]
