"""Process-wide state a test may change, captured before and restored after it.

Covered: the quantized engine, the qnnpack mobile CPU allocator, torch's
safe-globals registry, every ``TORCH_FORCE_*`` environment variable and
``torch.utils.serialization.config``.  :meth:`GlobalState.restore` puts each
back and returns a description of what had leaked, so the mixin can fail the
leaking test while the next one starts clean.  Registrations made before the
snapshot (a backend's import-time ``add_safe_globals``) are part of the
snapshot and therefore survive every test.

Interrupts: unittest re-raises ``KeyboardInterrupt`` without running cleanups,
so the mixin also restores in a ``finally`` around the whole run.  Every
restore step is idempotent (it reads the current state and writes the
snapshot) and changes each piece of state in one step, so wherever an
interrupt lands each piece is either as the test left it or as it was before,
never in between (the registry is never empty, the two ``TORCH_FORCE_*``
switches are never both set unless they were).  While a restore runs in the
main thread, SIGINT is held back and delivered when it ends; an interrupt
raised inside a step anyway (not by a signal) makes the step run again and the
remaining steps run before it propagates.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Optional

from ..core.environ import stored_environ
from ..core.interrupts import deferred_interrupts, run_all
from ..core.names import show_name, torch_key
from ..policy.trust import judge_registry_entry
from ..torch_facts import engines
from ..torch_facts.config import restore_serialization_config, serialization_config
from ..torch_facts.registry import ImportRegistrations, restore_registry, snapshot_registry, start_recording, stop_recording

__all__ = ["GlobalState"]


def _watched_env() -> dict[str, Optional[str]]:
    """Every ``TORCH_FORCE_*`` variable and its value (read twice per test)."""
    env = os.environ
    stored = stored_environ(env)
    if stored is not None:  # match the prefix on the stored keys, decode only the matches
        data, encode, decode = stored
        prefix = encode(_WATCHED_PREFIX)
        names = [decode(k) for k in data if k.startswith(prefix)]
    else:  # pragma: no cover - another os.environ implementation
        names = [k for k in env if k.startswith(_WATCHED_PREFIX)]
    return {k: env.get(k) for k in names}


_WATCHED_PREFIX = "TORCH_FORCE_"


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
    import_registrations: ImportRegistrations
    restored: bool = False

    @classmethod
    def capture(cls) -> "GlobalState":
        """Read the state; the import recorder is started last, so an interrupt never leaks it."""
        with deferred_interrupts():
            qengine, allocator = engines.engine_state()
            state = cls(
                qengine=qengine,
                allocator=allocator,
                registry=snapshot_registry(),
                env=_watched_env(),
                config=serialization_config(),
                import_registrations=ImportRegistrations(),
            )
            state.import_registrations = start_recording(judge_registry_entry)
            return state

    def dangerous_registrations(self) -> list[str]:
        """Registry entries in the snapshot that the danger check refuses (registered before the test)."""
        out = []
        for entry in self.registry:
            reason = judge_registry_entry(entry)
            if reason:
                out.append(f"{show_name(_entry_name(entry))}: {reason}")
        return out

    def restore(self) -> list[str]:
        """Restore everything; return one line per thing that had leaked (empty: clean).

        Safe to call twice (the second call finds nothing to do).  Runs with
        SIGINT held back; see the module docstring for what an interrupt can do.
        """
        leaks: dict[str, str] = {}
        with deferred_interrupts():
            run_all([
                lambda: self._restore_recording(),
                lambda: self._restore_engine(leaks),
                lambda: self._restore_allocator(leaks),
                lambda: self._restore_registry(leaks),
                lambda: self._restore_env(leaks),
                lambda: self._restore_config(leaks),
            ])
            self.restored = True
        return [leaks[k] for k in ("engine", "allocator", "registry", "env", "config") if k in leaks]

    # Each step reads the current state, notes a difference and writes the snapshot back.

    def _restore_recording(self) -> None:
        stop_recording(self.import_registrations)

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
            leaks["allocator"] = (
                "the qnnpack mobile CPU allocator is still installed" if now
                else "the qnnpack mobile CPU allocator was removed"
            )
            engines.set_allocator(self.allocator)

    def _restore_registry(self, leaks: dict[str, str]) -> None:
        current = snapshot_registry()
        if set(current) == set(self.registry):
            return
        # A module imported during the test may register globals at import time
        # (torch.distributed.tensor, a device backend): that is not a leak, keep it.
        kept = self.import_registrations.kept
        imported = [g for g in current if g not in self.registry and g in kept]
        added = sorted(_entry_name(g) for g in current if g not in self.registry and g not in imported)
        removed = sorted(_entry_name(g) for g in self.registry if g not in current)
        if added or removed:
            leaks["registry"] = f"safe-globals registry changed (added {added}, removed {removed})"
        restore_registry([*self.registry, *imported])

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
        now = serialization_config()
        if now != self.config:
            diff = sorted(k for k in self.config if now is not None and now.get(k) != self.config[k])
            leaks["config"] = f"torch.utils.serialization.config changed: {', '.join(diff)}"
            restore_serialization_config(self.config)
