"""``torch.load`` as it is here: replaced (torch_npu replaces it at import) or torch's own, and how
it reports: the ``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD`` warning (torch_npu prints it), where it raised.

The warning filters are never touched (that makes Python forget what it showed once): during a load,
``warnings`` in torch.serialization is rebound to a proxy consuming torch's FORCE_NO warning in the
observing thread (every warning, for probes) and passing the rest to ``warnings.warn`` one frame up,
so filters, ``-W error`` and once-per-location memory behave as without the library (under ``-W
error`` another thread's warning shows one extra frame).
"""

from __future__ import annotations

import io
import operator
import re
import sys
import threading
import types
import warnings
from contextlib import contextmanager
from typing import Any, Iterator, Optional

from .interrupts import deferred_interrupts
from .probes import ProbeFailed, innermost_frame

#: torch's warning (and torch_npu's printed notice) when TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD applies.
FORCE_NO_NOTICE = re.compile(r"TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD detected")


def torch_load_replacement() -> Optional[str]:
    """Who replaced ``torch.load``, or None if it is torch's own: by identity, never by ``__module__``
    (a ``functools.wraps`` shim copies it; see :func:`.serialization_state.genuine`)."""
    pass

    return replaced_by("load")


class Observation:
    """How many FORCE_NO warnings torch raised in the observing thread."""

    __slots__ = ("count", "installed", "consume_all")

    def __init__(self, consume_all: bool = False) -> None:
        self.count = 0
        self.installed = False
        self.consume_all = consume_all

    @property
    def seen(self) -> bool:
        return self.count > 0


_local = threading.local()


_lock = threading.Lock()


_users = 0


class _SerializationWarnings(types.ModuleType):
    """Stands in for ``warnings`` inside torch.serialization while the library loads."""

    def __init__(self, real: Any) -> None:
        super().__init__("warnings")
        self._tst_real = real

    #: Tells :mod:`.serialization_state` this is the module it stands in for, not a replacement.
    _tst_stands_in_for = True

    def __getattr__(self, name: str) -> Any:
        return getattr(self._tst_real, name)

    def warn(self, message: Any, category: Any = None, stacklevel: int = 1, source: Any = None, **kwargs: Any) -> None:
        stack = getattr(_local, "stack", None)
        if stack:
            force_no = bool(FORCE_NO_NOTICE.search(str(message)))
            if force_no or stack[-1].consume_all:
                stack[-1].count += force_no  # this thread's load: observed and consumed (the caller asserts it)
                return
        self._tst_real.warn(message, category, stacklevel + 1, source, **kwargs)  # torch's intended location


def _install() -> None:
    global _users
    import torch.serialization as ser

    with _lock:
        current = getattr(ser, "warnings", None)
        if not isinstance(current, _SerializationWarnings):
            proxy = _SerializationWarnings(current if current is not None else warnings)
            ser.warnings = proxy  # type: ignore[attr-defined]
        _users += 1


def _uninstall() -> None:
    global _users
    import torch.serialization as ser

    with _lock:
        _users = max(0, _users - 1)
        current = getattr(ser, "warnings", None)
        if _users == 0 and isinstance(current, _SerializationWarnings):
            ser.warnings = current._tst_real  # type: ignore[attr-defined]


def proxy_installed() -> bool:
    """Whether torch.serialization's ``warnings`` is the proxy right now (it never is between loads)."""
    import torch.serialization as ser

    return isinstance(getattr(ser, "warnings", None), _SerializationWarnings)


def _close(observation: Observation) -> None:  # idempotent: an interrupted close can simply run again
    with deferred_interrupts():
        stack = getattr(_local, "stack", None) or []
        if observation in stack:
            stack.remove(observation)
        if observation.installed:
            _uninstall()
            observation.installed = False


@contextmanager
def observe_serialization_warnings(consume_all: bool = False) -> Iterator[Observation]:
    """Count torch's FORCE_NO warnings raised in this thread inside the block, consuming only them
    (*consume_all*: every warning torch.serialization raises in this thread, for probes)."""
    observation = Observation(consume_all)
    try:
        with deferred_interrupts():
            stack = getattr(_local, "stack", None)
            if stack is None:
                stack = _local.stack = []
            stack.append(observation)
            _install()
            observation.installed = True
        yield observation
    finally:
        # No call before the try (not even range()): a signal delivered as a call returns would skip
        # the close.  An interrupt landing in _close makes it run again.
        pending: Optional[BaseException] = None
        for _attempt in (1, 2, 3):
            try:
                _close(observation)
                break
            except BaseException as e:  # noqa: BLE001 - re-raised once the proxy is gone
                pending = pending or e
        if pending is not None:
            raise pending


class _Tee:
    """Passes everything through to the real stream and keeps a copy."""

    def __init__(self, stream: Any, copy: io.StringIO) -> None:
        self._stream = stream
        self._copy = copy

    def write(self, text: str) -> int:
        self._copy.write(text)
        return int(self._stream.write(text))

    def flush(self) -> None:
        self._stream.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


@contextmanager
def watch_stdout(active: bool) -> Iterator[Optional[io.StringIO]]:
    """Copy what is printed during a replaced ``torch.load`` (torch_npu prints the FORCE_NO notice)."""
    if not active:
        yield None
        return
    copy = io.StringIO()
    real = sys.stdout
    sys.stdout = _Tee(real, copy)  # type: ignore[assignment]
    try:
        yield copy
    finally:
        sys.stdout = real


def raised_by_torch(error: BaseException) -> bool:
    """Whether the rejection came out of torch's own serialization code, message untouched."""
    frame = innermost_frame(error)
    return frame is not None and frame.f_globals.get("__name__") in (
        "torch.serialization",
        "torch._weights_only_unpickler",
    )


def raiser(error: BaseException) -> str:
    """``module.function`` that raised *error*."""
    frame = innermost_frame(error)
    if frame is None:
        return "?"
    code = frame.f_code
    return f"{frame.f_globals.get('__name__', '?')}.{getattr(code, 'co_qualname', code.co_name)}"


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
