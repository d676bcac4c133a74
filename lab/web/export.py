"""An experiment's downloadable files: the rules find what is wrong, the renderer prints it.

The page's download, `POST /api/render` and `slime-lab render` all answer these, so the three are
byte-identical.
"""
from __future__ import annotations

from typing import Any

from lab.core.experiment import Experiment
from lab.render import render_all
from lab.rules.derive import derive
from lab.rules.validate import validate


def experiment_files(exp: Experiment, prov: dict[str, Any] | None = None) -> dict[str, str]:
    """Every file of `exp`, name -> content, with its findings and derived sizes."""
    derived = derive(exp)
    return render_all(exp, validate(exp, derived), derived, prov)
