"""A class's ``ignore_warnings``, honoured without touching how anyone else's warnings show.

``warnings.catch_warnings`` and ``warnings.filterwarnings`` change the process's filter list,
and every such change makes Python forget which warnings it already showed once per location:
wrapped around each test, a warning plain unittest shows once comes back after every test.
So the library changes the filters once: it puts one entry at the front of ``warnings.filters``
(by list insertion, which makes Python forget nothing), whose message pattern is an object
answering ``match`` with True only while a test whose class ignores that message is running.
Outside such tests the entry matches nothing; a runner that resets the filters (pytest around
every test, unittest's runner around the run) drops it, and the next such test puts it back.
"""

from __future__ import annotations

import re
import threading
import warnings
from typing import Any, Sequence

__all__ = ["start_ignoring", "stop_ignoring"]


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
            warnings.filters.insert(0, _ENTRY)
    return token


def stop_ignoring(token: object) -> None:
    """End what :func:`start_ignoring` began (idempotent); the filter entry stays, matching nothing."""
    with _lock:
        _patterns.active[:] = [(t, p) for t, p in _patterns.active if t is not token]
