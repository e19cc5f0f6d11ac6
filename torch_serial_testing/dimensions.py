"""The quantized engines and device types a test is generated for, as torch has them: both validate a
class's declaration, say why a case cannot run here, and name the case.

Engine and allocator are read from torch every time (code the library does not control switches them).
As under pytorch's ``override_quantized_engine``, a test body finds the CPU allocator as the test did:
pytorch's qnnpack tests install the mobile allocator themselves and it refuses to nest; the library's own
qnnpack loads run under it (:func:`qnnpack_allocator`).  ``PYTORCH_TESTING_DEVICE_ONLY_FOR``/``_EXCEPT_FOR``
select exactly what pytorch's ``filter_desired_device_types`` selects.  Classes are ``<Generic><DEVICE>``:
``npu`` gives ``NPU``, ``privateuse1`` the registered backend's name, else ``PRIVATEUSE1``."""

from __future__ import annotations

import os
from contextlib import contextmanager
from typing import Iterator, Mapping, Optional

import torch

from .errors import RoundTripConfigError, dimension

KNOWN_QENGINES = ("fbgemm", "qnnpack", "onednn", "x86")
BUILTIN_DEVICE_TYPES = ("cpu", "cuda", "xpu", "mps")
ONLY_FOR, EXCEPT_FOR = "PYTORCH_TESTING_DEVICE_ONLY_FOR", "PYTORCH_TESTING_DEVICE_EXCEPT_FOR"
EngineState = tuple[Optional[str], Optional[bool]]  # (quantized engine, mobile allocator installed)


def supported_qengines() -> tuple[str, ...]:
    """Engines this torch build supports (empty when quantization is gone)."""
    try:
        return tuple(e for e in torch.backends.quantized.supported_engines if e != "none")
    except (AttributeError, RuntimeError):
        return ()


def qengine_skip_reason(engine: str) -> Optional[str]:
    if engine in (supported := supported_qengines()):
        return None
    return (
        f"quantized engine {engine!r} is not supported by this torch build "
        f"({torch.__version__}; supported: {', '.join(supported) or 'none'})"
    )


def validate_qengines(engines: object) -> Optional[tuple[str, ...]]:
    """None: no engine dimension."""
    if engines is None:
        return None
    engines = dimension("qengines", engines, "('fbgemm', 'qnnpack')")
    for e in engines:
        if e not in KNOWN_QENGINES:
            raise RoundTripConfigError(f"unknown quantized engine {e!r}; known engines: {', '.join(KNOWN_QENGINES)}")
    return engines


def allocator_installed() -> Optional[bool]:
    """Whether the mobile CPU allocator is installed (None: no such API); torch has no getter: sets and unsets one."""
    if not hasattr(torch._C, "_set_default_mobile_cpu_allocator"):
        return None
    try:
        torch._C._set_default_mobile_cpu_allocator()
    except RuntimeError:
        return True
    torch._C._unset_default_mobile_cpu_allocator()
    return False


def set_allocator(installed: bool) -> None:
    if allocator_installed() not in (None, installed):
        (torch._C._set_default_mobile_cpu_allocator if installed else torch._C._unset_default_mobile_cpu_allocator)()


def current_qengine() -> Optional[str]:
    """``torch.backends.quantized.engine`` (None when this torch has no quantized engines)."""
    try:
        return torch.backends.quantized.engine
    except (AttributeError, RuntimeError):
        return None


def engine_state() -> EngineState:
    return current_qengine(), allocator_installed()


def describe_engine_change(before: EngineState, after: EngineState) -> list[str]:
    """One line per difference between two :func:`engine_state` readings (the leak wording)."""
    lines = [f"quantized engine {after[0]!r} (was {before[0]!r})"] if before[0] != after[0] else []
    if before[1] is not None and after[1] is not None and before[1] != after[1]:
        lines.append(f"the qnnpack mobile CPU allocator {'is still installed' if after[1] else 'was removed'}")
    return lines


@contextmanager
def override_qengine(engine: str, *, allocator: bool = True) -> Iterator[None]:
    """Run with *engine* (and, for qnnpack with *allocator*, the mobile CPU allocator); restore both as read on
    entry after.  ``allocator=False`` leaves the allocator alone (a test body: pytorch's helper installs its own)."""
    previous_engine, previous_allocator = engine_state()
    try:
        torch.backends.quantized.engine = engine
        if engine == "qnnpack" and allocator:
            set_allocator(True)
        yield
    finally:
        if previous_engine is not None and current_qengine() != previous_engine:
            torch.backends.quantized.engine = previous_engine
        if previous_allocator is not None:
            set_allocator(previous_allocator)


@contextmanager
def qnnpack_allocator(engine: Optional[str]) -> Iterator[None]:
    """Install the mobile CPU allocator for the block if *engine* is qnnpack and none is (pytorch's tests load so)."""
    if engine != "qnnpack" or allocator_installed() is not False:
        yield
        return
    set_allocator(True)
    try:
        yield
    finally:
        set_allocator(False)


def privateuse1_backend() -> Optional[str]:
    """The registered privateuse1 backend name (``npu``, ...), or None."""
    name = torch._C._get_privateuse1_backend_name()
    return None if name in ("privateuseone", "privateuse1") else name


def device_skip_reason(device_type: str) -> Optional[str]:
    if device_type == "cpu":
        return None
    if device_type == "privateuse1":
        if (backend := privateuse1_backend()) is None:
            return "no privateuse1 backend is registered (import its extension, e.g. torch_npu)"
        return device_skip_reason(backend)
    module = torch.backends.mps if device_type == "mps" else getattr(torch, device_type, None)
    if (is_available := getattr(module, "is_available", None)) is None:
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
    """Whether pytorch's ``filter_desired_device_types`` (imported only now) reads the available backend's name
    (``npu``) as ``privateuse1``; torch 2.4's compares names as written."""
    if backend not in _aliasing:
        try:
            from torch.testing._internal import common_device_type as cdt
        except Exception as e:  # noqa: BLE001 - a torch without its test helpers
            raise RoundTripConfigError(
                f"cannot tell how pytorch's filter_desired_device_types reads {ONLY_FOR}/{EXCEPT_FOR} for the "
                f"{backend} backend: torch.testing._internal.common_device_type cannot be imported "
                f"({type(e).__name__}: {e}); unset the filters"
            ) from None
        base = type("Base", (), {"device_type": "privateuse1"})  # a device-type test base, as pytorch's
        _aliasing[backend] = base in list(cdt.filter_desired_device_types([base], None, [backend]))
    return _aliasing[backend]


def aliases(device_type: str) -> set[str]:
    """The names *device_type* answers to: the registered backend name and ``privateuse1`` are one."""
    if (backend := privateuse1_backend()) is not None and device_type in ("privateuse1", backend):
        return {"privateuse1", backend}
    return {device_type}


def resolve_devices(declared: object, environ: Optional[Mapping[str, str]] = None) -> tuple[str, ...]:
    """A ``devices`` declaration checked (None: the available ones) and filtered by the env, read as
    pytorch reads it (split on commas, nothing trimmed, empty means unset)."""
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
    env = os.environ if environ is None else environ
    only, excl = (raw.split(",") if (raw := env.get(key, "")) else [] for key in (ONLY_FOR, EXCEPT_FOR))
    if overlap := set(only) & set(excl):
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
    return tuple(d for d in devices if canon(d, True) not in excl_c and (not only_c or canon(d, True) in only_c))


def torch_device_type(device_type: str) -> str:
    """The device type torch understands: ``privateuse1`` -> the registered backend name (``npu``)."""
    return (privateuse1_backend() or device_type) if device_type == "privateuse1" else device_type


def class_suffix(device_type: str) -> str:
    """``cpu`` -> ``CPU``; ``privateuse1`` -> the registered backend name, else ``PRIVATEUSE1``."""
    return torch_device_type(device_type).upper()
