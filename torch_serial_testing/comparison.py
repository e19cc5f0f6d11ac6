"""Exact comparison of an original object and its round-tripped copy.

The first difference is reported with its *path* inside the nested structure
(``[0][7]``, ``['weight']``, ``.state_dict()['bias']``), the way
``torch.testing._comparison`` does.  Unlike pytorch's ``assertEqual``, which
compares quantized tensors by their dequantized values, a quantized tensor
here matches only when its qscheme, integer representation, scale(s), zero
point(s) and axis all match: a round trip must not change a single bit.
"""

from __future__ import annotations

import math
from typing import Any, Optional

__all__ = ["assert_round_trip_equal", "RoundTripMismatch"]


class RoundTripMismatch(AssertionError):
    """The two objects differ; ``path`` says where."""

    def __init__(self, path: str, message: str) -> None:
        super().__init__(f"round trip mismatch at {path or '<root>'}: {message}")
        self.path = path
        self.detail = message


_EXACT_SCALARS = (bool, int, float, complex, str, bytes, type(None))


def assert_round_trip_equal(
    expected: Any,
    actual: Any,
    *,
    rtol: Optional[float] = None,
    atol: Optional[float] = None,
) -> None:
    """Raise :class:`RoundTripMismatch` at the first difference between *expected* and *actual*.

    Tensors are exact by default (dtype, device, layout, shape, values with NaN
    equal to NaN); pass *rtol*/*atol* together for float tolerance.
    """
    if (rtol is None) != (atol is None):
        raise ValueError("pass rtol and atol together (or neither, for exact comparison)")
    _compare(expected, actual, "", rtol, atol)


def _compare(e: Any, a: Any, path: str, rtol: Optional[float], atol: Optional[float]) -> None:
    import torch

    if isinstance(e, torch.Tensor) or isinstance(a, torch.Tensor):
        _compare_tensors(e, a, path, rtol, atol)
        return
    if type(e) is not type(a):
        raise RoundTripMismatch(path, f"type {type(a).__name__} != expected {type(e).__name__} ({a!r} vs {e!r})")
    if isinstance(e, torch.nn.Module):
        _compare(e.state_dict(), a.state_dict(), f"{path}.state_dict()", rtol, atol)
        return
    if isinstance(e, torch.ScriptObject):
        _compare(e.__getstate__(), a.__getstate__(), f"{path}.__getstate__()", rtol, atol)
        return
    if isinstance(e, dict):
        missing = [k for k in e if k not in a]
        extra = [k for k in a if k not in e]
        if missing or extra:
            raise RoundTripMismatch(path, f"keys differ: missing {missing}, unexpected {extra}")
        for k in e:
            _compare(e[k], a[k], f"{path}[{k!r}]", rtol, atol)
        return
    if isinstance(e, (list, tuple)):
        if len(e) != len(a):
            raise RoundTripMismatch(path, f"length {len(a)} != expected {len(e)}")
        for i, (x, y) in enumerate(zip(e, a)):
            _compare(x, y, f"{path}[{i}]", rtol, atol)
        return
    if isinstance(e, float) and math.isnan(e) and math.isnan(a):
        return
    if isinstance(e, _EXACT_SCALARS) or isinstance(e, (torch.dtype, torch.device, torch.Size, torch.qscheme)):
        if e != a:
            raise RoundTripMismatch(path, f"{a!r} != expected {e!r}")
        return
    if e != a:
        raise RoundTripMismatch(path, f"{a!r} != expected {e!r} (compared with ==)")


def _compare_tensors(e: Any, a: Any, path: str, rtol: Optional[float], atol: Optional[float]) -> None:
    import torch

    if not (isinstance(e, torch.Tensor) and isinstance(a, torch.Tensor)):
        raise RoundTripMismatch(path, f"type {type(a).__name__} != expected {type(e).__name__}")
    if type(e) is not type(a):
        raise RoundTripMismatch(path, f"tensor class {type(a).__name__} != expected {type(e).__name__}")
    for attr in ("dtype", "device", "layout", "shape", "requires_grad"):
        x, y = getattr(e, attr), getattr(a, attr)
        if x != y:
            raise RoundTripMismatch(path, f"{attr} {y} != expected {x}")
    if e.is_quantized:
        _compare_quantized(e, a, path)
        return
    if e.layout != torch.strided:
        e, a = e.to_dense(), a.to_dense()
    try:
        torch.testing.assert_close(
            a, e, rtol=0 if rtol is None else rtol, atol=0 if atol is None else atol,
            equal_nan=True, check_device=True, check_dtype=True, check_layout=True,
        )
    except AssertionError as err:
        raise RoundTripMismatch(path, f"tensor values differ: {err}") from None


def _compare_quantized(e: Any, a: Any, path: str) -> None:
    import torch

    if e.qscheme() != a.qscheme():
        raise RoundTripMismatch(path, f"qscheme {a.qscheme()} != expected {e.qscheme()}")
    if e.qscheme() in (torch.per_tensor_affine, torch.per_tensor_symmetric):
        if e.q_scale() != a.q_scale():
            raise RoundTripMismatch(path, f"q_scale {a.q_scale()} != expected {e.q_scale()}")
        if e.q_zero_point() != a.q_zero_point():
            raise RoundTripMismatch(path, f"q_zero_point {a.q_zero_point()} != expected {e.q_zero_point()}")
    else:
        if e.q_per_channel_axis() != a.q_per_channel_axis():
            raise RoundTripMismatch(path, f"q_per_channel_axis {a.q_per_channel_axis()} != expected {e.q_per_channel_axis()}")
        _compare_tensors(e.q_per_channel_scales(), a.q_per_channel_scales(), f"{path}.q_per_channel_scales()", None, None)
        _compare_tensors(e.q_per_channel_zero_points(), a.q_per_channel_zero_points(), f"{path}.q_per_channel_zero_points()", None, None)
    _compare_tensors(e.int_repr(), a.int_repr(), f"{path}.int_repr()", None, None)
