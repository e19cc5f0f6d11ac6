"""Holding SIGINT back while process-wide state is switched or restored, and restores that finish.

unittest re-raises ``KeyboardInterrupt`` without running cleanups, and a signal can land between any
two bytecodes: every switch and restore of a test's state runs inside :class:`deferred_interrupts`,
and a restore runs its steps with :func:`run_all`.
"""

from __future__ import annotations

import signal
import threading
from typing import Any, Callable, Optional, Sequence

try:  # the C functions under signal.signal / signal.getsignal, without the enum conversion
    import _signal as _signals
except ImportError:  # pragma: no cover - an implementation without CPython's _signal
    _signals = signal  # type: ignore[assignment]


#: How many deferred_interrupts blocks of the main thread are open (only the outermost installs).
_held_depth = 0


class deferred_interrupts:  # noqa: N801 - used as ``with deferred_interrupts():``, like a function
    """Hold SIGINT's Python handler back for the block; deliver a signal that arrived when it ends (a
    no-op outside the main thread; nested blocks leave it to the outermost).  It calls ``_signal``:
    ``signal``'s wrappers convert each handler to an enum member, raising and catching a ValueError."""

    __slots__ = ("_previous", "_received")

    def __enter__(self) -> None:
        global _held_depth
        self._previous: Any = None
        if _held_depth or threading.current_thread() is not threading.main_thread():
            return
        try:
            previous = _signals.getsignal(signal.SIGINT)
            if not callable(previous):  # SIG_IGN / SIG_DFL / installed from C: nothing runs in Python
                return
            self._received: list[tuple[int, Any]] = []
            _signals.signal(signal.SIGINT, self._hold)
        except (ValueError, OSError):  # pragma: no cover - no signal support here, e.g. a subinterpreter
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


def run_all(steps: Sequence[Callable[[], None]]) -> None:
    """Run every step even if one fails or is interrupted, then raise the first problem.  An interrupted
    step runs once more: steps are idempotent, so the second run finishes what the first began."""
    first_interrupt: Optional[BaseException] = None
    first_error: Optional[BaseException] = None
    for step in steps:
        for _attempt in (1, 2):  # no call here: a signal delivered as range() returned would skip the step
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
