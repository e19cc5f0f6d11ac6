"""Observe torch's ``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD`` warning without touching other threads' warnings.

``warnings.catch_warnings`` (before Python 3.14) swaps the process-wide filter
list and ``showwarning``: while one thread records, every other thread's
warnings are recorded too and its own ``-W error`` filters stop applying.
Instead, for the duration of one ``torch.load`` call, this module puts a single
entry at the front of ``warnings.filters`` whose message "regex" is an object
(the warnings machinery calls its ``match(text)``).  It matches only

* in the thread that opened the observation (thread-local),
* torch's FORCE_NO message,
* raised from ``torch.serialization``,

and its action is ``ignore``: that one warning is consumed (the caller asserts
it), and every other warning -- in this thread or any other -- goes through the
filters exactly as without the library (``-W error`` raises it, ``record``
records it once, nothing is re-emitted).

What still crosses threads, precisely: the entry is visible in
``warnings.filters`` while the load runs (it matches nothing in other threads);
adding and removing it resets the "already warned" registries as any
``warnings.filterwarnings`` call does, so a ``once``/``default`` warning may be
shown again; and ``catch_warnings`` entered or left by another thread during the
load (not thread-safe by Python's own documentation) may drop the entry for the
rest of that load or keep an inert copy in the list it restores.
"""

from __future__ import annotations

import re
import sys
import threading
import warnings
from contextlib import contextmanager
from typing import Any, Iterator

__all__ = ["observe_force_no_warning", "FORCE_NO_WARNING"]

FORCE_NO_WARNING = re.compile(r"TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD detected")
_local = threading.local()
_entry_lock = threading.Lock()


class Observation:
    """How many FORCE_NO warnings torch raised in this thread during the observation."""

    def __init__(self) -> None:
        self.count = 0
        self.installed = False

    @property
    def seen(self) -> bool:
        return self.count > 0


def _from_torch_serialization() -> bool:
    frame: Any = sys._getframe(2)
    for _ in range(6):  # C warn -> torch.load; the pure-Python warnings adds two frames
        if frame is None:
            return False
        if frame.f_globals.get("__name__") == "torch.serialization":
            return True
        frame = frame.f_back
    return False


class _ThreadMatcher:
    """A ``warnings.filters`` message matcher that matches only the observing thread's torch warning."""

    def match(self, text: Any) -> bool:
        try:
            stack = getattr(_local, "stack", None)
            if not stack or not isinstance(text, str) or not FORCE_NO_WARNING.search(text):
                return False
            if not _from_torch_serialization():
                return False
            stack[-1].count += 1
            return True
        except Exception:  # noqa: BLE001 - a filter must never raise into someone's warn()
            return False

    def __repr__(self) -> str:
        return "<torch_serial_testing: this thread's TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD warning>"


_MATCHER = _ThreadMatcher()
_ENTRY = ("ignore", _MATCHER, UserWarning, None, 0)
_users = 0


def _mutated() -> None:
    mutated = getattr(warnings, "_filters_mutated", None)
    if mutated is not None:
        mutated()


def _install() -> None:
    global _users
    with _entry_lock:
        _users += 1
        filters = warnings.filters
        if not filters or filters[0] is not _ENTRY:
            # Drop an inert copy another thread's catch_warnings may have kept, then put it first.
            filters[:] = [f for f in filters if f is not _ENTRY]
            filters.insert(0, _ENTRY)
            _mutated()


def _uninstall() -> None:
    global _users
    with _entry_lock:
        _users -= 1
        if _users <= 0:
            _users = 0
            if any(f is _ENTRY for f in warnings.filters):
                warnings.filters[:] = [f for f in warnings.filters if f is not _ENTRY]
                _mutated()


@contextmanager
def observe_force_no_warning() -> Iterator[Observation]:
    """Count torch's FORCE_NO warnings raised in this thread inside the block, consuming only them."""
    from .isolation import deferred_interrupts

    observation = Observation()
    stack = getattr(_local, "stack", None)
    if stack is None:
        stack = _local.stack = []
    try:
        with deferred_interrupts():
            stack.append(observation)
            _install()
            observation.installed = True
        yield observation
    finally:
        with deferred_interrupts():
            if observation in stack:
                stack.remove(observation)
            if observation.installed:
                observation.installed = False
                _uninstall()
