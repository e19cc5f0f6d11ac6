"""Golden records of required globals that do not depend on how the file was run.

A class defined in a file run as a script (``python test_foo.py``, pytorch's habit)
is pickled as ``__main__.Name``; imported as a module it is ``test_foo.Name``.
The record pins the importable name, so both runs agree.
"""

from __future__ import annotations

import os
import sys
from typing import Sequence

__all__ = ["stable_names"]


def main_module_names() -> list[str]:
    """Module names under which the ``__main__`` script could also be imported (best first)."""
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if not path:
        return []
    spec = getattr(main, "__spec__", None)
    names = [spec.name] if spec is not None and spec.name and spec.name != "__main__" else []
    path = os.path.splitext(os.path.abspath(path))[0]
    parts = path.split(os.sep)
    # the file's dotted name relative to each sys.path entry that holds it, shortest first
    for entry in sys.path:
        root = os.path.abspath(entry or os.getcwd())
        if path.startswith(root + os.sep):
            dotted = path[len(root) + 1:].replace(os.sep, ".")
            if dotted not in names:
                names.append(dotted)
    if parts[-1] not in names:
        names.append(parts[-1])
    return names


def stable_names(names: Sequence[str], expect: str) -> list[str]:
    """*names* with ``__main__.X`` renamed to the script's importable module name.

    A name already pinned in *expect* under one of the script's possible module names is
    kept as pinned; otherwise the shortest importable name is used.
    """
    if not any(n.startswith("__main__.") for n in names):
        return list(names)
    candidates = main_module_names()
    pinned = set(expect.splitlines())
    out = []
    for name in names:
        if name.startswith("__main__.") and candidates:
            rest = name[len("__main__."):]
            options = [f"{module}.{rest}" for module in candidates]
            chosen = next((o for o in options if o in pinned), None)
            name = chosen or min(options, key=len)
        out.append(name)
    return sorted(out)
