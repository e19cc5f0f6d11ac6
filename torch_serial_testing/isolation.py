"""Process-wide state a test may change, captured before and restored after it.

Covered: the quantized engine, the qnnpack mobile CPU allocator, torch's
safe-globals registry, every ``TORCH_FORCE_*`` environment variable and
``torch.utils.serialization.config``.  :meth:`GlobalState.restore` puts each
back and returns a description of what had leaked, so the mixin can fail the
leaking test while the next one starts clean.  Registrations made before the
snapshot (a backend's import-time ``add_safe_globals``) are part of the
snapshot and therefore survive every test.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import Any, Optional

from . import allowlist, engines

__all__ = ["GlobalState"]


def _watched_env() -> dict[str, Optional[str]]:
    return {k: v for k, v in os.environ.items() if k.startswith("TORCH_FORCE_")}


def _serialization_config() -> Optional[dict[str, Any]]:
    try:
        from torch.utils.serialization import config
    except ImportError:
        return None
    return config.get_config_copy()


_recorders: list[list[Any]] = []
_original_add: Any = None


def _during_import() -> bool:
    frame = sys._getframe(2)
    while frame is not None:
        if frame.f_code.co_filename.startswith("<frozen importlib._bootstrap"):
            return True
        frame = frame.f_back  # type: ignore[assignment]
    return False


def _recording_add(safe_globals: Any) -> Any:
    if _recorders and _during_import():
        for recorder in _recorders:
            recorder.extend(safe_globals)
    return _original_add(safe_globals)


def _start_recording() -> list[Any]:
    """Note globals registered by module imports (a backend's import-time add_safe_globals)."""
    global _original_add
    from torch import _weights_only_unpickler as wou

    with allowlist.registry_lock:
        if not _recorders:
            _original_add = wou._add_safe_globals
            wou._add_safe_globals = _recording_add
        recorder: list[Any] = []
        _recorders.append(recorder)
        return recorder


def _stop_recording(recorder: list[Any]) -> None:
    from torch import _weights_only_unpickler as wou

    with allowlist.registry_lock:
        if any(r is recorder for r in _recorders):
            _recorders[:] = [r for r in _recorders if r is not recorder]
            if not _recorders and wou._add_safe_globals is _recording_add:
                wou._add_safe_globals = _original_add


@dataclass
class GlobalState:
    """A snapshot of the process-wide state round-trip tests touch."""

    qengine: Optional[str]
    allocator: Optional[bool]
    registry: list[Any]
    env: dict[str, Optional[str]]
    config: Optional[dict[str, Any]]
    import_registrations: list[Any]

    @classmethod
    def capture(cls) -> "GlobalState":
        import torch

        try:
            qengine: Optional[str] = torch.backends.quantized.engine
        except (AttributeError, RuntimeError):
            qengine = None
        return cls(
            qengine=qengine,
            allocator=engines.allocator_installed(),
            registry=allowlist.snapshot_registry(),
            env=_watched_env(),
            config=_serialization_config(),
            import_registrations=_start_recording(),
        )

    def restore(self) -> list[str]:
        """Restore everything; return one line per thing that had leaked (empty: clean)."""
        import torch

        leaks: list[str] = []
        _stop_recording(self.import_registrations)
        if self.qengine is not None and torch.backends.quantized.engine != self.qengine:
            leaks.append(f"quantized engine {torch.backends.quantized.engine!r} (was {self.qengine!r})")
            torch.backends.quantized.engine = self.qengine
        if self.allocator is False and engines.allocator_installed():
            leaks.append("the qnnpack mobile CPU allocator is still installed")
            engines.uninstall_allocator()
        current = allowlist.snapshot_registry()
        if set(current) != set(self.registry):
            # A module imported during the test may register globals at import time
            # (torch.distributed.tensor, a device backend): that is not a leak, keep it.
            imported = [g for g in current if g not in self.registry and g in self.import_registrations]
            added = sorted(allowlist.qualified_name(g) for g in current if g not in self.registry and g not in imported)
            removed = sorted(allowlist.qualified_name(g) for g in self.registry if g not in current)
            if added or removed:
                leaks.append(f"safe-globals registry changed (added {added}, removed {removed})")
            allowlist.restore_registry([*self.registry, *imported])
        env = _watched_env()
        if env != self.env:
            changed = sorted(k for k in set(env) | set(self.env) if env.get(k) != self.env.get(k))
            leaks.append("environment " + ", ".join(f"{k}={env.get(k)!r} (was {self.env.get(k)!r})" for k in changed))
            for k in changed:
                if self.env.get(k) is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = self.env[k]  # type: ignore[assignment]
        if self.config is not None:
            now = _serialization_config()
            if now != self.config:
                from torch.utils.serialization import config

                diff = sorted(k for k in self.config if now is not None and now.get(k) != self.config[k])
                leaks.append(f"torch.utils.serialization.config changed: {', '.join(diff)}")
                config.load_config(self.config)
        return leaks
