"""Patch ``torch`` and ``unittest`` right after a process imports them, without importing them first.

A meta-path finder asks the other finders for the spec of ``torch`` / ``unittest`` and wraps its
loader's ``exec_module``: once the module ran, :mod:`.observe` installs its wrappers.  Nothing else in
the import changes; a process that never imports torch never loads it.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from typing import Any, Optional, Sequence

from . import observe

__all__ = ["start", "finder"]


def _after_torch(module: Any) -> None:
    observe.install_torch(module)


def _after_unittest(module: Any) -> None:
    observe.install_unittest_hook()


_AFTER = {"torch": _after_torch, "unittest": _after_unittest}


class _Loader(importlib.abc.Loader):
    def __init__(self, inner: Any, name: str) -> None:
        self._inner = inner
        self._name = name

    def create_module(self, spec: Any) -> Any:
        return self._inner.create_module(spec)

    def exec_module(self, module: Any) -> None:
        self._inner.exec_module(module)
        _AFTER[self._name](module)

    def __getattr__(self, name: str) -> Any:  # get_resource_reader, is_package, ...: the real loader's
        return getattr(self._inner, name)


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname: str, path: Optional[Sequence[str]], target: Any = None) -> Any:
        if fullname not in _AFTER:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _Loader(spec.loader, fullname)
                return spec
        return None


def finder() -> _Finder:
    """The finder :func:`start` installed (a new one when it has not)."""
    return next((f for f in sys.meta_path if isinstance(f, _Finder)), None) or _Finder()


def start(report: str) -> None:
    """Observe this process into *report*: now for modules already imported, else once imported."""
    observe._State.report = report
    for name, after in _AFTER.items():
        if name in sys.modules:
            after(sys.modules[name])
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
