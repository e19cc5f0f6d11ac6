"""torch's serialization machinery as process state: its genuine ``load``/``save``, how a load reports,
and what a test could change to subvert every later load (the safe-globals registry is :mod:`.registry`'s).

:func:`genuine` knows torch's own function by identity (its ``__globals__`` *is* torch.serialization's
namespace), never by ``__module__`` or ``__name__`` (``functools.wraps`` copies those).  The warning
filters are never touched (Python would forget what it showed once): during an observed load, ``warnings``
in torch.serialization is a proxy consuming the FORCE_NO warning in the observing thread."""

from __future__ import annotations

import io
import operator
import re
import sys
import threading
import types
import warnings
from contextlib import AbstractContextManager, contextmanager, nullcontext, redirect_stdout, suppress
from dataclasses import dataclass
from typing import AbstractSet, Any, Iterator, Optional

import torch

from .errors import ProbeFailed, innermost_frame
from .registry import torch_allowlist_table

#: torch's warning (and torch_npu's printed notice) when TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD applies.
FORCE_NO_NOTICE = re.compile(r"TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD detected")
TORCH_SERIALIZATION = ("torch.serialization", "torch._weights_only_unpickler")
_FIX = (
    "patch it only for the duration of a block (unittest.mock.patch as a context manager or decorator) "
    "or undo it in a finally or addCleanup"
)


def _own_function(fn: Any, name: str) -> bool:
    ser = vars(torch.serialization)
    return isinstance(fn, types.FunctionType) and fn.__globals__ is ser and fn.__code__.co_name == fn.__name__ == name


_genuine: dict[str, tuple[Any, Any, Any]] = {}


def genuine(name: str) -> Any:
    """torch's own ``torch.serialization.<name>`` (``load``/``save``), its code and keyword defaults as first taken."""
    entry = _genuine.get(name)
    if entry is None:
        candidates = (vars(torch.serialization).get(name), getattr(torch, name, None))
        if (found := next((c for c in candidates if _own_function(c, name)), None)) is None:
            raise ProbeFailed(
                f"neither torch.serialization.{name} nor torch.{name} is torch's own function (they are "
                f"{_describe(candidates[0])} and {_describe(candidates[1])}); the library "
                f"calls only torch's own: remove the replacement installed before it first ran"
            )
        kw = found.__kwdefaults__
        entry = _genuine[name] = (found, found.__code__, None if kw is None else dict(kw))
    fn, code, kwdefaults = entry
    if fn.__code__ is not code or fn.__kwdefaults__ != kwdefaults:
        raise ProbeFailed(
            f"torch.serialization.{name} was changed in place (its __code__ or __kwdefaults__: now "
            f"{fn.__kwdefaults__!r}, was {kwdefaults!r}); the library will not call it: {_FIX}"
        )
    return fn


def _describe(obj: Any) -> str:
    if obj is None:
        return "missing"
    module = getattr(obj, "__module__", None) or "?"
    qualname = getattr(obj, "__qualname__", None) or type(obj).__name__
    return f"{module}.{qualname}" + (" (functools.wraps of torch's)" if hasattr(obj, "__wrapped__") else "")


def torch_load_replacement() -> Optional[str]:
    """Who ``torch.load`` is when it is not torch's own function (None: it is)."""
    fn = getattr(torch, "load", None)
    with suppress(ProbeFailed):
        if _own_function(fn, "load") or fn is genuine("load"):
            return None
    return _describe(fn)


def raiser(error: BaseException) -> str:
    """``module.function`` that raised *error* (torch's own rejections: in :data:`TORCH_SERIALIZATION`)."""
    frame = innermost_frame(error)
    code = frame.f_code if frame is not None else None
    return f"{frame.f_globals.get('__name__', '?')}.{getattr(code, 'co_qualname', code.co_name)}" if code else "?"


@dataclass(eq=False)
class Observation:
    """How many FORCE_NO warnings torch raised in the observing thread (every warning: *consume_all*)."""

    consume_all: bool = False
    count: int = 0

    @property
    def seen(self) -> bool:
        return self.count > 0


_local = threading.local()
_lock = threading.Lock()
_users = 0


class _SerializationWarnings(types.ModuleType):
    """Stands in for ``warnings`` inside torch.serialization while the library observes a load."""

    def __init__(self, real: Any) -> None:
        super().__init__("warnings")
        self._tst_real = real

    def __getattr__(self, name: str) -> Any:
        return getattr(self._tst_real, name)

    def warn(self, message: Any, category: Any = None, stacklevel: int = 1, source: Any = None, **kwargs: Any) -> None:
        if stack := getattr(_local, "stack", None):
            force_no = bool(FORCE_NO_NOTICE.search(str(message)))
            if force_no or stack[-1].consume_all:
                stack[-1].count += force_no  # this thread's load: observed and consumed (the caller asserts it)
                return
        self._tst_real.warn(message, category, stacklevel + 1, source, **kwargs)  # torch's intended location


@contextmanager
def observe_serialization_warnings(consume_all: bool = False) -> Iterator[Observation]:
    """Count and consume torch's FORCE_NO warnings raised in this thread in the block (*consume_all*: every warning)."""
    global _users
    ser = torch.serialization
    observation = Observation(consume_all)
    stack = _local.__dict__.setdefault("stack", [])
    with _lock:
        if not isinstance(current := getattr(ser, "warnings", None), _SerializationWarnings):
            ser.warnings = _SerializationWarnings(current if current is not None else warnings)
        _users += 1
    stack.append(observation)
    try:
        yield observation
    finally:
        stack.remove(observation)
        with _lock:
            _users -= 1
            if _users == 0 and isinstance(current := getattr(ser, "warnings", None), _SerializationWarnings):
                ser.warnings = current._tst_real


class _Tee:
    """Passes everything through to the real stream and keeps a copy of what is written."""

    def __init__(self, stream: Any) -> None:
        self._stream, self.copy = stream, io.StringIO()

    def write(self, text: str) -> int:
        self.copy.write(text)
        return int(self._stream.write(text))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def watch_stdout(active: bool) -> AbstractContextManager[Optional[_Tee]]:
    """Copy what is printed during a replaced ``torch.load`` (torch_npu prints the FORCE_NO notice)."""
    return redirect_stdout(_Tee(sys.stdout)) if active else nullcontext()  # type: ignore[type-var]


#: Modules whose whole namespace is state, and the names in each that are not the test's to restore:
#: the safe-globals registry (:mod:`.registry` restores it) and the warnings module's bookkeeping.
_WARNED = frozenset({"__warningregistry__"})
_REGISTRY = _WARNED | {"_marked_safe_globals_set", "_marked_safe_globals_list"}
WATCHED_MODULES = {"torch.serialization": _WARNED, "torch._weights_only_unpickler": _REGISTRY, "torch._utils": _WARNED}


def _same(now: Any, then: Any) -> bool:
    """The very object, or the library's own warnings proxy standing in for it during a load."""
    return now is then or (isinstance(now, _SerializationWarnings) and now._tst_real is then)


def _same_entry(now: Any, then: Any) -> bool:
    """The same allowlist value: the very object, or a plain data object of the same class and state
    (torch builds a fresh ``StorageType`` per legacy storage name whenever its cache is refilled)."""
    if now is then:
        return True
    if type(now) is not type(then) or isinstance(now, (type, types.FunctionType, types.BuiltinFunctionType)):
        return False
    return (state := getattr(now, "__dict__", None)) is not None and state == getattr(then, "__dict__", None)


class SerializationState:
    """``torch.load``/``save``, the namespaces of :data:`WATCHED_MODULES` (their classes' attributes, functions' code
    and defaults), torch's allowlist and ``register_package`` registry, by identity; :meth:`restore` puts each back."""

    __slots__ = ("torch_names", "namespaces", "classes", "functions", "allowlist", "packages")

    def __init__(self) -> None:
        self.torch_names = {n: vars(torch).get(n) for n in ("load", "save")}
        self.namespaces: dict[str, dict[str, Any]] = {}
        self.classes: list[tuple[type, dict[str, Any]]] = []
        self.functions: list[tuple[Any, Any, Any, Any]] = []  # (fn, __code__, __defaults__, __kwdefaults__)
        for module_name in WATCHED_MODULES:
            if (module := sys.modules.get(module_name)) is None:
                continue
            space = self.namespaces[module_name] = dict(vars(module))
            for v in space.values():
                if isinstance(v, type) and v.__module__ == module_name:
                    self.classes.append((v, dict(vars(v))))
                elif isinstance(v, types.FunctionType) and v.__globals__ is vars(module):
                    kw = v.__kwdefaults__
                    self.functions.append((v, v.__code__, v.__defaults__, None if kw is None else dict(kw)))
        self.allowlist = dict(torch_allowlist_table())
        self.packages = list(getattr(torch.serialization, "_package_registry", None) or ())

    def restore(self) -> list[str]:
        """Put everything back; one line per change (what changed, and the fix)."""
        changes: list[str] = []
        for name, then in self.torch_names.items():
            if (now := vars(torch).get(name)) is not then:
                changes.append(f"torch.{name} is {_describe(now)} (was {_describe(then)})")
                setattr(torch, name, then)
        for module_name, space in self.namespaces.items():
            if (module := sys.modules.get(module_name)) is not None:
                replaced, removed, added = _restore(module, space, WATCHED_MODULES[module_name])
                changes += [f"{module_name}.{k} is {_describe(v)}" for k, v in replaced.items()]
                changes += [f"{module_name}.{k} was deleted" for k in removed]
                changes += [f"{module_name}.{k} was added" for k in added]
        for cls, attrs in self.classes:
            replaced, removed, added = _restore(cls, attrs, {"__weakref__"})
            if replaced or removed or added:
                changed = ", ".join(sorted([*replaced, *removed, *added]))
                changes.append(f"{cls.__module__}.{cls.__qualname__} had {changed} changed")
        for fn, code, defaults, kwdefaults in self.functions:  # torch.load's default changed in place...
            if fn.__code__ is not code or fn.__defaults__ is not defaults or fn.__kwdefaults__ != kwdefaults:
                what = "__code__, __defaults__ or __kwdefaults__"
                changes.append(f"{fn.__module__}.{fn.__qualname__} was changed in place ({what})")
                fn.__code__, fn.__defaults__ = code, defaults
                fn.__kwdefaults__ = None if kwdefaults is None else dict(kwdefaults)
        table, then = torch_allowlist_table(), self.allowlist
        unchanged = table.keys() == then.keys() and all(map(operator.is_, table.values(), then.values()))
        extra = [] if unchanged else sorted(k for k in table if k not in then)
        gone = [] if unchanged else sorted(k for k in then if k not in table)
        swapped = [] if unchanged else sorted(k for k in then if k in table and not _same_entry(table[k], then[k]))
        if extra or gone or swapped:
            table.clear()  # in place: torch caches this very dict (lru_cache) and reads it on every load
            table.update(then)
            changes.append(
                f"torch's built-in allowlist (torch._weights_only_unpickler._get_allowed_globals()) changed: "
                f"added {extra}, removed {gone}, replaced {swapped}; to trust a global for a test, declare it "
                "(safe_globals) or use torch.serialization.safe_globals([...]) as a context"
            )
        registry, packages = getattr(torch.serialization, "_package_registry", None), self.packages
        if registry is not None and [id(entry) for entry in registry] != [id(entry) for entry in packages]:
            added = [_describe(entry[2]) for entry in registry if not any(entry is p for p in packages)]
            registry[:] = packages  # in place: torch reads this very list
            changes.append(
                "torch.serialization's storage-location registry (register_package) changed"
                + (f": added deserializers {added}" if added else "")
                + "; its deserializers run on every load, weights-only included"
            )
        if changes:
            changes[-1] += f" -- restored; a test must not leave torch's serialization changed: {_FIX}"
        return changes


def _restore(target: Any, then: dict[str, Any], skip: AbstractSet[str]) -> tuple[dict[str, Any], list[str], list[str]]:
    """Put back *target*'s attributes but *skip*; returns (the replaced as found, the removed, the added), sorted."""
    now = vars(target)
    if now.keys() == then.keys() and all(map(operator.is_, now.values(), then.values())):
        return {}, [], []  # unchanged (the common case), told at C speed
    replaced = {k: now[k] for k in sorted(then) if k not in skip and k in now and not _same(now[k], then[k])}
    removed = sorted(k for k in then if k not in skip and k not in now)
    added = sorted(k for k in now if k not in then and k not in skip)
    for k in [*replaced, *removed]:
        setattr(target, k, then[k])
    for k in added:
        delattr(target, k)
    return replaced, removed, added
