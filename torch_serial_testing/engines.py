"""Quantized engines: which exist, which this build supports, and switching them.

A test's body runs with its engine set and the CPU allocator as it found it, as under pytorch's
``override_quantized_engine``: the mobile CPU allocator pytorch's qnnpack tests install refuses to
nest, so a body using pytorch's ``override_cpu_allocator_for_qnnpack`` must find none installed.  The
library's own loads under qnnpack run with that allocator (:func:`qnnpack_allocator`, installed for
the load when nobody has).  The state is read from torch every time: code the library does not
control switches engines and allocators in the same process.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator, Optional

from .errors import RoundTripConfigError, dimension

#: Engine names torch.backends.quantized knows.
KNOWN_QENGINES = ("fbgemm", "qnnpack", "onednn", "x86")


def supported_qengines() -> tuple[str, ...]:
    """Engines this torch build supports (empty when quantization is gone)."""
    try:
        import torch.backends.quantized as q

        return tuple(e for e in q.supported_engines if e != "none")
    except (ImportError, AttributeError, RuntimeError):
        return ()


def qengine_skip_reason(engine: str) -> Optional[str]:
    """Why a test for *engine* cannot run in this build, or None."""
    supported = supported_qengines()
    if engine in supported:
        return None
    import torch

    return (
        f"quantized engine {engine!r} is not supported by this torch build "
        f"({torch.__version__}; supported: {', '.join(supported) or 'none'})"
    )


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
    getter: this installs and removes one."""
    import torch

    if not hasattr(torch._C, "_set_default_mobile_cpu_allocator"):
        return None
    try:
        torch._C._set_default_mobile_cpu_allocator()
    except RuntimeError:
        return True
    torch._C._unset_default_mobile_cpu_allocator()
    return False


def set_allocator(installed: bool) -> None:
    """Make the allocator state *installed* (no-op when it already is, or without the API)."""
    import torch

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
    return current_qengine(), allocator_installed()


def describe_engine_change(
    before: tuple[Optional[str], Optional[bool]], after: tuple[Optional[str], Optional[bool]]
) -> list[str]:
    """One line per difference between two :func:`engine_state` readings (the leak wording)."""
    lines = []
    if before[0] != after[0]:
        lines.append(f"quantized engine {after[0]!r} (was {before[0]!r})")
    if before[1] is not None and after[1] is not None and before[1] != after[1]:
        lines.append(f"the qnnpack mobile CPU allocator {'is still installed' if after[1] else 'was removed'}")
    return lines


def restore_engine_state(state: tuple[Optional[str], Optional[bool]]) -> None:
    """Put the engine and allocator back to *state*."""
    import torch

    engine, installed = state
    if engine is not None and current_qengine() != engine:
        torch.backends.quantized.engine = engine
    if installed is not None:
        set_allocator(installed)


@contextmanager
def override_qengine(engine: str, *, allocator: bool = True) -> Iterator[None]:
    """Run with *engine* (and, for qnnpack with *allocator*, the mobile CPU allocator); restore both
    after, as read on entry (an allocator someone else installed stays for other engines).
    ``allocator=False`` leaves the allocator alone (a test body: pytorch's helper installs its own)."""
    import torch

    previous = engine_state()
    try:
        torch.backends.quantized.engine = engine
        if engine == "qnnpack" and allocator:
            set_allocator(True)
        yield
    finally:
        restore_engine_state(previous)


@contextmanager
def qnnpack_allocator(engine: Optional[str]) -> Iterator[None]:
    """The mobile CPU allocator for the block when *engine* is qnnpack and none is installed (pytorch's
    qnnpack tests load under it); else nothing.  Removed after."""
    if engine != "qnnpack" or allocator_installed() is not False:
        yield
        return
    set_allocator(True)
    try:
        yield
    finally:
        set_allocator(False)
