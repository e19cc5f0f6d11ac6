"""Process-wide state around a test: what it may change, captured and restored; the warnings it ignores.

:class:`GlobalState` is read in ``setUp`` and put back after the test, each piece read from torch
again: the serialization machinery, the quantized engine and allocator, the safe-globals registry (what
torch's own modules register, whenever they are imported, is kept; so is what another module registers
at its import), the ``TORCH_FORCE_*`` switches and torch's serialization config.  What the test changed
is reported, one line each.

``ignore_warnings``: every ``catch_warnings``/``filterwarnings`` makes Python forget which warnings
it showed once per location, so one entry, matching only while a test whose class ignores the
message runs, is inserted (which forgets nothing) at the front of ``warnings.filters``; a runner
that resets the filters (pytest per test, unittest per run) drops it, and the next such test puts
it back.
"""

from __future__ import annotations

import os
import re
import threading
import warnings
from dataclasses import dataclass
from typing import Any, Optional, Sequence, cast

from . import engines
from .errors import torch_key
from .registry import (
    is_torch_module,
    registrar,
    restore_registry,
    serialization_config,
    snapshot_registry,
    start_recording,
    stop_recording,
)
from .serialization import SerializationState


def _watched_env() -> dict[str, Optional[str]]:
    """Every ``TORCH_FORCE_*`` variable and its value."""
    return {k: v for k, v in os.environ.items() if k.startswith("TORCH_FORCE_")}


def _entry_name(entry: Any) -> str:
    return torch_key(entry) or repr(entry)


@dataclass
class GlobalState:
    """A snapshot of the process-wide state round-trip tests touch."""

    qengine: Optional[str]
    allocator: Optional[bool]
    registry: list[Any]
    env: dict[str, Optional[str]]
    config: Optional[dict[str, Any]]
    serialization: Optional[SerializationState] = None
    restored: bool = False
    #: Safe globals that modules outside torch registered at import time during the test (kept).
    kept_at_import: tuple[str, ...] = ()

    @classmethod
    def capture(cls) -> GlobalState:
        """Read the state, and note who registers safe globals until :meth:`restore`."""
        state = cls(
            *engines.engine_state(),
            snapshot_registry(),
            _watched_env(),
            serialization_config(),
            SerializationState(),
        )
        start_recording()
        return state

    def restore(self) -> list[str]:
        """Restore everything (again: nothing to do); one line per thing that had leaked.  Every step
        runs, and the first error any of them raised is raised after the last."""
        if self.restored:
            return []
        self.restored = True
        stop_recording()
        leaks: dict[str, str] = {}
        error: Optional[Exception] = None
        steps = (
            self._restore_serialization,  # first: the later steps call torch's functions
            self._restore_engine,
            self._restore_allocator,
            self._restore_registry,
            self._restore_env,
            self._restore_config,
        )  # each sets at most its own key: leaks keeps this order
        for step in steps:
            try:
                step(leaks)
            except Exception as e:  # noqa: BLE001 - raised once every step ran
                error = error or e
        if error is not None:
            raise error
        return list(leaks.values())

    # Each step reads the current state, notes a difference in leaks and writes the snapshot back.

    def _restore_serialization(self, leaks: dict[str, str]) -> None:
        if self.serialization is not None:
            changes = self.serialization.restore()
            if changes:
                leaks["serialization"] = "; ".join(changes)

    def _restore_engine(self, leaks: dict[str, str]) -> None:
        import torch

        now = engines.current_qengine()
        if self.qengine is not None and now != self.qengine:
            leaks["engine"] = f"quantized engine {now!r} (was {self.qengine!r})"
            torch.backends.quantized.engine = self.qengine

    def _restore_allocator(self, leaks: dict[str, str]) -> None:
        if self.allocator is None:
            return
        now = engines.allocator_installed()
        if now != self.allocator:
            leaks["allocator"] = f"the qnnpack mobile CPU allocator {'is still installed' if now else 'was removed'}"
            engines.set_allocator(self.allocator)

    def _restore_registry(self, leaks: dict[str, str]) -> None:
        current = snapshot_registry()
        if set(current) == set(self.registry):
            return
        # What torch's own modules registered (a lazy import of torch.distributed.tensor, torch._dynamo)
        # is torch's doing; what another module registered at its import is that module's: both kept.
        kept, at_import = [], []
        for entry in current:
            who = registrar(entry) if entry not in self.registry else None
            if who is not None and (is_torch_module(who[0]) or who[1]):
                kept.append(entry)
                if not is_torch_module(who[0]):
                    at_import.append(_entry_name(entry))
        self.kept_at_import = tuple(sorted(at_import))
        added = sorted(_entry_name(g) for g in current if g not in self.registry and g not in kept)
        removed = sorted(_entry_name(g) for g in self.registry if g not in current)
        if added or removed:
            leaks["registry"] = (
                f"safe-globals registry changed (added {added}, removed {removed}); declare what a "
                "load needs (safe_globals), or register inside a torch.serialization.safe_globals([...]) block"
            )
        restore_registry([*self.registry, *kept])

    def _restore_env(self, leaks: dict[str, str]) -> None:
        env = _watched_env()
        if env == self.env:
            return
        changed = sorted(k for k in set(env) | set(self.env) if env.get(k) != self.env.get(k))
        leaks["env"] = "environment " + ", ".join(f"{k}={env.get(k)!r} (was {self.env.get(k)!r})" for k in changed)
        # Removals first: the two TORCH_FORCE_* switches are never both set on the way back.
        for k in changed:
            if self.env.get(k) is None:
                os.environ.pop(k, None)
        for k in changed:
            value = self.env.get(k)
            if value is not None:
                os.environ[k] = value

    def _restore_config(self, leaks: dict[str, str]) -> None:
        if self.config is None:
            return
        from .registry import restore_serialization_config, serialization_config

        now = serialization_config()
        if now != self.config:
            diff = sorted(k for k in self.config if now is not None and now.get(k) != self.config[k])
            leaks["config"] = f"torch.utils.serialization.config changed: {', '.join(diff)}"
            restore_serialization_config(self.config)


class _WhileTestsRun:
    """The message pattern of the library's one filter entry: the running tests' patterns."""

    def __init__(self) -> None:
        self.active: list[tuple[object, tuple[re.Pattern[str], ...]]] = []

    def match(self, text: str) -> bool:
        return any(p.match(text) for _token, patterns in list(self.active) for p in patterns)

    def __repr__(self) -> str:
        return "<the ignore_warnings of the running torch_serial_testing tests>"


_patterns = _WhileTestsRun()

_ENTRY: Any = ("ignore", _patterns, Warning, None, 0)

_lock = threading.Lock()


def start_ignoring(messages: Sequence[str]) -> object:
    """Ignore warnings whose message matches one of *messages* (regexes) until :func:`stop_ignoring`."""
    token = object()
    compiled = tuple(re.compile(m, re.I) for m in messages)  # as filterwarnings compiles them
    with _lock:
        _patterns.active.append((token, compiled))
        if not any(f is _ENTRY for f in warnings.filters):
            cast(list, warnings.filters).insert(0, _ENTRY)  # a list at run time; typeshed says Sequence
    return token


def stop_ignoring(token: object) -> None:
    """End what :func:`start_ignoring` began (idempotent); the filter entry stays, matching nothing."""
    with _lock:
        _patterns.active[:] = [(t, p) for t, p in _patterns.active if t is not token]
