"""A throwaway source tree for tests of the tools that read one (tools/import_graph.py)."""

from __future__ import annotations

from pathlib import Path


def write_tree(root: Path, files: dict[str, str]) -> Path:
    """Write each relative path's text under root (folders made as needed); returns root."""
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root
