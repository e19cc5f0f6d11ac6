"""A declaration of safe globals, read once: what each entry is, the name torch matches it by.

Entries are objects, ``'module.Name'`` strings, ``(object, 'module.Name')`` pairs or
:class:`~.trust.UnsafeCallable` opt-ins; :func:`split_entry` is their one reader.
:func:`normalize_safe_globals` refuses what the trust policy refuses (long before any load);
:func:`declared_entries` gives a prediction its ``(object, name)`` pairs, refusing nothing.
"""

from __future__ import annotations

import importlib
import threading
from dataclasses import dataclass
from typing import Any, Iterable, Optional, Sequence

from ..core.errors import RoundTripConfigError
from ..core.names import name_problem, qualified_name, quote_name, show_name, torch_key
from .denylist import denylist_reason
from .trust import UnsafeCallable, describe, judge_global

__all__ = [
    "SafeGlobal",
    "split_entry",
    "normalize_safe_globals",
    "as_safe_globals",
    "declared_entries",
    "refuse_dangerous",
    "resolve_global",
]


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


def _check_declaration(declared: Any) -> None:
    if isinstance(declared, (str, bytes)) or not hasattr(declared, "__iter__"):
        raise RoundTripConfigError(
            f"safe_globals must be a tuple or list of globals, got {type(declared).__name__}; "
            "write safe_globals = (MyModule,) (objects, 'module.Name' strings or (obj, 'module.Name') tuples)"
        )


def split_entry(item: Any) -> tuple[Any, Optional[str], bool, Optional[str]]:
    """(object or None for a bare name, the name torch matches it by or None when the object has none,
    whether that name was explicit, the :class:`UnsafeCallable` reason) of one entry; imports nothing."""
    if isinstance(item, SafeGlobal):
        return item.obj, item.name, item.explicit_name, item.unsafe_reason
    if isinstance(item, UnsafeCallable):
        if isinstance(item.target, str):
            return None, item.target, True, item.reason
        return item.target, torch_key(item.target), False, item.reason
    if isinstance(item, str):
        return None, item, True, None
    if isinstance(item, tuple):
        if len(item) != 2 or not isinstance(item[1], str):
            raise RoundTripConfigError(
                f"safe global tuple {show_name(repr(item)[:80])} must be (object, 'module.Name')"
            )
        return item[0], item[1], True, None
    return item, torch_key(item), False, None


def resolve_global(name: str) -> Any:
    """Import ``module.attr[.attr]`` (longest importable module prefix) of an author's declaration."""
    problem = name_problem(name)
    if problem:
        raise RoundTripConfigError(
            f"safe global {quote_name(name)} is not a dotted Python name ({problem}); write 'package.module.Name'"
        )
    parts = name.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        try:
            obj: Any = importlib.import_module(".".join(parts[:cut]))
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
    """A declaration as :class:`SafeGlobal` entries; dangerous ones are refused here, long before any load."""
    _check_declaration(declared)
    out: list[SafeGlobal] = []
    for item in declared:
        obj, name, explicit, unsafe = split_entry(item)
        if isinstance(item, SafeGlobal):
            sg = item
        else:
            if isinstance(item, tuple):
                _import_declared(name)  # type: ignore[arg-type]
            elif obj is None:  # a name the author wrote: imported to find the object
                obj = resolve_global(name)  # type: ignore[arg-type]
                explicit = torch_key(obj) != name
            elif name is None:
                reason = judge_global(obj) or "it has no __module__/__qualname__ of its own"
                raise RoundTripConfigError(
                    f"refusing to allowlist {describe(obj)}: {reason}; declare the class itself, a "
                    "'module.Name' string, or an (object, 'module.Name') tuple"
                )
            sg = SafeGlobal(obj, name, explicit, unsafe)  # type: ignore[arg-type]
        refuse_dangerous(sg)
        out.append(sg)
    names = [sg.name for sg in out]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise RoundTripConfigError(f"safe global declared twice: {', '.join(map(show_name, dupes))}")
    return tuple(out)


def _import_declared(name: str) -> None:
    """Import the module of an author's ``(obj, name)``, as for a string, so the identity check finds it."""
    if name_problem(name) is None and denylist_reason(name) is None:
        try:
            resolve_global(name)
        except RoundTripConfigError:
            pass  # the identity check then refuses it, saying why


def refuse_dangerous(sg: SafeGlobal) -> None:
    """Raise :class:`RoundTripConfigError` unless the trust policy (:mod:`.trust`) accepts *sg*."""
    reason = judge_global(sg.obj, sg.name, opt_in=sg.unsafe_reason is not None)
    if reason:
        raise RoundTripConfigError(f"refusing to allowlist {show_name(sg.name)} ({describe(sg.obj)}): {reason}")


def as_safe_globals(safe_globals: Sequence[Any]) -> tuple[SafeGlobal, ...]:
    """:func:`normalize_safe_globals`, for every load.  The mixin passes the same tuple every time, so an
    accepted tuple is remembered by identity (kept alive: its id stays its own); others are judged again."""
    if type(safe_globals) is tuple:
        known = _accepted.get(id(safe_globals))
        if known is not None and known[0] is safe_globals:
            return known[1]
    result = normalize_safe_globals(safe_globals)
    if type(safe_globals) is tuple:
        with _accepted_lock:
            if len(_accepted) >= 256:
                _accepted.clear()
            _accepted[id(safe_globals)] = (safe_globals, result)
    return result


_accepted: dict[int, tuple[tuple[Any, ...], tuple[SafeGlobal, ...]]] = {}
_accepted_lock = threading.Lock()


def declared_entries(safe_globals: Any) -> tuple[tuple[Any, str], ...]:
    """``(object or None, name)`` per entry, refusing nothing (a prediction only predicts).  Objects are
    named by ``module.qualname`` as torch's ``_get_user_allowed_globals`` does (never their ``.name``);
    ``'module.Name'`` strings are not imported."""
    _check_declaration(safe_globals)
    entries = (split_entry(item)[:2] for item in safe_globals)
    return tuple((obj, qualified_name(obj) if name is None else name) for obj, name in entries)  # raises, saying why
