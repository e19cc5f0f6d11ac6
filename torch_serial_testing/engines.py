"""Quantized engines: which exist, which this build supports, and switching safely.

A test runs with ``torch.backends.quantized.engine`` set to its engine and,
for qnnpack, with the mobile CPU allocator pytorch's own qnnpack tests install
(``torch._C._set_default_mobile_cpu_allocator``, which refuses to nest).  Both
are restored on exit, even on failure.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Iterator, Optional

from .errors import RoundTripConfigError, dimension

__all__ = [
    "KNOWN_QENGINES",
    "supported_qengines",
    "qengine_skip_reason",
    "override_qengine",
    "validate_qengines",
    "allocator_installed",
]

#: Engine names torch.backends.quantized knows (torch/backends/quantized/__init__.py).
KNOWN_QENGINES = ("fbgemm", "qnnpack", "onednn", "x86")

_lock = threading.RLock()
_allocator_ours = False  # True while this module has the qnnpack allocator installed


def supported_qengines() -> tuple[str, ...]:
    """Engines this torch build supports (empty when quantization is gone)."""
    try:
        import torch.backends.quantized as q

        return tuple(e for e in q.supported_engines if e != "none")
    except (ImportError, AttributeError, RuntimeError):
        return ()


def _sparse_quantized_missing() -> Optional[str]:
    try:
        import torch.backends.quantized  # noqa: F401
    except ImportError as e:  # pragma: no cover - only on a torch without quantization
        return f"this torch has no quantized backends ({e})"
    return None


def qengine_skip_reason(engine: str) -> Optional[str]:
    """Why a test for *engine* cannot run in this build, or None."""
    missing = _sparse_quantized_missing()
    if missing:
        return missing
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
            raise RoundTripConfigError(
                f"unknown quantized engine {e!r}; known engines: {', '.join(KNOWN_QENGINES)}"
            )
    return engines


def _has_allocator_api() -> bool:
    import torch

    return hasattr(torch._C, "_set_default_mobile_cpu_allocator")


def _set_allocator(on: bool) -> None:
    global _allocator_ours
    import torch

    if not _has_allocator_api() or on == _allocator_ours:
        return
    if on:
        try:
            torch._C._set_default_mobile_cpu_allocator()
        except RuntimeError:
            return  # installed by someone around us (pytorch's override_cpu_allocator_for_qnnpack)
        _allocator_ours = True
    else:
        torch._C._unset_default_mobile_cpu_allocator()
        _allocator_ours = False


@contextmanager
def override_qengine(engine: str) -> Iterator[None]:
    """Run with *engine* (and, for qnnpack, the mobile CPU allocator); restore both after."""
    import torch

    with _lock:
        previous = torch.backends.quantized.engine
        previous_alloc = _allocator_ours
        torch.backends.quantized.engine = engine
        try:
            _set_allocator(engine == "qnnpack")
            yield
        finally:
            _set_allocator(previous_alloc)
            torch.backends.quantized.engine = previous


def allocator_installed() -> Optional[bool]:
    """Probe whether a non-default mobile CPU allocator is installed (None: no such API)."""
    import torch

    if not _has_allocator_api():
        return None
    with _lock:
        try:
            torch._C._set_default_mobile_cpu_allocator()
        except RuntimeError:
            return True
        torch._C._unset_default_mobile_cpu_allocator()
        return False


def uninstall_allocator() -> None:
    """Remove a leaked mobile CPU allocator."""
    global _allocator_ours
    import torch

    with _lock:
        torch._C._unset_default_mobile_cpu_allocator()
        _allocator_ours = False
