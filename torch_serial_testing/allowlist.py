"""Which globals a checkpoint needs, which are allowed, and the registry they live in.

torch's weights-only unpickler accepts a global when it is on torch's built-in
allowlist, registered process-wide (``add_safe_globals``), or added by a
``safe_globals`` context.  This module computes each of those sets by the same
``module.qualname`` spelling torch uses, so predictions match torch exactly,
and it serialises every change the library makes to the process-wide registry
behind one lock.
"""

from __future__ import annotations

import importlib
import os
import threading
from dataclasses import dataclass
from contextlib import contextmanager
from typing import Any, Iterable, Iterator, Optional, Sequence

from .errors import RoundTripConfigError
from .names import name_problem, quote_name, show_name
from .snippet import safe_globals_snippet
from .denylist import denylist_reason
from .trust import UnsafeCallable, describe, judge_global, judge_name

__all__ = [
    "SafeGlobal",
    "UnsafeCallable",
    "normalize_safe_globals",
    "refuse_dangerous",
    "as_safe_globals",
    "qualified_name",
    "torch_allowlist",
    "torch_allowlist_objects",
    "registered_globals",
    "required_globals",
    "dangerous_reason",
    "safe_globals_snippet",
    "registry_lock",
    "allowlisted",
    "registry_takes_named_entries",
    "snapshot_registry",
    "restore_registry",
]

#: Held while the library reads or changes torch's process-wide safe-globals registry
#: and while it loads, so a prediction and the load it predicts see the same registry.
registry_lock = threading.RLock()

def dangerous_reason(name: str) -> Optional[str]:
    """Why *name* must never be allowlisted (the trust policy's ``dangerous`` or ``malformed``
    verdict, "cannot tell" included), or None.  Never imports anything."""
    verdict = judge_name(name)
    return verdict.reason if verdict.kind in ("dangerous", "malformed") else None


@dataclass(frozen=True)
class SafeGlobal:
    """One declared safe global: the object and the name torch matches it by."""

    obj: Any
    name: str
    explicit_name: bool = False
    #: Set (to the author's reason) for an :class:`UnsafeCallable` opt-in.
    unsafe_reason: Optional[str] = None

    @property
    def torch_entry(self) -> Any:
        """The form ``torch.serialization.safe_globals`` takes."""
        return (self.obj, self.name) if self.explicit_name else self.obj


def qualified_name(obj: Any) -> str:
    """``module.qualname``: the spelling torch's weights-only unpickler matches."""
    if isinstance(obj, tuple) and len(obj) == 2 and isinstance(obj[1], str):
        return obj[1]
    module = getattr(obj, "__module__", None)
    qualname = getattr(obj, "__qualname__", None)
    if not module or not qualname:
        raise RoundTripConfigError(
            f"safe global {obj!r} has no __module__/__qualname__; declare the class or function "
            "itself, a 'module.Name' string, or an (object, 'module.Name') tuple"
        )
    return f"{module}.{qualname}"


def resolve_global(name: str) -> Any:
    """Import ``module.attr[.attr]`` (longest importable module prefix) of an author's declaration."""
    problem = name_problem(name)
    if problem:
        raise RoundTripConfigError(
            f"safe global {quote_name(name)} is not a dotted Python name ({problem}); write 'package.module.Name'"
        )
    parts = name.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        module_name = ".".join(parts[:cut])
        try:
            obj: Any = importlib.import_module(module_name)
        except ImportError:
            continue
        try:
            for attr in parts[cut:]:
                obj = getattr(obj, attr)
        except AttributeError:
            break
        return obj
    raise RoundTripConfigError(
        f"safe global {quote_name(name)} is not importable; fix the spelling ('package.module.Name') or "
        "declare the object itself"
    )


def normalize_safe_globals(declared: Iterable[Any]) -> tuple[SafeGlobal, ...]:
    """Validate a declaration: objects, 'module.Name' strings or (object, name) tuples.

    Dangerous entries are refused here, long before any load.
    """
    if isinstance(declared, (str, bytes)) or not hasattr(declared, "__iter__"):
        raise RoundTripConfigError(
            f"safe_globals must be a tuple or list of globals, got {type(declared).__name__}; "
            "write safe_globals = (MyModule,)"
        )
    out: list[SafeGlobal] = []
    for item in declared:
        if isinstance(item, SafeGlobal):
            sg = item
        elif isinstance(item, UnsafeCallable):
            obj = resolve_global(item.target) if isinstance(item.target, str) else item.target
            name = item.target if isinstance(item.target, str) else _name_or_refuse(obj)
            sg = SafeGlobal(obj, name, explicit_name=_own_name(obj) != name, unsafe_reason=item.reason)
        elif isinstance(item, str):
            obj = resolve_global(item)
            sg = SafeGlobal(obj, item, explicit_name=_own_name(obj) != item)
        elif isinstance(item, tuple):
            if len(item) != 2 or not isinstance(item[1], str):
                raise RoundTripConfigError(
                    f"safe global tuple {show_name(repr(item)[:80])} must be (object, 'module.Name')"
                )
            _import_declared(item[1])
            sg = SafeGlobal(item[0], item[1], explicit_name=True)
        else:
            sg = SafeGlobal(item, _name_or_refuse(item))
        refuse_dangerous(sg)
        out.append(sg)
    names = [sg.name for sg in out]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise RoundTripConfigError(f"safe global declared twice: {', '.join(map(show_name, dupes))}")
    return tuple(out)


def _own_name(obj: Any) -> Optional[str]:
    try:
        return qualified_name(obj)
    except RoundTripConfigError:
        return None


def _import_declared(name: str) -> None:
    """Import the module of an author's ``(obj, name)`` declaration, as a string declaration
    would, so the identity check can find it; a checkpoint's names are never imported."""
    if name_problem(name) is None and denylist_reason(name) is None:
        try:
            resolve_global(name)
        except RoundTripConfigError:
            pass  # the identity check then refuses it, saying why


def _name_or_refuse(obj: Any) -> str:
    """``module.qualname`` of a declared object; one without (a partial, a module, a bound
    ``__call__``) is refused by the policy, naming what it is."""
    name = _own_name(obj)
    if name is None:
        reason = judge_global(obj) or "it has no __module__/__qualname__ of its own"
        raise RoundTripConfigError(
            f"refusing to allowlist {describe(obj)}: {reason}; declare the class itself, a "
            "'module.Name' string, or an (object, 'module.Name') tuple"
        )
    return name


def refuse_dangerous(sg: SafeGlobal) -> None:
    """Raise :class:`RoundTripConfigError` unless the trust policy accepts *sg*.

    A safe global must be a class that *sg.name* resolves to (the very object, so
    ``(os.system, "mymod.Safe")`` or a partial wearing a harmless ``__qualname__``
    cannot slip in), or a plain function declared with :class:`UnsafeCallable`;
    the denylist applies to both (see :mod:`torch_serial_testing.trust`).
    """
    reason = judge_global(sg.obj, sg.name, opt_in=sg.unsafe_reason is not None)
    if reason:
        raise RoundTripConfigError(
            f"refusing to allowlist {show_name(sg.name)} ({describe(sg.obj)}): {reason}"
        )


def as_safe_globals(safe_globals: Sequence[Any]) -> tuple[SafeGlobal, ...]:
    """*safe_globals* as SafeGlobal entries, refusing dangerous ones (however they are named).

    Every load passes its declaration through here, so an accepted declaration is remembered
    by the identity of its items (the cache keeps them alive, so an id is never reused while
    cached); a refused one is never cached and raises again on every call.
    """
    if type(safe_globals) is tuple:  # immutable: the same tuple is the same declaration
        known = _ACCEPTED_TUPLES.get(id(safe_globals))
        if known is not None and known[0] is safe_globals:
            return known[1]
    elif type(safe_globals) is not list:
        return normalize_safe_globals(safe_globals)  # any other form: validated (or refused) every time
    items = tuple(safe_globals)
    key = tuple(map(id, items))
    hit = _ACCEPTED_DECLARATIONS.get(key)
    if hit is not None and all(a is b for a, b in zip(hit[0], items)):
        return hit[1]
    result = normalize_safe_globals(items)
    with _declarations_lock:
        if len(_ACCEPTED_DECLARATIONS) >= 256:
            _ACCEPTED_DECLARATIONS.clear()
            _ACCEPTED_TUPLES.clear()
        _ACCEPTED_DECLARATIONS[key] = (items, result)
        if type(safe_globals) is tuple:
            _ACCEPTED_TUPLES[id(safe_globals)] = (safe_globals, result)  # kept alive: its id stays its own
    return result


#: id-tuple of a declaration's items -> (the items, their accepted SafeGlobal entries).
_ACCEPTED_DECLARATIONS: dict[tuple[int, ...], tuple[tuple[Any, ...], tuple[SafeGlobal, ...]]] = {}
#: id(tuple) -> (the tuple, its accepted entries): the mixin passes the same tuple on every load.
_ACCEPTED_TUPLES: dict[int, tuple[tuple[Any, ...], tuple[SafeGlobal, ...]]] = {}
_declarations_lock = threading.Lock()


def torch_allowlist() -> frozenset[str]:
    """Names torch's weights-only unpickler accepts without any registration."""
    from torch import _weights_only_unpickler as wou

    return frozenset(wou._get_allowed_globals())


def torch_allowlist_objects() -> dict[str, Any]:
    """torch's own allowlist, name -> the object it allows under that name."""
    from torch import _weights_only_unpickler as wou

    return dict(wou._get_allowed_globals())


def registered_globals() -> frozenset[str]:
    """Names registered process-wide right now (``add_safe_globals`` or an open context)."""
    import torch

    return frozenset(_own_name(g) or f"<unnamed {type(g).__name__}>" for g in torch.serialization.get_safe_globals())


_NOT_GIVEN: Any = object()


def required_globals(
    obj_or_buffer: Any = _NOT_GIVEN,
    *,
    obj: Any = _NOT_GIVEN,
    checkpoint: Any = _NOT_GIVEN,
    path: Any = _NOT_GIVEN,
) -> list[str]:
    """Sorted globals a checkpoint needs beyond torch's own allowlist, found without unpickling.

    Say what you pass with a keyword and nothing is guessed: ``obj=`` is always
    ``torch.save``-d into memory first (even a ``str`` or ``bytes`` object),
    ``checkpoint=`` is scanned (bytes, a buffer or file object, a :class:`Checkpoint`),
    ``path=`` is a file to scan.  Positionally, a :class:`Checkpoint` or file object is
    scanned and any other object is saved -- except ``bytes``/``bytearray``/``memoryview``
    (scanned as checkpoint bytes) and ``str`` (a path), kept for backward compatibility;
    when those are not a checkpoint the error says to pass ``obj=``.
    """
    given = {k: v for k, v in (("obj", obj), ("checkpoint", checkpoint), ("path", path)) if v is not _NOT_GIVEN}
    if obj_or_buffer is not _NOT_GIVEN:
        given["positional"] = obj_or_buffer
    if len(given) != 1:
        raise TypeError(
            "required_globals() takes exactly one of: an object (obj=...), checkpoint bytes or a buffer "
            f"(checkpoint=...) or a file (path=...); got {', '.join(sorted(given)) or 'nothing'}"
        )
    (kind, value), = given.items()
    from .checkpoint import Checkpoint, scan_checkpoint  # the scan, imported where one is made

    if kind == "obj":
        info = Checkpoint.save(value).info
    elif kind == "path":
        if not isinstance(value, (str, os.PathLike)):
            raise TypeError(f"required_globals(path=...) takes a str or os.PathLike, got {type(value).__name__}")
        info = scan_checkpoint(value)
    elif kind == "checkpoint":
        if isinstance(value, (str, os.PathLike)):
            raise TypeError(
                "required_globals(checkpoint=...) takes bytes, a buffer or a Checkpoint; "
                "pass a file name as path=..."
            )
        info = scan_checkpoint(value)
    elif isinstance(value, Checkpoint) or hasattr(value, "read"):
        info = scan_checkpoint(value)
    elif isinstance(value, (bytes, bytearray, memoryview, str, os.PathLike)):
        info = _scan_ambiguous(value)
    else:
        info = Checkpoint.save(value).info
    if info.format == "torchscript":
        from .errors import CheckpointFormatError

        raise CheckpointFormatError(
            "this is a TorchScript archive: load it with torch.jit.load; weights_only does not apply"
        )
    allowed = torch_allowlist()
    # Types BUILD is applied to count too (numpy.dtypes.Float64DType never appears as a GLOBAL).
    needed = set(info.globals) | set(getattr(info, "type_checks", ()))
    type_names = _torch_allowed_type_names()
    return sorted(g for g in needed if g not in allowed and g not in type_names)


def _torch_allowed_type_names() -> frozenset[str]:
    """``module.qualname`` of the types on torch's own allowlist (BUILD accepts their instances)."""
    from torch import _weights_only_unpickler as wou

    return frozenset(
        f"{v.__module__}.{v.__qualname__}" for v in wou._get_allowed_globals().values() if isinstance(v, type)
    )


def _scan_ambiguous(value: Any) -> Any:
    """Scan a positional str (path) or bytes (checkpoint); say how to mean the object instead."""
    from .checkpoint import scan_checkpoint
    from .errors import CheckpointFormatError

    as_object = (
        f"to get the globals of the {type(value).__name__} object itself, call required_globals(obj=...)"
    )
    if isinstance(value, (str, os.PathLike)):
        if not os.path.isfile(value):
            raise FileNotFoundError(f"required_globals({value!r}): a positional str is a checkpoint file, and there "
                                    f"is no such file; {as_object}")
        return scan_checkpoint(value)
    try:
        return scan_checkpoint(value)
    except CheckpointFormatError as e:
        raise CheckpointFormatError(
            f"{e} (a positional {type(value).__name__} is read as checkpoint bytes; {as_object})"
        ) from None


def snapshot_registry() -> list[Any]:
    """A copy of torch's process-wide safe-globals registry."""
    import torch

    with registry_lock:
        return list(torch.serialization.get_safe_globals())


def restore_registry(snapshot: Sequence[Any]) -> None:
    """Make the registry equal *snapshot* again (re-adding what torch's context exit removed)."""
    import torch

    from torch import _weights_only_unpickler as wou

    with registry_lock:
        current = torch.serialization.get_safe_globals()
        if set(current) == set(snapshot):
            return
        # Restoring a snapshot, not trusting anything new.  One rebinding of torch's registry
        # (a set since torch 2.5, a list before), so an interrupt never leaves it empty or half
        # restored; without that attribute: add what is missing, then remove what is extra.
        for attr, kind in (("_marked_safe_globals_set", set), ("_marked_safe_globals_list", list)):
            if isinstance(getattr(wou, attr, None), kind):
                setattr(wou, attr, kind(snapshot))
                return
        missing = [g for g in snapshot if g not in current]
        if missing:
            wou._add_safe_globals(missing)
        extra = [g for g in current if g not in snapshot]
        if extra:
            wou._remove_safe_globals(extra)


@contextmanager
def preserved_registry() -> Iterator[None]:
    """Restore the registry on exit, whatever happened inside."""
    with registry_lock:
        snap = snapshot_registry()
        try:
            yield
        finally:
            restore_registry(snap)


def registry_takes_named_entries() -> bool:
    """Whether torch's allowlist takes ``(obj, "module.Name")`` entries (torch 2.4's keys every
    entry by its own ``__module__.__name__`` and takes objects only).  Read from torch's source."""
    from torch import _weights_only_unpickler as wou

    from .torch_source import source_of

    try:
        return "isinstance(f, tuple)" in source_of(wou._get_user_allowed_globals)
    except (AttributeError, OSError, TypeError):
        return True


@contextmanager
def allowlisted(entries: Sequence[Any]) -> Iterator[None]:
    """Trust *entries* for the weights-only loads inside the block, then forget them.

    For oracles that ask torch itself what an allowlist does: ``torch.serialization.safe_globals``
    where torch has it (>= 2.5); before, the same through ``add_safe_globals`` (the one registry
    torch 2.4 reads), undone on exit.  The registry is restored either way (a context exit also
    drops entries registered before it on some torch versions).  The library's own safe_globals
    mode never falls back like this: it skips visibly where the context is missing.
    """
    import torch

    with preserved_registry():
        context = getattr(torch.serialization, "safe_globals", None)
        if context is not None:
            with context(list(entries)):
                yield
        else:
            named = [e for e in entries if isinstance(e, tuple)]
            if named and not registry_takes_named_entries():
                raise RoundTripConfigError(
                    f"torch {torch.__version__} allowlists objects only, by their own __module__.__name__: "
                    f"{', '.join(repr(n) for _, n in named)} cannot be allowlisted as (obj, name) here"
                )
            torch.serialization.add_safe_globals(list(entries))
            yield
