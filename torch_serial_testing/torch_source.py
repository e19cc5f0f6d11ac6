"""The running torch's own source text, read straight from its files.

Several rules are read from torch's source rather than assumed from its version (how
``torch.load`` reads the ``TORCH_FORCE_*`` switches, which opcodes and globals the
weights-only unpickler handles).  ``inspect.getsource`` would do, but it first looks for the
module owning the code by walking every entry of ``sys.modules`` -- thousands once torch is
imported, about 20 ms per process.  A function's code object already names its file and first
line, so this reads those lines (through ``linecache``, as ``inspect`` does) and cuts the
block with ``inspect.getblock``: the same text, without the walk.
"""

from __future__ import annotations

import inspect
import linecache
import types
from typing import Any

__all__ = ["source_of"]


def source_of(obj: Any) -> str:
    """The source of a function (or method) or a module; raises ``OSError`` when it is unavailable."""
    if isinstance(obj, types.ModuleType):
        filename = getattr(obj, "__file__", None)
        lines = linecache.getlines(filename) if filename else []
        if not lines:
            raise OSError(f"no source for module {obj.__name__}")
        return "".join(lines)
    fn = inspect.unwrap(obj)
    code = getattr(fn, "__code__", None)
    if code is None:
        raise TypeError(f"{obj!r} is not a function")
    lines = linecache.getlines(code.co_filename)
    if len(lines) < code.co_firstlineno:
        raise OSError(f"no source for {getattr(fn, '__qualname__', fn)!r}")
    return "".join(inspect.getblock(lines[code.co_firstlineno - 1:]))
