"""Observe torch's ``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD`` warning without touching anyone else's warnings.

``warnings.catch_warnings`` (before Python 3.14) swaps the process-wide filter
list and ``showwarning``: while one thread records, every other thread's
warnings are recorded too and its own ``-W error`` filters stop applying.
Editing ``warnings.filters`` in place is no better: another thread walking the
list while it shifts skips an entry (its ``error`` filter, say).

So the process's warning filters are never touched.  For the duration of one
``torch.load`` call, the name ``warnings`` *inside torch.serialization* is
rebound to a proxy of the module it was (one atomic rebinding each way).  The
proxy's ``warn`` consumes exactly one kind of warning -- torch's FORCE_NO
message raised in the thread that opened the observation -- and counts it for
the caller to assert.  Everything else, in this thread or any other, is passed
to the real ``warnings.warn`` with the same location (``stacklevel`` + 1), so
filters, ``-W error`` and ``record`` behave exactly as without the library.

What still crosses threads, precisely: while a round trip loads, a warning
that torch.serialization raises in *another* thread passes through the proxy
(same message, category and location; under ``-W error`` its traceback shows
one extra frame, the proxy's).  Nothing else is changed.
"""

from __future__ import annotations

import re
import threading
import types
import warnings
from contextlib import contextmanager
from typing import Any, Iterator, Optional

__all__ = ["observe_force_no_warning", "FORCE_NO_WARNING", "Observation"]

FORCE_NO_WARNING = re.compile(r"TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD detected")
_local = threading.local()
_lock = threading.Lock()


class Observation:
    """How many FORCE_NO warnings torch raised in this thread during the observation."""

    def __init__(self) -> None:
        self.count = 0
        self.installed = False

    @property
    def seen(self) -> bool:
        return self.count > 0


class _SerializationWarnings(types.ModuleType):
    """Stands in for ``warnings`` inside torch.serialization while a round trip loads."""

    def __init__(self, real: Any) -> None:
        super().__init__("warnings")
        self._tst_real = real

    def __getattr__(self, name: str) -> Any:
        return getattr(self._tst_real, name)

    def warn(self, message: Any, category: Any = None, stacklevel: int = 1, source: Any = None, **kwargs: Any) -> None:
        stack = getattr(_local, "stack", None)
        if stack and FORCE_NO_WARNING.search(str(message)):
            stack[-1].count += 1  # this thread's load: observed and consumed (the caller asserts it)
            return
        # One frame more than torch's own call: the warning keeps torch's intended location.
        self._tst_real.warn(message, category, stacklevel + 1, source, **kwargs)


_proxy: Optional[_SerializationWarnings] = None
_users = 0


def _install() -> None:
    global _proxy, _users
    import torch.serialization as ser

    with _lock:
        current = getattr(ser, "warnings", None)
        if not isinstance(current, _SerializationWarnings):
            _proxy = _SerializationWarnings(current if current is not None else warnings)
            ser.warnings = _proxy  # type: ignore[attr-defined]
        _users += 1


def _uninstall() -> None:
    global _users
    import torch.serialization as ser

    with _lock:
        _users -= 1
        if _users <= 0:
            _users = 0
            current = getattr(ser, "warnings", None)
            if isinstance(current, _SerializationWarnings):
                ser.warnings = current._tst_real  # type: ignore[attr-defined]


def installed() -> bool:
    """Whether torch.serialization's ``warnings`` is the proxy right now (tests check it is not, after)."""
    import torch.serialization as ser

    return isinstance(getattr(ser, "warnings", None), _SerializationWarnings)


def _open(observation: Observation) -> None:
    stack = getattr(_local, "stack", None)
    if stack is None:
        stack = _local.stack = []
    stack.append(observation)
    _install()
    observation.installed = True


def _close(observation: Observation) -> None:
    """Idempotent: an interrupted close can simply run again."""
    from .isolation import deferred_interrupts

    with deferred_interrupts():
        stack = getattr(_local, "stack", None) or []
        if observation in stack:
            stack.remove(observation)
        if observation.installed:
            _uninstall()
            observation.installed = False


@contextmanager
def observe_force_no_warning() -> Iterator[Observation]:
    """Count torch's FORCE_NO warnings raised in this thread inside the block, consuming only them."""
    from .isolation import deferred_interrupts

    observation = Observation()
    try:
        with deferred_interrupts():
            _open(observation)
        yield observation
    finally:
        # No call before the try: an interrupt landing in _close makes it run again.
        pending: Optional[BaseException] = None
        attempts = 0
        while True:
            attempts += 1
            try:
                _close(observation)
                break
            except BaseException as e:  # noqa: BLE001 - re-raised once the proxy is gone
                pending = pending or e
                if attempts >= 3:
                    break
        if pending is not None:
            raise pending
