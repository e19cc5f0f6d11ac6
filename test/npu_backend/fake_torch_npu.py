"""A faithful fake of what ``import torch_npu`` does to serialization (torch-npu 2.13 / 2.14).

torch_npu cannot be imported without Ascend's CANN libraries, so the tests use this
stand-in.  It reproduces the facts that matter to a round trip, taken from torch-npu's
Python source (``torch_npu/utils/serialization.py``, ``_init/patches/api_patches.py``,
``utils/_error_code.py``, ``utils/storage.py``):

* ``torch.load`` (not ``torch.serialization.load``) is replaced by torch_npu's copy;
* with ``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD`` and no ``weights_only`` argument it *prints*
  the notice that torch warns;
* both ``TORCH_FORCE_*`` set: ``RuntimeError`` with torch_npu's error-code suffix;
* weights-only rejections are re-raised as ``pickle.UnpicklingError`` with its own wording
  and the suffix ``[ERROR] <time> (PID:.., Device:.., RankID:..) ERR00010 PTA system call
  failed``;
* an old (non-zip) file with a ``str``/``torch.device`` ``map_location`` is loaded onto the
  CPU and then moved (printing a notice);
* one global is registered process-wide at import:
  ``add_safe_globals([_rebuild_npu_tensor])``.

``torch.save`` is replaced too, forcing the zip format as torch_npu's does; torch_npu's NPU
storage sizing (``_tensor_construct_from_storage``) needs its C extension and is not faked.
"""

from __future__ import annotations

import os
import pickle
import time
from typing import Any, Optional

import torch

FORCE_WO = "TORCH_FORCE_WEIGHTS_ONLY_LOAD"
FORCE_NO_WO = "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD"
_TRUE = ("1", "y", "yes", "true")
#: What torch_npu appends to its error messages (``pta_error(ErrCode.SYSCALL)``), as a regex.
ERROR_SUFFIX_PATTERN = r"\[ERROR\] \S+ \(PID:\d+, Device:-?\d+, RankID:-?\d+\) ERR00010 PTA system call failed$"
FORCE_NO_NOTICE = (
    "Environment variable TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD detected, since the`weights_only` argument "
    "was not explicitly passed to `torch.load`, forcing weights_only=False."
)
LEGACY_NOTICE = (
    'Warning: since the loaded file is not a zipfile, only "torch.device" and "str" type parameters are '
    "currently supported for parameter types of map_location; all tensors are loaded onto the CPU first"
)
_UNSAFE = (
    "Weights only load failed. Re-running `torch.load` with `weights_only` set to `False` will likely "
    "succeed, but it can result in arbitrary code execution. Do it only if you got the file from a "
    "trusted source.\n WeightsUnpickler error: "
)

_original: dict[str, Any] = {}


def _pta_error(code: int, text: str) -> str:
    """torch_npu's ``pta_error(...)`` suffix (submodule PTA = 0)."""
    return (
        f"\n[ERROR] {time.strftime('%Y-%m-%d-%H:%M:%S', time.localtime())} (PID:{os.getpid()}, Device:-1, "
        f"RankID:-1) ERR00{code:03d} PTA {text}"
    )


def _rebuild_npu_tensor(storage, storage_offset, size, stride, requires_grad, backward_hooks, npu_storage_info):  # type: ignore[no-untyped-def]
    """The global torch_npu registers process-wide (it rebuilds tensors of old NPU checkpoints)."""
    tensor = torch.empty((0,), dtype=storage.dtype, device=storage._untyped_storage.device)
    tensor.set_(storage, storage_offset, size, stride)
    tensor.requires_grad = requires_grad
    tensor._backward_hooks = backward_hooks
    return tensor


_reads_force_no: list[bool] = []


def _torch_reads_force_no() -> bool:
    """Whether the torch under the fake reads TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD (torch >= 2.6).

    Asked of torch once: with both switches set to ``1``, a torch that reads the second one
    refuses a load of a plain tensor with RuntimeError; an older one obeys the first alone.
    """
    if not _reads_force_no:
        import io

        buf = io.BytesIO()
        torch.serialization.save(torch.zeros(1), buf)
        before = {name: os.environ.get(name) for name in (FORCE_WO, FORCE_NO_WO)}
        os.environ[FORCE_WO] = os.environ[FORCE_NO_WO] = "1"
        try:
            torch.serialization.load(io.BytesIO(buf.getvalue()))
            reads = False
        except RuntimeError:
            reads = True
        finally:
            for name, value in before.items():
                os.environ.pop(name, None)
                if value is not None:
                    os.environ[name] = value
        _reads_force_no.append(reads)
    return _reads_force_no[0]


def _is_zip(f: Any) -> bool:
    if isinstance(f, (str, os.PathLike)):
        with open(f, "rb") as fh:
            return fh.read(4) == b"PK\x03\x04"
    start = f.tell()
    head = f.read(4)
    f.seek(start)
    return head == b"PK\x03\x04"


def _move(obj: Any, device: Any) -> Any:
    if isinstance(obj, torch.Tensor):
        return obj.to(device)
    if isinstance(obj, dict):
        return type(obj)((k, _move(v, device)) for k, v in obj.items())
    if isinstance(obj, (list, tuple, set)):
        return type(obj)(_move(v, device) for v in obj)
    return obj


def load(
    f: Any,
    map_location: Any = None,
    pickle_module: Any = None,
    *,
    weights_only: Optional[bool] = None,
    mmap: Optional[bool] = None,
    **pickle_load_args: Any,
) -> Any:
    """torch_npu's ``torch.load``: torch's rules, its own reporting."""
    force_wo = os.getenv(FORCE_WO, "0").lower() in _TRUE
    # torch_npu follows its torch: the switch exists only where torch.load reads it (torch >= 2.6)
    force_no = os.getenv(FORCE_NO_WO, "0").lower() in _TRUE and _torch_reads_force_no()
    if force_wo and force_no:
        raise RuntimeError(
            f"Only one of `{FORCE_WO}` or `{FORCE_NO_WO}` should be set, but both were set."
            + _pta_error(1, "invalid parameter")
        )
    if force_wo:
        weights_only = True
    elif force_no and weights_only is None:
        print(FORCE_NO_NOTICE)
        weights_only = False
    if weights_only is None:
        default = getattr(torch.serialization, "_default_to_weights_only", None)  # torch >= 2.6
        weights_only = default(pickle_module) if default is not None else False
    kwargs: dict[str, Any] = dict(pickle_load_args, weights_only=weights_only, mmap=mmap)
    if pickle_module is not None:
        kwargs["pickle_module"] = pickle_module
    legacy_move = not weights_only and isinstance(map_location, (str, torch.device)) and not _is_zip(f)
    try:
        if legacy_move:
            print(LEGACY_NOTICE)
            result = torch.serialization.load(f, "cpu", **kwargs)
            return result if "cpu" in str(map_location) else _move(result, map_location)
        return torch.serialization.load(f, map_location, **kwargs)
    except pickle.UnpicklingError as e:
        if not weights_only:
            raise
        core = str(e).partition("WeightsUnpickler error: ")[2] or str(e)
        raise pickle.UnpicklingError(_UNSAFE + core + _pta_error(10, "system call failed")) from None


def save(
    obj: Any,
    f: Any,
    pickle_module: Any = pickle,
    pickle_protocol: int = 2,
    _use_new_zipfile_serialization: bool = True,
    _disable_byteorder_record: bool = False,
) -> None:
    """torch_npu's ``torch.save``: always the zip format."""
    if not _use_new_zipfile_serialization:
        print('Warning: torch.save with "_use_new_zipfile_serialization = False" is not recommended for npu tensor')
    return torch.serialization.save(obj, f, pickle_module, pickle_protocol, True, _disable_byteorder_record)


def install() -> None:
    """What ``import torch_npu`` does to serialization (idempotent)."""
    if not _original:
        _original.update(load=torch.load, save=torch.save)
    _torch_reads_force_no()  # asked before torch.load is the fake's (and remembered)
    torch.load = load
    torch.save = save
    torch.serialization.add_safe_globals([_rebuild_npu_tensor])


def uninstall() -> None:
    """Undo :func:`install` (for in-process tests): torch's own functions, the global unregistered."""
    if _original:
        torch.load = _original["load"]
        torch.save = _original["save"]
    others = [g for g in torch.serialization.get_safe_globals() if g is not _rebuild_npu_tensor]
    torch.serialization.clear_safe_globals()
    torch.serialization.add_safe_globals(others)


def registered_name() -> str:
    """The qualified name of the registered global, as checkpoints and outcome texts spell it."""
    return f"{_rebuild_npu_tensor.__module__}.{_rebuild_npu_tensor.__qualname__}"


__all__ = ["install", "uninstall", "load", "save", "registered_name", "ERROR_SUFFIX_PATTERN", "FORCE_NO_NOTICE"]
