"""A replaced ``torch.load``: who replaced it, and how it reports differently from torch's own.

Out-of-tree backends patch ``torch.load`` (torch_npu sets it to its own copy at
import; ``torch.serialization.load`` stays torch's).  Such a loader is judged by
its outcome -- loaded, or rejected naming a missing global -- like torch's own.
What may legitimately differ is how it *reports*, and this module turns those
differences into facts for the outcome text: the TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD
notice printed instead of warned (torch_npu prints it), a rejection message worded
by the replacement (torch_npu adds an error-code suffix such as
``ERR00010 PTA system call failed``), and the globals registered process-wide
(torch_npu registers its ``_rebuild_npu_tensor``).
"""

from __future__ import annotations

import functools
import io
import os
import re
import sys
from contextlib import contextmanager
from typing import Any, Iterator, Optional, Sequence

__all__ = ["FORCE_NO_NOTICE", "torch_load_replacement", "watch_stdout", "replacement_notes"]

FORCE_NO_WO = "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD"
#: torch's warning (and torch_npu's printed notice) when TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD applies.
FORCE_NO_NOTICE = re.compile(r"TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD detected")


def torch_load_replacement() -> Optional[str]:
    """Who replaced ``torch.load`` (out-of-tree backends patch it), or None if it is torch's own."""
    import torch

    return _describe_load(torch.load)


@functools.lru_cache(maxsize=8)
def _describe_load(fn: Any) -> Optional[str]:
    import torch.serialization as ser

    code = getattr(fn, "__code__", None)
    own_file = os.path.splitext(os.path.realpath(ser.__file__))[0]
    if code is not None and os.path.splitext(os.path.realpath(code.co_filename))[0] == own_file:
        return None
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"


class _Tee:
    """Passes everything through to the real stream (and its other attributes) and keeps a copy."""

    def __init__(self, stream: Any, copy: io.StringIO) -> None:
        self._stream = stream
        self._copy = copy

    def write(self, text: str) -> int:
        self._copy.write(text)
        return self._stream.write(text)

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


def _raised_by_torch(error: BaseException) -> bool:
    """Whether the rejection came out of torch's own serialization code, message untouched."""
    tb = error.__traceback__
    if tb is None:
        return False
    while tb.tb_next is not None:
        tb = tb.tb_next
    raiser = os.path.realpath(tb.tb_frame.f_code.co_filename)
    torch_dir = os.path.dirname(os.path.realpath(_torch_serialization_file()))
    return os.path.dirname(raiser) == torch_dir and os.path.basename(raiser) in (
        "serialization.py", "_weights_only_unpickler.py",
    )


def _torch_serialization_file() -> str:
    import torch.serialization

    return torch.serialization.__file__


def _raiser(error: BaseException) -> str:
    tb = error.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    if tb is None:
        return "?"
    code = tb.tb_frame.f_code
    module = tb.tb_frame.f_globals.get("__name__", "?")
    return f"{module}.{getattr(code, 'co_qualname', code.co_name)}"


def replacement_notes(
    torch_warns: bool, error: Optional[BaseException], warned: bool, printed: bool, registered: Sequence[str]
) -> tuple[str, ...]:
    """How a replaced ``torch.load`` reported differently from torch's own: facts, not verdicts."""
    notes = []
    if torch_warns and not warned:
        notes.append(
            f"printed the {FORCE_NO_WO} notice instead of warning" if printed
            else f"did not warn about {FORCE_NO_WO} (torch does)"
        )
    elif warned and not torch_warns:
        notes.append(f"warned about {FORCE_NO_WO} where torch would not")
    if error is not None and not _raised_by_torch(error):
        last = str(error).strip().splitlines()[-1] if str(error).strip() else ""
        notes.append(
            f"worded the rejection itself ({type(error).__name__} raised in {_raiser(error)}"
            + (f", ending {last[:120]!r}" if last else "") + ")"
        )
    # torch registers some globals itself at import (2.14: every builtin exception too); the others
    # come from backends (torch_npu's _rebuild_npu_tensor) or user code, and they decide what loads.
    # Where some of torch's call sites cannot be read, its own names are assumed to be its.
    from .torch_registrations import torch_registered_names  # reads torch's source: only when needed

    own, complete = torch_registered_names()
    foreign = [name for name in registered if name not in own and (complete or not name.startswith("torch."))]
    if foreign:
        notes.append(f"runs with process-wide safe globals {', '.join(foreign)}")
    return tuple(notes)
