"""Where a test file's tests start, read from its source: what pytest and unittest should point at."""

from __future__ import annotations

import ast
from pathlib import Path


def def_lines_of(path: Path) -> dict:
    """Method name -> 1-based first line (decorator or def) of every ``def test_*`` in *path*."""
    tree = ast.parse(path.read_text())
    out = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name.startswith("test"):
            out[node.name] = min([node.lineno] + [d.lineno for d in node.decorator_list])
    return out
