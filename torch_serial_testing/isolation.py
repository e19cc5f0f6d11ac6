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
import signal
import sys
import threading
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

from . import allowlist, engines
from .environ import stored_environ
from .errors import RoundTripConfigError
from .names import show_name

__all__ = ["GlobalState", "deferred_interrupts", "run_all", "judge_registry_entry"]


class deferred_interrupts:  # noqa: N801 - used as ``with deferred_interrupts():``, like a function
    """Hold SIGINT's Python handler back for the block; deliver a signal that arrived after it.

    Python runs signal handlers in the main thread only, so elsewhere this is a no-op.
    Nested blocks hand the signal outwards; the outermost calls the real handler.

    A class rather than a generator, and ``_signal``'s functions rather than ``signal``'s
    (which convert every handler to an enum member, raising and catching a ``ValueError`` for a
    Python function): every engine switch and state snapshot of every test opens one.
    """

    __slots__ = ("_previous", "_received")

    def __enter__(self) -> None:
        global _held_depth
        self._previous: Any = None
        if _held_depth or threading.current_thread() is not threading.main_thread():
            # Inside an outer block of the main thread (its handler already holds SIGINT back and
            # delivers it when that block ends), or in another thread: nothing to install.
            return
        try:
            previous = _signals.getsignal(signal.SIGINT)
        except (ValueError, OSError):  # pragma: no cover - no signal support here
            return
        if not callable(previous):  # SIG_IGN / SIG_DFL / installed from C: nothing runs in Python
            return
        self._received: list[tuple[int, Any]] = []
        try:
            _signals.signal(signal.SIGINT, self._hold)
        except (ValueError, OSError):  # pragma: no cover - e.g. a subinterpreter
            return
        self._previous = previous
        _held_depth += 1

    def _hold(self, signum: int, frame: Any) -> None:
        self._received.append((signum, frame))

    def __exit__(self, *exc: Any) -> None:
        global _held_depth
        previous = self._previous
        if previous is None:
            return
        self._previous = None
        _held_depth -= 1
        _signals.signal(signal.SIGINT, previous)
        if self._received:
            previous(*self._received[0])


try:  # the C functions under signal.signal / signal.getsignal, without the enum conversion
    import _signal as _signals
except ImportError:  # pragma: no cover - an implementation without CPython's _signal
    _signals = signal  # type: ignore[assignment]

#: How many deferred_interrupts blocks of the main thread are open (only the outermost installs).
_held_depth = 0


def run_all(steps: Sequence[Callable[[], None]]) -> None:
    """Run every step even if one fails or is interrupted; then raise the first problem.

    A step interrupted (``KeyboardInterrupt``, ``SystemExit``) runs once more:
    steps are idempotent, so a second run finishes what the first began.
    """
    first_interrupt: Optional[BaseException] = None
    first_error: Optional[BaseException] = None
    for step in steps:
        for attempt in range(2):
            try:
                step()
                break
            except Exception as e:  # noqa: BLE001 - raised after the other steps ran
                first_error = first_error or e
                break
            except BaseException as e:  # noqa: BLE001 - an interrupt: finish the restore first
                first_interrupt = first_interrupt or e
    if first_interrupt is not None:
        raise first_interrupt
    if first_error is not None:
        raise first_error


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


def _serialization_config() -> Optional[dict[str, Any]]:
    try:
        from torch.utils.serialization import config
    except ImportError:
        return None
    return config.get_config_copy()


def judge_registry_entry(entry: Any) -> Optional[str]:
    """Why a registry entry (object or ``(object, name)``) must not be registered, or None.

    The trust policy's check (name and real identity, the denylist) with functions
    accepted: torch and backends register rebuild functions themselves
    (``torch.nested``'s ``_rebuild_njt``, torch_npu's ``_rebuild_npu_tensor``).
    """
    from .trust import judge_global

    obj, name = entry if isinstance(entry, tuple) and len(entry) == 2 else (entry, None)
    if _torch_own_class(obj, name):
        return None
    return judge_global(entry, opt_in=True)


def _torch_own_class(obj: Any, name: Optional[str]) -> bool:
    """A class torch defines, registered under its own name: torch's registration (``torch._dynamo``'s
    ``_DimRange``), not to be second-guessed by the denylist's module families."""
    module = getattr(obj, "__module__", None) if isinstance(obj, type) else None
    if not isinstance(module, str) or not (module == "torch" or module.startswith("torch.")):
        return False
    real = f"{module}.{obj.__qualname__}"
    return (name is None or name == real) and vars(sys.modules.get(module, object)).get(obj.__qualname__) is obj


def _entry_name(entry: Any) -> str:
    try:
        return allowlist.qualified_name(entry)
    except RoundTripConfigError:
        return repr(entry)


class ImportRegistrations:
    """What modules imported during one test registered with ``add_safe_globals``."""

    __slots__ = ("kept", "refused")

    def __init__(self) -> None:
        self.kept: list[Any] = []
        #: (name, importing module, why refused) for every dangerous entry that was not registered.
        self.refused: list[tuple[str, str, str]] = []

    def __repr__(self) -> str:
        return f"ImportRegistrations(kept={self.kept!r}, refused={self.refused!r})"

    def __eq__(self, other: object) -> bool:  # as the dataclass it was: GlobalState compares it by value
        if other.__class__ is not ImportRegistrations:
            return NotImplemented
        return (self.kept, self.refused) == (other.kept, other.refused)  # type: ignore[attr-defined]

    __hash__ = None  # type: ignore[assignment]  # mutable, compared by value


_recorders: list[ImportRegistrations] = []
_original_add: Any = None


def _importer() -> Optional[str]:
    """The module whose import is running ``add_safe_globals`` (None: no import on the stack)."""
    frame: Any = sys._getframe(2)
    caller: Optional[str] = None
    while frame is not None:
        name = frame.f_globals.get("__name__", "")
        if frame.f_code.co_filename.startswith("<frozen importlib._bootstrap"):
            return caller or "?"
        if caller is None and not name.startswith(("torch.serialization", "torch._weights_only_unpickler")):
            caller = name
        frame = frame.f_back
    return None


def _recording_add(safe_globals: Any) -> Any:
    importer = _importer() if _recorders else None
    if importer is None:
        return _original_add(safe_globals)
    # A registration made by a module being imported during a test: judged like a declaration.
    accepted = []
    for entry in list(safe_globals):
        reason = judge_registry_entry(entry)
        for recorder in list(_recorders):
            if reason:
                recorder.refused.append((_entry_name(entry), importer, reason))
            else:
                recorder.kept.append(entry)
        if not reason:
            accepted.append(entry)
    return _original_add(accepted)


def _start_recording() -> ImportRegistrations:
    """Note globals registered by module imports (a backend's import-time add_safe_globals)."""
    global _original_add
    from torch import _weights_only_unpickler as wou

    with allowlist.registry_lock, deferred_interrupts():
        recorder = ImportRegistrations()
        if not _recorders:
            _original_add = wou._add_safe_globals
            _recorders.append(recorder)
            wou._add_safe_globals = _recording_add
        else:
            _recorders.append(recorder)
        return recorder


def _stop_recording(recorder: ImportRegistrations) -> None:
    from torch import _weights_only_unpickler as wou

    with allowlist.registry_lock:
        # One rebinding each: an interrupt leaves the hook either installed or not.
        _recorders[:] = [r for r in _recorders if r is not recorder]
        if not _recorders and wou._add_safe_globals is _recording_add:
            wou._add_safe_globals = _original_add


def recording_active() -> bool:
    """Whether torch's ``_add_safe_globals`` is currently replaced by the import recorder."""
    from torch import _weights_only_unpickler as wou

    return wou._add_safe_globals is _recording_add


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
                registry=allowlist.snapshot_registry(),
                env=_watched_env(),
                config=_serialization_config(),
                import_registrations=ImportRegistrations(),
            )
            state.import_registrations = _start_recording()
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
        _stop_recording(self.import_registrations)

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
        current = allowlist.snapshot_registry()
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
        allowlist.restore_registry([*self.registry, *imported])

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
        now = _serialization_config()
        if now != self.config:
            from torch.utils.serialization import config

            diff = sorted(k for k in self.config if now is not None and now.get(k) != self.config[k])
            leaks["config"] = f"torch.utils.serialization.config changed: {', '.join(diff)}"
            config.load_config(self.config)
