"""``torch.load`` as it is here: replaced (torch_npu replaces it at import) or torch's own, and how
it reports: the ``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD`` warning (torch_npu prints it), where it raised.

The warning filters are never touched (that makes Python forget what it showed once): during a load,
``warnings`` in torch.serialization is rebound to a proxy consuming torch's FORCE_NO warning in the
observing thread (every warning, for probes) and passing the rest to ``warnings.warn`` one frame up,
so filters, ``-W error`` and once-per-location memory behave as without the library (under ``-W
error`` another thread's warning shows one extra frame).
"""

from __future__ import annotations

import io
import re
import sys
import threading
import types
import warnings
from contextlib import contextmanager
from typing import Any, Iterator, Optional

from ..core.interrupts import deferred_interrupts
from .probes import innermost_frame

__all__ = [
    "FORCE_NO_NOTICE",
    "torch_load_replacement",
    "Observation",
    "observe_serialization_warnings",
    "proxy_installed",
    "watch_stdout",
    "raised_by_torch",
    "raiser",
]

#: torch's warning (and torch_npu's printed notice) when TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD applies.
FORCE_NO_NOTICE = re.compile(r"TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD detected")


def torch_load_replacement() -> Optional[str]:
    """Who replaced ``torch.load``, or None if it is torch's own: by identity, never by ``__module__``
    (a ``functools.wraps`` shim copies it; see :func:`.serialization_state.genuine`)."""
    from .serialization_state import replaced_by

    return replaced_by("load")


class Observation:
    """How many FORCE_NO warnings torch raised in the observing thread."""

    __slots__ = ("count", "installed", "consume_all")

    def __init__(self, consume_all: bool = False) -> None:
        self.count = 0
        self.installed = False
        self.consume_all = consume_all

    @property
    def seen(self) -> bool:
        return self.count > 0


_local = threading.local()
_lock = threading.Lock()
_users = 0


class _SerializationWarnings(types.ModuleType):
    """Stands in for ``warnings`` inside torch.serialization while the library loads."""

    def __init__(self, real: Any) -> None:
        super().__init__("warnings")
        self._tst_real = real

    #: Tells :mod:`.serialization_state` this is the module it stands in for, not a replacement.
    _tst_stands_in_for = True

    def __getattr__(self, name: str) -> Any:
        return getattr(self._tst_real, name)

    def warn(self, message: Any, category: Any = None, stacklevel: int = 1, source: Any = None, **kwargs: Any) -> None:
        stack = getattr(_local, "stack", None)
        if stack:
            force_no = bool(FORCE_NO_NOTICE.search(str(message)))
            if force_no or stack[-1].consume_all:
                stack[-1].count += force_no  # this thread's load: observed and consumed (the caller asserts it)
                return
        self._tst_real.warn(message, category, stacklevel + 1, source, **kwargs)  # torch's intended location


def _install() -> None:
    global _users
    import torch.serialization as ser

    with _lock:
        current = getattr(ser, "warnings", None)
        if not isinstance(current, _SerializationWarnings):
            proxy = _SerializationWarnings(current if current is not None else warnings)
            ser.warnings = proxy  # type: ignore[attr-defined]
        _users += 1


def _uninstall() -> None:
    global _users
    import torch.serialization as ser

    with _lock:
        _users = max(0, _users - 1)
        current = getattr(ser, "warnings", None)
        if _users == 0 and isinstance(current, _SerializationWarnings):
            ser.warnings = current._tst_real  # type: ignore[attr-defined]


def proxy_installed() -> bool:
    """Whether torch.serialization's ``warnings`` is the proxy right now (it never is between loads)."""
    import torch.serialization as ser

    return isinstance(getattr(ser, "warnings", None), _SerializationWarnings)


def _close(observation: Observation) -> None:  # idempotent: an interrupted close can simply run again
    with deferred_interrupts():
        stack = getattr(_local, "stack", None) or []
        if observation in stack:
            stack.remove(observation)
        if observation.installed:
            _uninstall()
            observation.installed = False


@contextmanager
def observe_serialization_warnings(consume_all: bool = False) -> Iterator[Observation]:
    """Count torch's FORCE_NO warnings raised in this thread inside the block, consuming only them
    (*consume_all*: every warning torch.serialization raises in this thread, for probes)."""
    observation = Observation(consume_all)
    try:
        with deferred_interrupts():
            stack = getattr(_local, "stack", None)
            if stack is None:
                stack = _local.stack = []
            stack.append(observation)
            _install()
            observation.installed = True
        yield observation
    finally:
        # No call before the try (not even range()): a signal delivered as a call returns would skip
        # the close.  An interrupt landing in _close makes it run again.
        pending: Optional[BaseException] = None
        for _attempt in (1, 2, 3):
            try:
                _close(observation)
                break
            except BaseException as e:  # noqa: BLE001 - re-raised once the proxy is gone
                pending = pending or e
        if pending is not None:
            raise pending


class _Tee:
    """Passes everything through to the real stream and keeps a copy."""

    def __init__(self, stream: Any, copy: io.StringIO) -> None:
        self._stream = stream
        self._copy = copy

    def write(self, text: str) -> int:
        self._copy.write(text)
        return int(self._stream.write(text))

    def flush(self) -> None:
        self._stream.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


@contextmanager
def watch_stdout(active: bool) -> Iterator[Optional[io.StringIO]]:
    """Copy what is printed during a replaced ``torch.load`` (torch_npu prints the FORCE_NO notice)."""
    if not active:
        yield None
        return
    copy = io.StringIO()
    real = sys.stdout
    sys.stdout = _Tee(real, copy)  # type: ignore[assignment]
    try:
        yield copy
    finally:
        sys.stdout = real


def raised_by_torch(error: BaseException) -> bool:
    """Whether the rejection came out of torch's own serialization code, message untouched."""
    frame = innermost_frame(error)
    return frame is not None and frame.f_globals.get("__name__") in (
        "torch.serialization",
        "torch._weights_only_unpickler",
    )


def raiser(error: BaseException) -> str:
    """``module.function`` that raised *error*."""
    frame = innermost_frame(error)
    if frame is None:
        return "?"
    code = frame.f_code
    return f"{frame.f_globals.get('__name__', '?')}.{getattr(code, 'co_qualname', code.co_name)}"
