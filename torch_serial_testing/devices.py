"""Device types: which exist here, how they are named, and pytorch's env filters.

``PYTORCH_TESTING_DEVICE_ONLY_FOR`` / ``..._EXCEPT_FOR`` filter the devices exactly as pytorch's
``filter_desired_device_types`` does, so a file mixing both selects the same classes.  Generated
classes are ``<Generic><DEVICE>``: ``"npu"`` gives ``...NPU`` everywhere, ``"privateuse1"`` the
registered backend's name, else ``PRIVATEUSE1`` -- never something that depends on import order.
"""

from __future__ import annotations

import os
from typing import Mapping, Optional

from .errors import RoundTripConfigError, dimension

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
        backend = privateuse1_backend()
        if backend is None:
            return "no privateuse1 backend is registered (import its extension, e.g. torch_npu)"
        return device_skip_reason(backend)
    is_available = getattr(getattr(torch, device_type, None), "is_available", None)
    if is_available is None:
        return f"device type {device_type!r} is not registered in this process"
    try:
        ok = bool(is_available())
    except Exception as e:  # noqa: BLE001 - a broken backend is reported, not raised
        return f"{device_type}.is_available() raised {type(e).__name__}: {e}"
    return None if ok else f"{device_type.upper()} is not available"


def available_device_types() -> tuple[str, ...]:
    """Available device types in a fixed order: cpu, cuda, xpu, mps, the privateuse1 backend."""
    pu1 = privateuse1_backend()
    return tuple(d for d in (*BUILTIN_DEVICE_TYPES, *([pu1] if pu1 else [])) if device_skip_reason(d) is None)


def is_device_type(name: str) -> bool:
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


_aliasing: dict[str, bool] = {}


def _filters_alias_backend_name(backend: str) -> bool:
    """Whether pytorch's filter reads the available backend's name (``npu``) as ``privateuse1`` (torch 2.4's
    compares names as written): asked of pytorch's own ``filter_desired_device_types``, which is imported
    for it (only here: a privateuse1 backend is available and a device filter is set)."""
    known = _aliasing.get(backend)
    if known is None:
        try:
            from torch.testing._internal import common_device_type as cdt
        except Exception as e:  # noqa: BLE001 - a torch without its test helpers
            raise RoundTripConfigError(
                f"cannot tell how pytorch's filter_desired_device_types reads {ONLY_FOR}/{EXCEPT_FOR} for the "
                f"{backend} backend: torch.testing._internal.common_device_type cannot be imported "
                f"({type(e).__name__}: {e}); unset the filters"
            ) from None

        class Base:
            device_type = "privateuse1"

        known = _aliasing[backend] = Base in list(cdt.filter_desired_device_types([Base], None, [backend]))
    return known


def aliases(device_type: str) -> set[str]:
    """The names *device_type* answers to: the registered backend name and ``privateuse1`` are one."""
    backend = privateuse1_backend()
    if backend is not None and device_type in ("privateuse1", backend):
        return {"privateuse1", backend}
    return {device_type}


def _filter(devices: tuple[str, ...], only: list[str], excl: list[str]) -> tuple[str, ...]:
    """pytorch's ``filter_desired_device_types`` applied to declared device types."""
    overlap = set(only) & set(excl)
    if overlap:
        raise RoundTripConfigError(
            f"device(s) {sorted(overlap)} appear in both {ONLY_FOR} and {EXCEPT_FOR} (pytorch's "
            f"instantiate_device_type_tests refuses this too); remove them from one of the two"
        )
    backend = privateuse1_backend()
    alias = backend if backend is not None and device_skip_reason(backend) is None else None
    # pytorch's filter is asked only when a filter is set (without one, nothing is compared)
    as_written = alias is not None and bool(only or excl) and not _filters_alias_backend_name(alias)

    def canon(name: str, declared: bool) -> str:
        if alias is None:
            return name
        if as_written:  # torch 2.4: the backend's test base is 'privateuse1', values compared as written
            return "privateuse1" if declared and name == alias else name
        return name.replace(alias, "privateuse1")  # a substring replace on both sides, as pytorch does

    only_c, excl_c = {canon(x, False) for x in only}, {canon(x, False) for x in excl}
    if excl_c:
        devices = tuple(d for d in devices if canon(d, True) not in excl_c)
    if only_c:
        devices = tuple(d for d in devices if canon(d, True) in only_c)
    return devices


def resolve_devices(declared: object, environ: Optional[Mapping[str, str]] = None) -> tuple[str, ...]:
    """Validate a ``devices`` declaration (None: the available ones) and apply the env filters
    (read as pytorch reads them: split on commas, nothing trimmed, empty means unset)."""
    env = os.environ if environ is None else environ
    if declared is None:
        devices = available_device_types()
    else:
        devices = dimension("devices", declared, "('cpu',)")
        for d in devices:
            if not is_device_type(d):
                raise RoundTripConfigError(
                    f"unknown device type {d!r}; use a torch device type such as cpu, cuda, xpu, mps "
                    "or privateuse1. For an out-of-tree backend (npu, ...), import its extension "
                    "before instantiating."
                )
    only, excl = (raw.split(",") if (raw := env.get(key, "")) else [] for key in (ONLY_FOR, EXCEPT_FOR))
    return _filter(devices, only, excl)


def torch_device_type(device_type: str) -> str:
    """The device type torch understands: ``privateuse1`` -> the registered backend name (``npu``)."""
    return (privateuse1_backend() or device_type) if device_type == "privateuse1" else device_type


def class_suffix(device_type: str) -> str:
    """``cpu`` -> ``CPU``; ``privateuse1`` -> the registered backend name, else ``PRIVATEUSE1``."""
    return torch_device_type(device_type).upper()
