"""Quantized engines: which exist, which this build supports, and switching safely.

A test's body runs with its engine set and the CPU allocator as it found it, as under pytorch's
``override_quantized_engine``: the mobile CPU allocator pytorch's qnnpack tests install refuses to
nest, so a body using pytorch's ``override_cpu_allocator_for_qnnpack`` must find none installed.  The
library's own loads under qnnpack run with that allocator (:func:`qnnpack_allocator`, installed for
the load when nobody has).  Everything is restored on exit, even on failure or interrupt.  The state
is read from torch every time, never remembered: code the library does not control switches engines
and allocators in the same process.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Iterator, Optional

from .errors import RoundTripConfigError, dimension
from .interrupts import deferred_interrupts, run_all

#: Engine names torch.backends.quantized knows.
KNOWN_QENGINES = ("fbgemm", "qnnpack", "onednn", "x86")


_lock = threading.RLock()


def supported_qengines() -> tuple[str, ...]:
    """Engines this torch build supports (empty when quantization is gone)."""
    try:
        import torch.backends.quantized as q

        return tuple(e for e in q.supported_engines if e != "none")
    except (ImportError, AttributeError, RuntimeError):
        return ()


def qengine_skip_reason(engine: str) -> Optional[str]:
    """Why a test for *engine* cannot run in this build, or None."""
    try:
        import torch.backends.quantized  # noqa: F401
    except ImportError as e:  # pragma: no cover - only on a torch without quantization
        return f"this torch has no quantized backends ({e})"
    supported = supported_qengines()
    if engine not in supported:
        import torch

        return (
            f"quantized engine {engine!r} is not supported by this torch build "
            f"({torch.__version__}; supported: {', '.join(supported) or 'none'})"
        )
    return None


def validate_qengines(engines: object) -> Optional[tuple[str, ...]]:
    """Check a class's ``qengines`` declaration (None: no engine dimension)."""
    if engines is None:
        return None
    engines = dimension("qengines", engines, "('fbgemm', 'qnnpack')")
    for e in engines:
        if e not in KNOWN_QENGINES:
            raise RoundTripConfigError(f"unknown quantized engine {e!r}; known engines: {', '.join(KNOWN_QENGINES)}")
    return engines


def allocator_installed() -> Optional[bool]:
    """Whether a non-default mobile CPU allocator is installed (None: no such API).  torch has no
    getter: this installs and removes one, interrupts held back."""
    import torch

    if not hasattr(torch._C, "_set_default_mobile_cpu_allocator"):
        return None
    with _lock, deferred_interrupts():
        try:
            torch._C._set_default_mobile_cpu_allocator()
        except RuntimeError:
            return True
        torch._C._unset_default_mobile_cpu_allocator()
        return False


def set_allocator(installed: bool) -> None:
    """Make the real allocator state *installed* (no-op when it already is, or without the API)."""
    import torch

    with _lock:
        now = allocator_installed()
        if now is None or now == installed:
            return
        if installed:
            torch._C._set_default_mobile_cpu_allocator()
        else:
            torch._C._unset_default_mobile_cpu_allocator()


def current_qengine() -> Optional[str]:
    """``torch.backends.quantized.engine`` (None when this torch has no quantized engines)."""
    import torch

    try:
        return torch.backends.quantized.engine
    except (AttributeError, RuntimeError):
        return None


def engine_state() -> tuple[Optional[str], Optional[bool]]:
    """(quantized engine, mobile allocator installed) as torch has them right now."""
    with _lock:
        return current_qengine(), allocator_installed()


def describe_engine_change(
    before: tuple[Optional[str], Optional[bool]], after: tuple[Optional[str], Optional[bool]]
) -> list[str]:
    """One line per difference between two :func:`engine_state` readings (the leak wording)."""
    lines = []
    if before[0] != after[0]:
        lines.append(f"quantized engine {after[0]!r} (was {before[0]!r})")
    if before[1] is not None and after[1] is not None and before[1] != after[1]:
        lines.append(
            "the qnnpack mobile CPU allocator is still installed"
            if after[1]
            else "the qnnpack mobile CPU allocator was removed"
        )
    return lines


def restore_engine_state(state: tuple[Optional[str], Optional[bool]]) -> None:
    """Put the engine and allocator back to *state* (read from torch, so it is idempotent)."""
    import torch

    engine, installed = state
    with _lock, deferred_interrupts():
        if engine is not None and current_qengine() != engine:
            torch.backends.quantized.engine = engine
        if installed is not None:
            set_allocator(installed)


@contextmanager
def override_qengine(engine: str, *, allocator: bool = True) -> Iterator[None]:
    """Run with *engine* (and, for qnnpack with *allocator*, the mobile CPU allocator); restore both
    after, as read from torch on entry (an allocator someone else installed stays for other engines).
    ``allocator=False`` leaves the allocator alone (a test body: pytorch's helper installs its own).
    The switch happens inside the ``try``: an interrupt at any point still restores."""
    import torch

    with _lock:
        previous = engine_state()
        try:
            with deferred_interrupts():
                torch.backends.quantized.engine = engine
                if engine == "qnnpack" and allocator:
                    set_allocator(True)
            yield
        finally:
            run_all([lambda: restore_engine_state(previous)])  # interrupted: runs once more


@contextmanager
def qnnpack_allocator(engine: Optional[str]) -> Iterator[None]:
    """The mobile CPU allocator for the block when *engine* is qnnpack and none is installed (pytorch's
    qnnpack tests load under it); else nothing.  Removed after, also on failure or interrupt."""
    if engine != "qnnpack":
        yield
        return
    with _lock:
        before = allocator_installed()
        try:
            with deferred_interrupts():
                if before is False:
                    set_allocator(True)
            yield
        finally:
            if before is False:
                run_all([lambda: set_allocator(False)])
