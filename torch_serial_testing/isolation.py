"""Process-wide state around a test: what it may change, captured and restored; the warnings it ignores.
Adding a filter through Python's warnings API makes it forget which warnings it showed once, so ``ignore_warnings``
is one entry, matching only while a test ignoring the message runs, put at the front of ``warnings.filters``
directly (which forgets nothing); a runner resetting the filters drops it, and the next such test puts it back."""

from __future__ import annotations

import os
import re
import threading
import warnings
from dataclasses import dataclass
from typing import Any, Optional, Sequence, cast

import torch

from . import dimensions, registry
from .errors import torch_key
from .modes import set_environ
from .serialization import SerializationState


def _watched_env() -> dict[str, Optional[str]]:
    return {k: os.environ.get(k) for k in os.environ if k.startswith("TORCH_FORCE_")}  # (keys: decoded once)


def _entry_name(entry: Any) -> str:
    return torch_key(entry) or repr(entry)


def _serialization_config() -> Optional[dict[str, Any]]:
    try:
        from torch.utils.serialization import config
    except ImportError:
        return None
    return dict(config.get_config_copy())  # type: ignore[attr-defined]  # install_config_module adds it


@dataclass
class GlobalState:
    """The process-wide state round-trip tests touch, read in ``setUp`` and put back after the test."""

    qengine: Optional[str]
    allocator: Optional[bool]
    registry: list[Any]
    env: dict[str, Optional[str]]  # the TORCH_FORCE_* switches
    config: Optional[dict[str, Any]]  # torch.utils.serialization.config
    serialization: Optional[SerializationState] = None
    restored: bool = False
    kept_at_import: tuple[str, ...] = ()  #: safe globals modules outside torch registered at import (kept)

    @classmethod
    def capture(cls) -> GlobalState:
        """Read the state, and note who registers safe globals until :meth:`restore`."""
        read = (*dimensions.engine_state(), registry.snapshot_registry(), _watched_env())  # in this order
        state = cls(*read, _serialization_config(), SerializationState())
        registry.start_recording()
        return state

    def restore(self) -> list[str]:
        """Put everything back (once); one line per leak.  Every step runs; the first error is raised after the last."""
        if self.restored:
            return []
        self.restored = True
        registry.stop_recording()
        leaks: dict[str, str] = {}  # each step sets at most its own key: leaks keep the steps' order
        error: Optional[Exception] = None
        # serialization first: the later steps call torch's functions
        for step in (self._serialization, self._engine, self._registry, self._env, self._config):
            try:
                step(leaks)
            except Exception as e:  # noqa: BLE001 - raised once every step ran
                error = error or e
        if error is not None:
            raise error
        return list(leaks.values())

    def _serialization(self, leaks: dict[str, str]) -> None:
        if self.serialization is not None and (changes := self.serialization.restore()):
            leaks["serialization"] = "; ".join(changes)

    def _engine(self, leaks: dict[str, str]) -> None:
        if lines := dimensions.describe_engine_change((self.qengine, self.allocator), dimensions.engine_state()):
            leaks["engine"] = "; ".join(lines)
            if self.qengine is not None and dimensions.current_qengine() != self.qengine:
                torch.backends.quantized.engine = self.qengine
            if self.allocator is not None:
                dimensions.set_allocator(self.allocator)

    def _registry(self, leaks: dict[str, str]) -> None:
        current = registry.snapshot_registry()
        if set(current) == set(self.registry):
            return
        # What torch's own modules registered (a lazy import of torch.distributed.tensor, torch._dynamo)
        # is torch's doing; what another module registered at its import is that module's: both kept.
        kept, at_import = [], []
        for entry in current:
            who = registry.registrar(entry) if entry not in self.registry else None
            if who is not None and (registry.is_torch_module(who[0]) or who[1]):
                kept.append(entry)
                if not registry.is_torch_module(who[0]):
                    at_import.append(_entry_name(entry))
        self.kept_at_import = tuple(sorted(at_import))
        added = sorted(_entry_name(g) for g in current if g not in self.registry and g not in kept)
        removed = sorted(_entry_name(g) for g in self.registry if g not in current)
        if added or removed:
            leaks["registry"] = (
                f"safe-globals registry changed (added {added}, removed {removed}); declare what a "
                "load needs (safe_globals), or register inside a torch.serialization.safe_globals([...]) block"
            )
        registry.restore_registry([*self.registry, *kept])

    def _env(self, leaks: dict[str, str]) -> None:
        env = _watched_env()
        if changed := sorted(k for k in set(env) | set(self.env) if env.get(k) != self.env.get(k)):
            leaks["env"] = "environment " + ", ".join(f"{k}={env.get(k)!r} (was {self.env.get(k)!r})" for k in changed)
            set_environ({k: self.env.get(k) for k in changed})

    def _config(self, leaks: dict[str, str]) -> None:
        if self.config is not None and (now := _serialization_config()) != self.config:
            diff = sorted(k for k in self.config if now is not None and now.get(k) != self.config[k])
            leaks["config"] = f"torch.utils.serialization.config changed: {', '.join(diff)}"
            from torch.utils.serialization import config

            config.load_config(self.config)  # type: ignore[attr-defined]


_active: list[tuple[object, tuple[re.Pattern[str], ...]]] = []  # the running tests' (token, patterns)


class _WhileTestsRun:
    """The message pattern of the library's one filter entry: the running tests' patterns."""

    def match(self, text: str) -> bool:
        return any(p.match(text) for _token, patterns in list(_active) for p in patterns)

    def __repr__(self) -> str:
        return "<the ignore_warnings of the running torch_serial_testing tests>"


_ENTRY: Any = ("ignore", _WhileTestsRun(), Warning, None, 0)
_lock = threading.Lock()


def start_ignoring(messages: Sequence[str]) -> object:
    """Ignore warnings whose message matches one of *messages* (regexes) until :func:`stop_ignoring`."""
    token = object()
    with _lock:
        _active.append((token, tuple(re.compile(m, re.I) for m in messages)))  # as filterwarnings does
        if not any(f is _ENTRY for f in warnings.filters):
            cast(list, warnings.filters).insert(0, _ENTRY)  # a list at run time; typeshed says Sequence
    return token


def stop_ignoring(token: object) -> None:
    """End what :func:`start_ignoring` began (idempotent); the filter entry stays, matching nothing."""
    with _lock:
        _active[:] = [(t, p) for t, p in _active if t is not token]
