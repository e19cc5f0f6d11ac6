"""Device types: which exist here, how they are named, and pytorch's env filters.

Default devices are the available ones: cpu always, then cuda, xpu, mps and the
privateuse1 backend (npu, ...) when available.  ``PYTORCH_TESTING_DEVICE_ONLY_FOR``
and ``PYTORCH_TESTING_DEVICE_EXCEPT_FOR`` filter them as pytorch does, with the
privateuse1 backend matched by its registered name or by ``privateuse1``.

Generated classes are named ``<Generic><DEVICE>`` with the device type
upper-cased.  A privateuse1 backend is named by what the class declares: an
explicit ``"npu"`` gives ``...NPU`` on every machine; ``"privateuse1"`` gives the
registered backend name when one is registered and ``PRIVATEUSE1`` otherwise --
never something that depends on import order.
"""

from __future__ import annotations

import os
from typing import Mapping, Optional

from .errors import RoundTripConfigError, dimension

__all__ = [
    "BUILTIN_DEVICE_TYPES",
    "privateuse1_backend",
    "available_device_types",
    "device_skip_reason",
    "resolve_devices",
    "class_suffix",
]

BUILTIN_DEVICE_TYPES = ("cpu", "cuda", "xpu", "mps")
ONLY_FOR = "PYTORCH_TESTING_DEVICE_ONLY_FOR"
EXCEPT_FOR = "PYTORCH_TESTING_DEVICE_EXCEPT_FOR"


def privateuse1_backend() -> Optional[str]:
    """The registered privateuse1 backend name (``npu``, ...), or None."""
    import torch

    name = torch._C._get_privateuse1_backend_name()
    return None if name in ("privateuseone", "privateuse1") else name


def device_skip_reason(device_type: str) -> Optional[str]:
    """Why *device_type* cannot run here, or None when it is available."""
    import torch

    if device_type == "cpu":
        return None
    if device_type == "cuda":
        return None if torch.cuda.is_available() else "CUDA is not available"
    if device_type == "mps":
        mps = getattr(torch.backends, "mps", None)
        return None if mps is not None and mps.is_available() else "MPS is not available"
    if device_type == "privateuse1":
        return "no privateuse1 backend is registered (import its extension, e.g. torch_npu)"
    module = getattr(torch, device_type, None)
    is_available = getattr(module, "is_available", None)
    if is_available is None:
        return f"device type {device_type!r} is not registered in this process"
    try:
        ok = bool(is_available())
    except Exception as e:  # noqa: BLE001 - a broken backend is reported, not raised
        return f"{device_type}.is_available() raised {type(e).__name__}: {e}"
    return None if ok else f"{device_type.upper()} is not available"


def available_device_types() -> tuple[str, ...]:
    """Available device types in a fixed order: cpu, cuda, xpu, mps, privateuse1 backend."""
    candidates = list(BUILTIN_DEVICE_TYPES)
    pu1 = privateuse1_backend()
    if pu1:
        candidates.append(pu1)
    return tuple(d for d in candidates if device_skip_reason(d) is None)


def _is_device_type(name: str) -> bool:
    """True for a bare device type torch can parse here (``cpu``, ``cuda``, ``npu`` once registered)."""
    import torch

    if name == "privateuse1" or name == privateuse1_backend():
        return True
    if not name.isidentifier() or name != name.lower():
        return False
    try:
        return torch.device(name).type == name
    except (RuntimeError, ValueError):
        return False


def _aliases(device_type: str) -> set[str]:
    pu1 = privateuse1_backend()
    if device_type in ("privateuse1", pu1) and pu1:
        return {"privateuse1", pu1}
    return {device_type}


def resolve_devices(declared: object, environ: Optional[Mapping[str, str]] = None) -> tuple[str, ...]:
    """Validate a ``devices`` declaration (None: the available ones) and apply the env filters."""
    env = os.environ if environ is None else environ
    if declared is None:
        devices = available_device_types()
    else:
        devices = dimension("devices", declared, "('cpu',)")
        for d in devices:
            if not _is_device_type(d):
                raise RoundTripConfigError(
                    f"unknown device type {d!r}; use a torch device type such as cpu, cuda, xpu, mps "
                    "or privateuse1. For an out-of-tree backend (npu, ...), import its extension "
                    "before instantiating."
                )
    only = [x.strip() for x in env.get(ONLY_FOR, "").split(",") if x.strip()]
    excl = [x.strip() for x in env.get(EXCEPT_FOR, "").split(",") if x.strip()]
    if only and excl:
        raise RoundTripConfigError(f"set only one of {ONLY_FOR} and {EXCEPT_FOR}, not both")
    if only:
        devices = tuple(d for d in devices if _aliases(d) & set(only))
    if excl:
        devices = tuple(d for d in devices if not _aliases(d) & set(excl))
    return devices


def class_suffix(device_type: str) -> str:
    """``cpu`` -> ``CPU``; ``privateuse1`` -> the registered backend name, else ``PRIVATEUSE1``."""
    if device_type == "privateuse1":
        return (privateuse1_backend() or "privateuse1").upper()
    return device_type.upper()
