"""A real second device for the device tests: a small C++ PrivateUse1 backend named ``npu``.

``npu_backend.cpp`` is compiled once with ``torch.utils.cpp_extension.load`` against the
installed torch and cached in ``build/npu_backend/`` at the project root (git-ignored); a
later process reuses it when torch, Python and the source are unchanged.  torch's extension
builder takes a file lock in the build directory, so ``pytest -n 2`` workers that start at
the same time build it once.  ``python -m test.npu_backend`` builds it ahead of the tests
(``.ci/run`` does).

:func:`register` then names privateuse1 ``npu`` for the rest of the process -- that is
irreversible in torch, which is why the device tests run in child processes
(``test/torch_facts/test_npu_device.py``) and the main test process never registers it.

What it proves and what it cannot: tensors live in host memory behind torch's own
privateuse1 machinery (dispatch key, allocator, device guard, hooks, storage location tag
``npu:0``, ``map_location`` handling, the device-count check), so a round trip through
torch.save / torch.load on it exercises the same Python and C++ paths a real NPU does.  It
has no NPU memory formats and no torch_npu save sizing: those need Ascend hardware.
"""

from __future__ import annotations

import os
import shutil
import sys
import threading
import types
from pathlib import Path
from typing import Optional

BACKEND_NAME = "npu"
EXTENSION_NAME = "tst_npu_backend"
SOURCE = Path(__file__).resolve().with_name("npu_backend.cpp")
ROOT = SOURCE.parents[2]
#: Overrides the cache directory (default: ``<project>/build/npu_backend/<torch>-py<X.Y>``).
BUILD_DIR_ENV = "TORCH_SERIAL_TESTING_NPU_BUILD_DIR"

_lock = threading.Lock()
_extension: Optional[types.ModuleType] = None


def build_dir() -> Path:
    """Where the compiled backend is cached: one directory per torch and Python version."""
    import torch

    override = os.environ.get(BUILD_DIR_ENV)
    if override:
        return Path(override)
    tag = f"torch{torch.__version__.replace('+', '_')}-py{sys.version_info[0]}.{sys.version_info[1]}"
    return ROOT / "build" / "npu_backend" / tag


def skip_reason() -> Optional[str]:
    """Why the backend cannot be used here (a real backend owns privateuse1, no compiler, no ninja), or None."""
    import torch

    owner = torch._C._get_privateuse1_backend_name()
    if owner != "privateuseone" and not getattr(getattr(torch, owner, None), "_tst_backend", False):
        return (
            f"privateuse1 already belongs to a real backend ({owner!r}, e.g. torch_npu autoloaded at "
            "import torch): the test backend would clash with it"
        )
    compiler = os.environ.get("CXX", "c++")
    if shutil.which(compiler) is None:
        return f"no C++ compiler ({compiler!r} not found on PATH): the npu test backend cannot be built"
    from torch.utils.cpp_extension import is_ninja_available

    if not is_ninja_available():
        return (
            "ninja is not installed (pip install ninja; it is in the test extra): the npu test backend cannot be built"
        )
    return None


def build(verbose: bool = False) -> types.ModuleType:
    """Compile (or reuse the cached build of) the backend and load it into this process."""
    global _extension
    with _lock:
        if _extension is None:
            reason = skip_reason()
            if reason:
                raise RuntimeError(reason)
            from torch.utils.cpp_extension import load

            directory = build_dir()
            directory.mkdir(parents=True, exist_ok=True)
            _extension = load(
                name=EXTENSION_NAME,
                sources=[str(SOURCE)],
                build_directory=str(directory),
                verbose=verbose,
            )
        return _extension


class _DeviceContext:
    """``torch.npu.device(d)``: torch enters it around copies onto the device; one device, so a check only."""

    def __init__(self, device: object) -> None:
        import torch

        index = device if isinstance(device, int) else torch.device(device).index  # type: ignore[arg-type]
        if index not in (None, -1, 0):
            raise RuntimeError(f"npu device index {index} is out of range: this backend has 1 device")

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def _device_module(extension: types.ModuleType) -> types.ModuleType:
    """``torch.npu``: what torch's serialization and device helpers look up on a backend module."""
    module = types.ModuleType(f"torch.{BACKEND_NAME}")
    module.__doc__ = "torch_serial_testing's host-memory test backend (one device)."
    module.is_available = lambda: True  # type: ignore[attr-defined]
    module.device_count = lambda: int(extension.device_count())  # type: ignore[attr-defined]
    module.current_device = lambda: 0  # type: ignore[attr-defined]
    module.is_initialized = lambda: True  # type: ignore[attr-defined]
    module._is_in_bad_fork = lambda: False  # type: ignore[attr-defined]
    module.device = _DeviceContext  # type: ignore[attr-defined]
    module._tst_backend = True  # type: ignore[attr-defined]
    return module


def register() -> str:
    """Build, load and register the backend as ``npu`` in this process (idempotent)."""
    import torch

    current = torch._C._get_privateuse1_backend_name()
    if getattr(getattr(torch, current, None), "_tst_backend", False):
        return BACKEND_NAME
    if current != "privateuseone":
        raise RuntimeError(
            f"privateuse1 is already registered as {current!r} in this process (a real backend); "
            "the npu test backend needs a process of its own"
        )
    extension = build()
    extension.register_hooks()
    torch.utils.rename_privateuse1_backend(BACKEND_NAME)
    torch._register_device_module(BACKEND_NAME, _device_module(extension))
    torch.utils.generate_methods_for_privateuse1_backend(for_storage=True)
    return BACKEND_NAME
