"""Exact comparison of an original object and its round-tripped copy (:func:`assert_round_trip_equal`)."""

from __future__ import annotations

import contextlib
import math
from collections import namedtuple
from typing import Any, Optional

import torch


class RoundTripMismatch(AssertionError):
    """The two objects differ; ``path`` says where (``[0][7]``, ``.state_dict()['bias']``)."""

    def __init__(self, path: str, message: str) -> None:
        super().__init__(f"round trip mismatch at {path or '<root>'}: {message}")
        self.path, self.detail = path, message


_EXACT_SCALARS = (bool, int, float, complex, str, bytes, type(None))
#: Which properties count, as in ``torch.testing.assert_close``; ``_EXACT``: all, exactly.
_Checks = namedtuple("_Checks", "rtol atol allow_subclasses check_requires_grad check_dtype check_device check_layout")
_EXACT = _Checks(None, None, False, True, True, True, True)


def assert_round_trip_equal(
    expected: Any,
    actual: Any,
    *,
    rtol: Optional[float] = None,
    atol: Optional[float] = None,
    allow_subclasses: bool = False,
    check_requires_grad: bool = True,
    check_dtype: bool = True,
    check_device: bool = True,
    check_layout: bool = True,
) -> None:
    """Raise :class:`RoundTripMismatch` at the first difference between *expected* and *actual*, naming its path.

    Exact by default: exact types (a ``Parameter`` is not a ``Tensor``); for tensors dtype, device, layout, shape,
    ``requires_grad`` and values (NaN equal to NaN); quantized ones by qscheme, integer representation, scale(s),
    zero point(s) and axis (pytorch's ``assertEqual`` compares dequantized values).  Each knob, named as in
    ``torch.testing.assert_close``, relaxes one property (``check_dtype=False``: values compared after promotion,
    ``check_device=False``: on the CPU, ``check_layout=False``: sparse compared dense, ``allow_subclasses``: related
    types match); shapes, quantization parameters and container keys/lengths are always compared."""
    if (rtol is None) != (atol is None):
        raise ValueError("pass rtol and atol together (or neither, for exact comparison)")
    knobs = map(bool, (allow_subclasses, check_requires_grad, check_dtype, check_device, check_layout))
    _compare(expected, actual, "", _Checks(rtol, atol, *knobs))


def _same_type(e: Any, a: Any, checks: _Checks) -> bool:
    return type(e) is type(a) or checks.allow_subclasses and (isinstance(a, type(e)) or isinstance(e, type(a)))


def _compare(e: Any, a: Any, path: str, checks: _Checks) -> None:
    if isinstance(e, torch.Tensor) or isinstance(a, torch.Tensor):
        _compare_tensors(e, a, path, checks)
    elif not _same_type(e, a, checks):
        raise RoundTripMismatch(path, f"type {type(a).__name__} != expected {type(e).__name__} ({a!r} vs {e!r})")
    elif isinstance(e, torch.nn.Module):
        _compare(e.state_dict(), a.state_dict(), f"{path}.state_dict()", checks)
    elif isinstance(e, torch.ScriptObject):
        # a TorchScript class's own __getstate__ (torch's stubs declare none on ScriptObject)
        _compare(e.__getstate__(), a.__getstate__(), f"{path}.__getstate__()", checks)  # type: ignore[attr-defined]
    elif isinstance(e, dict):
        missing, extra = [k for k in e if k not in a], [k for k in a if k not in e]
        if missing or extra:
            raise RoundTripMismatch(path, f"keys differ: missing {missing}, unexpected {extra}")
        for k in e:
            _compare(e[k], a[k], f"{path}[{k!r}]", checks)
    elif isinstance(e, (list, tuple)):
        if len(e) != len(a):
            raise RoundTripMismatch(path, f"length {len(a)} != expected {len(e)}")
        for i, (x, y) in enumerate(zip(e, a)):
            _compare(x, y, f"{path}[{i}]", checks)
    elif e != a and not (isinstance(e, float) and math.isnan(e) and math.isnan(a)):
        exact = isinstance(e, _EXACT_SCALARS) or isinstance(e, (torch.dtype, torch.device, torch.Size, torch.qscheme))
        raise RoundTripMismatch(path, f"{a!r} != expected {e!r}" + ("" if exact else " (compared with ==)"))


def _compare_tensors(e: Any, a: Any, path: str, checks: _Checks) -> None:
    if not (isinstance(e, torch.Tensor) and isinstance(a, torch.Tensor)):
        raise RoundTripMismatch(path, f"type {type(a).__name__} != expected {type(e).__name__}")
    if not _same_type(e, a, checks):
        why = "allow_subclasses=True accepts related classes such as Parameter vs Tensor"
        raise RoundTripMismatch(path, f"tensor class {type(a).__name__} != expected {type(e).__name__} ({why})")
    for attr in ("dtype", "device", "layout", "shape", "requires_grad"):
        strict = getattr(checks, f"check_{attr}", None)  # None: the shape, always compared
        x, y = getattr(e, attr), getattr(a, attr)
        if strict is not False and x != y:
            hint = "" if strict is None else f" (check_{attr}=False ignores it)"
            raise RoundTripMismatch(path, f"{attr} {y} != expected {x}{hint}")
    if e.is_quantized or a.is_quantized:
        if e.is_quantized != a.is_quantized:
            raise RoundTripMismatch(path, f"quantized {a.is_quantized} != expected {e.is_quantized}")
        per_tensor = e.qscheme() in (torch.per_tensor_affine, torch.per_tensor_symmetric)
        for attr in ("qscheme", *(("q_scale", "q_zero_point") if per_tensor else ("q_per_channel_axis",))):
            x, y = getattr(e, attr)(), getattr(a, attr)()
            if x != y:
                raise RoundTripMismatch(path, f"{attr} {y} != expected {x}")
        for attr in () if per_tensor else ("q_per_channel_scales", "q_per_channel_zero_points"):
            _compare_tensors(getattr(e, attr)(), getattr(a, attr)(), f"{path}.{attr}()", _EXACT)
        _compare_tensors(e.int_repr().cpu(), a.int_repr().cpu(), f"{path}.int_repr()", _EXACT)
        return
    if e.device != a.device:  # only reached with check_device=False
        e, a = e.cpu(), a.cpu()
    e, a = ((t if t.layout == torch.strided else t.to_dense()).detach() for t in (e, a))
    if e.dtype != a.dtype:  # only reached with check_dtype=False
        common = torch.promote_types(e.dtype, a.dtype)
        e, a = e.to(common), a.to(common)
    with contextlib.suppress(RuntimeError, NotImplementedError):  # a tensor kind torch.equal does not support
        if torch.equal(a, e):  # identical values are close under any tolerance (NaNs fall through)
            return
    try:
        torch.testing.assert_close(a, e, rtol=checks.rtol or 0, atol=checks.atol or 0, equal_nan=True)
    except AssertionError as err:
        raise RoundTripMismatch(path, f"tensor values differ: {err}") from None
