"""Exact comparison of an original object and its round-tripped copy (:func:`assert_round_trip_equal`)."""

from __future__ import annotations

import contextlib
import math
import sys
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

    Exact by default: exact types (a ``Parameter`` is not a ``Tensor``); tensors by dtype, device, layout, shape,
    ``requires_grad``, values (NaN equal to NaN), ``__getstate__()``; quantized ones by qscheme, int_repr, scale(s),
    zero point(s), axis (pytorch's ``assertEqual``: dequantized values); sparse ones by coalesced-ness, indices and
    values; ``TwoTensor``-like and nested by part; numpy values by type, dtype, shape, values.  Each knob, named as in
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
    elif (np := sys.modules.get("numpy")) is not None and isinstance(e, (np.ndarray, np.generic)):
        x, y = np.asarray(e), np.asarray(a)
        for attr in ("dtype", "shape")[0 if checks.check_dtype else 1 :]:
            if getattr(x, attr) != getattr(y, attr):
                raise RoundTripMismatch(path, f"{attr} {getattr(y, attr)} != expected {getattr(x, attr)}")
        if x.tobytes() != y.tobytes():  # the same bytes are equal (NaNs too); else value by value, exactly
            _compare(x.tolist(), y.tolist(), f"{path}.tolist()", checks)
    elif isinstance(e, torch.ScriptObject):  # a TorchScript class's own __getstate__ (not in torch's stubs)
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
    for attr in ("dtype", "device", "layout", *(() if e.is_nested else ("shape",)), "requires_grad"):
        strict = getattr(checks, f"check_{attr}", None)  # None: the shape, always compared (a nested one by its parts)
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
    if hasattr(e, "__tensor_flatten__") and hasattr(a, "__tensor_flatten__"):  # TwoTensor, a jagged nested tensor
        _compare(flat := e.__tensor_flatten__(), a.__tensor_flatten__(), f"{path}.__tensor_flatten__()", checks)
        for name in flat[0]:  # the inner tensors' names, then (above) the context
            _compare_tensors(getattr(e, name), getattr(a, name), f"{path}.{name}", checks)
        return
    if type(e) is type(a):  # what pickling keeps beside the data (None: nothing); a related class has its own
        x, y = ({} if s is None else s for s in [getattr(t, "__getstate__", lambda t=t: t.__dict__)() for t in (e, a)])
        _compare(x, y, f"{path}.__getstate__()", checks)
    if e.is_nested:  # a strided nested tensor: component by component
        return _compare(list(e.unbind()), list(a.unbind()), f"{path}.unbind()", checks)
    if e.device != a.device:  # only reached with check_device=False
        e, a = e.cpu(), a.cpu()
    if e.layout == a.layout == torch.sparse_coo and e.is_coalesced() != a.is_coalesced():  # exact_is_coalesced
        raise RoundTripMismatch(path, f"is_coalesced() {a.is_coalesced()} != expected {e.is_coalesced()}")
    e, a = ((t if e.layout == a.layout or t.layout == torch.strided else t.to_dense()).detach() for t in (e, a))
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
