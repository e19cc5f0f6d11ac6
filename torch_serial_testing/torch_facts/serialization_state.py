"""torch's serialization machinery as process state: the genuine ``load``/``save`` and what a test
could change to subvert every later load.

**The genuine functions.**  :func:`genuine` returns torch's own ``torch.serialization.load`` /
``save``: found the first time the library needs it among ``torch.serialization.<name>`` and
``torch.<name>``, and accepted only by identity -- a function whose ``__globals__`` *is*
torch.serialization's namespace, named so by its code -- never by ``__module__`` or ``__name__``
(``functools.wraps`` copies those).  Every later call checks that its ``__code__``, ``__defaults__``
and ``__kwdefaults__`` are still the captured ones; if not, :class:`~.probes.ProbeFailed`.

**The snapshot.**  :func:`capture` reads, by identity: ``torch.load`` and ``torch.save``; every name
in the namespaces of ``torch.serialization``, ``torch._weights_only_unpickler`` and ``torch._utils``
(the functions torch's loads call through and the rebuild functions its allowlist holds); the code
and defaults of every function, and the attributes of every class, those modules define; torch's
built-in allowlist (the dict ``_get_allowed_globals()`` returns, cached by torch, so a mutation
persists) and the storage-location registry (``register_package``).  :meth:`SerializationState.restore`
puts each back and returns one line per change, naming it and the fix.  The safe-globals registry
(``_marked_safe_globals_*``) is left to :mod:`.registry`, and the library's own ``warnings`` proxy
inside torch.serialization (installed only during a load) counts as the module it stands in for.
"""

from __future__ import annotations

import operator
import sys
import types
from typing import Any, Optional

from .probes import ProbeFailed

__all__ = ["genuine", "is_genuine", "replaced_by", "SerializationState", "WATCHED_MODULES"]

#: Modules whose whole namespace is state.
WATCHED_MODULES = ("torch.serialization", "torch._weights_only_unpickler", "torch._utils")
#: Names in the ``torch`` namespace that are state.
TORCH_NAMES = ("load", "save")
#: Names another part of the library restores (the safe-globals registry: :mod:`.registry`), and the
#: ``warnings`` module's own bookkeeping (it adds ``__warningregistry__`` where a warning is raised).
_BOOKKEEPING = frozenset({"__warningregistry__"})
_MANAGED = {
    "torch.serialization": _BOOKKEEPING,
    "torch._utils": _BOOKKEEPING,
    "torch._weights_only_unpickler": _BOOKKEEPING | {"_marked_safe_globals_set", "_marked_safe_globals_list"},
}

_FIX = (
    "patch it only for the duration of a block (unittest.mock.patch as a context manager or decorator) "
    "or undo it in a finally or addCleanup"
)

# -- torch's own load and save ------------------------------------------------------------------------

_genuine: dict[str, tuple[Any, Any, Any, Any]] = {}


def _ser() -> Any:
    import torch.serialization

    return torch.serialization


def _own_function(fn: Any, name: str) -> bool:
    """Whether *fn* is a function torch.serialization defines under *name* (asked of the object)."""
    ser = _ser()
    return (
        isinstance(fn, types.FunctionType)
        and fn.__globals__ is vars(ser)
        and fn.__code__.co_name == name
        and fn.__name__ == name
    )


def _kwdefaults(fn: Any) -> Optional[dict[str, Any]]:
    kw = fn.__kwdefaults__
    return None if kw is None else dict(kw)


def genuine(name: str) -> Any:
    """torch's own ``torch.serialization.<name>`` (``load`` or ``save``), verified unchanged."""
    import torch

    entry = _genuine.get(name)
    if entry is None:
        ser = _ser()
        candidates: tuple[Any, ...] = (vars(ser).get(name), getattr(torch, name, None))
        for candidate in candidates:
            if _own_function(candidate, name):
                entry = _genuine[name] = (candidate, candidate.__code__, candidate.__defaults__, _kwdefaults(candidate))
                break
        else:
            raise ProbeFailed(
                f"neither torch.serialization.{name} nor torch.{name} is torch's own function (they are "
                f"{_describe(vars(ser).get(name))} and {_describe(getattr(torch, name, None))}); the library "
                f"calls only torch's own: remove the replacement installed before it first ran"
            )
    fn, code, defaults, kwdefaults = entry
    if fn.__code__ is not code or fn.__defaults__ != defaults or _kwdefaults(fn) != kwdefaults:
        raise ProbeFailed(
            f"torch.serialization.{name} was changed in place (its __code__, __defaults__ or __kwdefaults__: "
            f"now {_kwdefaults(fn)!r}, was {kwdefaults!r}); the library will not call it: {_FIX}"
        )
    return fn


def is_genuine(fn: Any, name: str) -> bool:
    """Whether *fn* is the very function :func:`genuine` returns for *name*."""
    try:
        return fn is genuine(name)
    except ProbeFailed:
        return False


def _describe(obj: Any) -> str:
    if obj is None:
        return "missing"
    module = getattr(obj, "__module__", None) or "?"
    qualname = getattr(obj, "__qualname__", None) or type(obj).__name__
    return f"{module}.{qualname}" + (" (functools.wraps of torch's)" if hasattr(obj, "__wrapped__") else "")


def replaced_by(name: str = "load") -> Optional[str]:
    """Who ``torch.<name>`` is, when it is not torch's own function (None: it is :func:`genuine`, or
    another function torch.serialization defines under that name, asked of the object)."""
    import torch

    fn = getattr(torch, name, None)
    return None if is_genuine(fn, name) or _own_function(fn, name) else _describe(fn)


# -- the snapshot ---------------------------------------------------------------------------------------


def _same(now: Any, then: Any) -> bool:
    if now is then:
        return True
    real = getattr(type(now), "_tst_stands_in_for", None)  # the library's warnings proxy during a load
    return real is not None and getattr(now, "_tst_real", None) is then


_NOT_DATA = (type, types.FunctionType, types.BuiltinFunctionType, types.MethodType, types.ModuleType)


def _same_entry(now: Any, then: Any) -> bool:
    """The same allowlist value: the very object, or a plain data object of the same class and state
    (torch builds a fresh ``StorageType`` per legacy storage name whenever its cache is refilled)."""
    if now is then:
        return True
    if type(now) is not type(then) or isinstance(now, _NOT_DATA):
        return False
    state = getattr(now, "__dict__", None)
    return state is not None and state == getattr(then, "__dict__", None)


_Members = tuple[list[tuple[str, Any]], list[tuple[str, type]]]
_members_seen: dict[str, tuple[dict[str, Any], _Members]] = {}


def _members(module_name: str, module: Any, space: dict[str, Any]) -> _Members:
    """The functions and classes *module* defines (remembered while its namespace is unchanged)."""
    seen = _members_seen.get(module_name)
    if seen is not None and _unchanged(space, seen[0]):
        return seen[1]
    functions: list[tuple[str, Any]] = []
    classes: list[tuple[str, type]] = []
    for name, value in space.items():
        if isinstance(value, types.FunctionType) and value.__globals__ is vars(module):
            functions.append((name, value))
        elif isinstance(value, type) and value.__module__ == module_name:
            classes.append((name, value))
    _members_seen[module_name] = (space, (functions, classes))
    return functions, classes


def _unchanged(now: Any, then: dict[str, Any]) -> bool:
    """Fast path: the same names, in the same order, bound to the very same objects (a dict keeps
    insertion order, so an untouched namespace compares in one pass at C speed)."""
    return (
        len(now) == len(then)
        and all(map(operator.is_, now.values(), then.values()))
        and all(map(operator.is_, now, then))
    )


def _class_attrs(cls: type) -> dict[str, Any]:
    return dict(vars(cls))


class SerializationState:
    """Everything listed in the module docstring, read by identity (a plain class: made per test)."""

    __slots__ = ("torch_names", "namespaces", "functions", "classes", "allowlist", "packages")

    def __init__(self) -> None:
        import torch

        self.torch_names = {n: vars(torch).get(n) for n in TORCH_NAMES}
        self.namespaces: dict[str, dict[str, Any]] = {}
        self.functions: dict[tuple[str, str], tuple[Any, Any, Any, Optional[dict[str, Any]]]] = {}
        self.classes: dict[tuple[str, str], tuple[type, dict[str, Any]]] = {}
        for module_name in WATCHED_MODULES:
            module = sys.modules.get(module_name)
            if module is None:
                continue
            space = self.namespaces[module_name] = dict(vars(module))  # managed names: skipped when compared
            functions, classes = _members(module_name, module, space)
            for name, fn in functions:
                self.functions[(module_name, name)] = (fn, fn.__code__, fn.__defaults__, _kwdefaults(fn))
            for name, cls in classes:
                self.classes[(module_name, name)] = (cls, _class_attrs(cls))
        table = self._table()
        self.allowlist = dict(table) if table is not None else None
        self.packages = list(getattr(_ser(), "_package_registry", None) or ())

    @staticmethod
    def _table() -> Optional[dict[str, Any]]:
        wou = sys.modules.get("torch._weights_only_unpickler")
        getter = getattr(wou, "_get_allowed_globals", None)
        return getter() if getter is not None else None

    def restore(self) -> list[str]:
        """Put everything back; one line per change (what changed, and the fix)."""
        import torch

        changes: list[str] = []
        for name, then in self.torch_names.items():
            now = vars(torch).get(name)
            if now is not then:
                changes.append(f"torch.{name} is {_describe(now)} (was {_describe(then)})")
                setattr(torch, name, then)
        for module_name, space in self.namespaces.items():
            module = sys.modules.get(module_name)
            if module is not None and not _unchanged(vars(module), space):
                changes += self._restore_namespace(module_name, space)
        for (module_name, name), (fn, code, defaults, kwdefaults) in self.functions.items():
            if fn.__code__ is not code or fn.__defaults__ is not defaults or fn.__kwdefaults__ != kwdefaults:
                changes.append(f"{module_name}.{name} was changed in place (__code__, __defaults__ or __kwdefaults__)")
                fn.__code__, fn.__defaults__ = code, defaults
                fn.__kwdefaults__ = None if kwdefaults is None else dict(kwdefaults)
        for (module_name, name), (cls, attrs) in self.classes.items():
            now_attrs = vars(cls)
            if _unchanged(now_attrs, attrs):
                continue
            changed = sorted(
                k
                for k in set(now_attrs) | set(attrs)
                if k not in attrs or k not in now_attrs or not _same(now_attrs[k], attrs[k])
            )
            changed = [k for k in changed if k != "__weakref__"]
            if changed:
                changes.append(f"{module_name}.{name} had {', '.join(changed)} changed")
                for k in changed:
                    if k in attrs:
                        setattr(cls, k, attrs[k])
                    else:
                        delattr(cls, k)
        changes += self._restore_allowlist()
        changes += self._restore_packages()
        if changes:
            changes[-1] += f" -- restored; a test must not leave torch's serialization changed: {_FIX}"
        return changes

    @staticmethod
    def _restore_namespace(module_name: str, space: dict[str, Any]) -> list[str]:
        module = sys.modules.get(module_name)
        if module is None:
            return []
        now = vars(module)
        managed = _MANAGED.get(module_name, frozenset())
        replaced = sorted(k for k, v in space.items() if k not in managed and k in now and not _same(now[k], v))
        removed = sorted(k for k in space if k not in managed and k not in now)
        added = sorted(k for k in now if k not in space and k not in managed)
        if not (replaced or removed or added):
            return []
        parts = [f"{module_name}.{k} is {_describe(now[k])}" for k in replaced]
        parts += [f"{module_name}.{k} was deleted" for k in removed]
        parts += [f"{module_name}.{k} was added" for k in added]
        for k in replaced + removed:
            setattr(module, k, space[k])
        for k in added:
            delattr(module, k)
        return parts

    def _restore_allowlist(self) -> list[str]:
        if self.allowlist is None:
            return []
        table, then = self._table(), self.allowlist
        if table is None or (
            len(table) == len(then) and all(k in table and _same_entry(table[k], v) for k, v in then.items())
        ):
            return []
        added = sorted(k for k in table if k not in then)
        removed = sorted(k for k in then if k not in table)
        replaced = sorted(k for k in then if k in table and not _same_entry(table[k], then[k]))
        table.clear()  # in place: torch caches this very dict (lru_cache) and reads it on every load
        table.update(self.allowlist)
        return [
            f"torch's built-in allowlist (torch._weights_only_unpickler._get_allowed_globals()) changed: "
            f"added {added}, removed {removed}, replaced {replaced}; to trust a global for a test, declare it "
            "(safe_globals) or use torch.serialization.safe_globals([...]) as a context"
        ]

    def _restore_packages(self) -> list[str]:
        registry = getattr(_ser(), "_package_registry", None)
        if registry is None or (
            len(registry) == len(self.packages) and all(a is b for a, b in zip(registry, self.packages))
        ):
            return []
        added = [_describe(entry[2]) for entry in registry if not any(entry is p for p in self.packages)]
        registry[:] = self.packages  # in place: torch reads this very list
        return [
            "torch.serialization's storage-location registry (register_package) changed"
            + (f": added deserializers {added}" if added else "")
            + "; its deserializers run on every load, weights-only included"
        ]
