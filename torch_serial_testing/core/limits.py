"""Caps on the work a static scan may do, so hostile bytes cannot exhaust time or memory.

Going over one ends the scan with a ``CheckpointFormatError`` naming the limit and how to raise it.
The defaults are far above what ``torch.save`` writes for real models (a state_dict of 10,000
tensors needs ~1 MB of pickle, ~350,000 opcodes, ~100,000 memo entries and a dozen distinct
globals) and keep a worst-case scan to a few seconds and a few hundred MB (``bench/scan_bounds.py``
measures the worst input per cap).
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any, Iterator

__all__ = ["ScanLimits", "default_scan_limits", "scan_limits"]


@dataclass(frozen=True)
class ScanLimits:
    """Upper bounds for one :func:`~torch_serial_testing.scan_checkpoint` call."""

    #: Bytes of one pickle record after decompression (zip ``data.pkl``, tar member, legacy stream).
    max_pickle_bytes: int = 256 * 1024 * 1024
    #: Bytes of pickle read in total, over every pickle of the checkpoint.
    max_scan_bytes: int = 512 * 1024 * 1024
    #: Opcodes walked in total (GLOBAL and INST count 4): the cap that bounds time, ~1 us each at worst.
    max_opcodes: int = 3_000_000
    #: Memo entries (PUT/MEMOIZE) held at once by one pickle.
    max_memo_entries: int = 2_000_000
    #: Characters of one global name (``module.qualname``).
    max_name_length: int = 1024
    #: Distinct global names over the checkpoint (torch's own allowlist has a few hundred).
    max_globals: int = 10_000
    #: Digits of an integer written as text (protocol 0/1); Python itself refuses more than 4300.
    max_int_digits: int = 4300
    #: Stack depth (values plus MARK levels) of one pickle.
    max_stack_depth: int = 1_000_000

    def __post_init__(self) -> None:
        for name, value in self.__dict__.items():
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"ScanLimits.{name} must be a positive int, got {value!r}")


_lock = threading.Lock()
_current = ScanLimits()


def default_scan_limits() -> ScanLimits:
    """The limits scans use when none are passed (see :func:`scan_limits`)."""
    return _current


@contextmanager
def scan_limits(**overrides: Any) -> Iterator[ScanLimits]:
    """Change the default caps inside a ``with`` block, e.g. ``scan_limits(max_opcodes=10**8)``;
    restored on exit.  Checkpoints already scanned keep their result."""
    global _current
    with _lock:
        previous = _current
        _current = replace(previous, **overrides)
    try:
        yield _current
    finally:
        with _lock:
            _current = previous
