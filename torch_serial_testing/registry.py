"""torch's allowlists: its built-in one (``_get_allowed_globals()``), the process-wide registry (``add_safe_globals``,
or an open ``safe_globals`` context) and who registered what.  Every change the library makes is serialised behind
:data:`registry_lock`.  While a test runs, torch's ``_add_safe_globals`` is wrapped to note the module whose code
registered each entry (:func:`registrar`): what torch's own modules register is torch's doing, whenever imported."""

from __future__ import annotations

import sys
import threading
from contextlib import contextmanager, nullcontext, suppress
from typing import Any, Iterator, Optional, Sequence

import torch
from torch import _weights_only_unpickler as wou

from .errors import torch_key

#: Held while the library reads or changes torch's process-wide registry, and around each prediction
#: and the load it predicts, so both see the same registry.
registry_lock = threading.RLock()


def torch_allowlist_table() -> Any:
    """torch's own allowlist (name -> object) as torch holds it: the same object while it is unchanged."""
    return wou._get_allowed_globals()


def torch_allowlist() -> frozenset[str]:
    """Names torch's weights-only unpickler accepts without any registration."""
    return torch_allowlist_view()[0]


def torch_allowlist_view() -> tuple[frozenset[str], frozenset[str], dict[str, Any]]:
    """torch's allowlist: (its names, the real names of its values: BUILD's types, each name -> object), per table."""
    table = wou._get_allowed_globals()
    if not (_view and _view[0] is table and _view[1] == len(table)):
        classes: dict[str, Any] = {}
        for name, obj in table.items():
            classes[name] = classes[torch_key(obj) or name] = obj
        view = (frozenset(table), frozenset(filter(None, map(torch_key, table.values()))), classes)
        _view[:] = [table, len(table), view]
    return _view[2]  # type: ignore[no-any-return]


_view: list[Any] = []


def snapshot_registry() -> list[Any]:
    return list(torch.serialization.get_safe_globals())


def registered_entries() -> list[tuple[str, Any]]:
    """(name, entry) of every process-wide registration, sorted by name."""
    named = ((torch_key(g) or f"<unnamed {type(g).__name__}>", g) for g in snapshot_registry())
    return sorted(named, key=lambda pair: pair[0])


def registered_globals() -> frozenset[str]:
    """Names registered process-wide right now (``add_safe_globals`` or an open context)."""
    return frozenset(torch_key(g) or f"<unnamed {type(g).__name__}>" for g in torch.serialization.get_safe_globals())


def restore_registry(snapshot: Sequence[Any]) -> None:
    """Make the registry equal *snapshot*: rebind torch's set (torch >= 2.5) or list, else add and remove entries."""
    with registry_lock:
        current = torch.serialization.get_safe_globals()
        if set(current) == set(snapshot):
            return
        for attr, kind in (("_marked_safe_globals_set", set), ("_marked_safe_globals_list", list)):
            if isinstance(getattr(wou, attr, None), kind):
                setattr(wou, attr, kind(snapshot))
                return
        if missing := [g for g in snapshot if g not in current]:
            wou._add_safe_globals(missing)
        if extra := [g for g in current if g not in snapshot]:
            wou._remove_safe_globals(extra)


@contextmanager
def preserved_registry() -> Iterator[None]:
    with registry_lock:
        snap = snapshot_registry()
        try:
            yield
        finally:
            restore_registry(snap)


def safe_globals_context_missing() -> Optional[str]:
    if hasattr(torch.serialization, "safe_globals"):
        return None
    return (
        f"the safe_globals mode needs torch.serialization.safe_globals (torch >= 2.5); "
        f"torch {torch.__version__} lacks it"
    )


@contextmanager
def allowlisted(entries: Sequence[Any]) -> Iterator[None]:
    """Trust *entries* for the weights-only loads inside the block: ``safe_globals`` where torch has it,
    else ``add_safe_globals`` undone on exit.  For probes: the ``safe_globals`` load mode never falls back."""
    context = getattr(torch.serialization, "safe_globals", None)
    with preserved_registry(), nullcontext() if context is None else context(list(entries)):
        if context is None:
            torch.serialization.add_safe_globals(list(entries))
        yield


#: Registry entry -> (the module whose code called ``add_safe_globals``, whether an import was running it),
#: for every registration made while a test ran (:func:`start_recording` .. :func:`stop_recording`).
_registrars: dict[Any, tuple[str, bool]] = {}
_recording = 0
_original_add: Any = None


def is_torch_module(name: str) -> bool:
    return name == "torch" or name.startswith("torch.")


def _recording_add(safe_globals: Any) -> Any:
    """torch's ``_add_safe_globals``, noting who made each registration: the calling module past torch's
    serialization modules, and whether a module import is running that call (registered at import time)."""
    entries = list(safe_globals)
    frame: Any = sys._getframe(1)
    caller: Optional[str] = None
    at_import = False
    while frame is not None:
        name = frame.f_globals.get("__name__", "")
        if name.startswith("importlib._bootstrap") or name == "_frozen_importlib":
            at_import = True
            break
        if caller is None and name not in ("torch.serialization", "torch._weights_only_unpickler"):
            caller = name
        frame = frame.f_back
    for entry in entries:
        with suppress(TypeError):  # unhashable: torch's set refuses it too
            _registrars[entry] = (caller or "?", at_import)
    return _original_add(entries)


def start_recording() -> None:
    """Note who registers what until the matching :func:`stop_recording` (nested calls count)."""
    global _original_add, _recording
    with registry_lock:
        if _recording == 0:
            _original_add = wou._add_safe_globals
            wou._add_safe_globals = _recording_add
        _recording += 1


def stop_recording() -> None:
    global _recording
    with registry_lock:
        _recording = max(0, _recording - 1)
        if _recording == 0 and wou._add_safe_globals is _recording_add:
            wou._add_safe_globals = _original_add


def registrar(entry: Any) -> Optional[tuple[str, bool]]:
    """(module, at import time) of whoever registered *entry* while a test ran, or None (not seen)."""
    with suppress(TypeError):  # unhashable: never registered
        return _registrars.get(entry)
    return None


def registered_by_torch(entry: Any) -> bool:
    """Whether *entry* is torch's own registration: made by a ``torch.*`` module when the library saw it; else
    (registered before) an object of ``torch.*`` or the standard library (torch 2.14 registers builtin exceptions)."""
    if (seen := registrar(entry)) is not None:
        return is_torch_module(seen[0])
    real = torch_key(entry[0] if isinstance(entry, tuple) and len(entry) == 2 else entry)
    module = real.rpartition(".")[0] if real else ""
    top = module.partition(".")[0]
    return bool(module) and (is_torch_module(module) or top in getattr(sys, "stdlib_module_names", ("builtins",)))
