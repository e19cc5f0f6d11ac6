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


class _Checks:
    """Which properties count, as in ``torch.testing.assert_close`` (all strict by default)."""

    __slots__ = ("rtol", "atol", "allow_subclasses", "check_requires_grad", "check_dtype", "check_device",
                 "check_layout")

    def __init__(self, rtol: Optional[float] = None, atol: Optional[float] = None, allow_subclasses: bool = False,
                 check_requires_grad: bool = True, check_dtype: bool = True, check_device: bool = True,
                 check_layout: bool = True) -> None:
        self.rtol = rtol
        self.atol = atol
        self.allow_subclasses = allow_subclasses
        self.check_requires_grad = check_requires_grad
        self.check_dtype = check_dtype
        self.check_device = check_device
        self.check_layout = check_layout


#: The default, exact checks (most calls): built once.
_EXACT = _Checks()


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
    """Raise :class:`RoundTripMismatch` at the first difference between *expected* and *actual*.

    Exact by default: every object keeps its exact type (a ``Parameter`` is not a ``Tensor``),
    and tensors their dtype, device, layout, shape, ``requires_grad`` and values (NaN equal to
    NaN).  The knobs relax one property each, named as in ``torch.testing.assert_close``:

    * *rtol*/*atol* (together): float tolerance for tensor values;
    * *allow_subclasses*: types related by inheritance match (``Parameter`` vs ``Tensor``,
      ``OrderedDict`` vs ``dict``); unrelated types still differ;
    * *check_requires_grad*: ``False`` ignores ``requires_grad``;
    * *check_dtype*: ``False`` compares values after promoting both to a common dtype;
    * *check_device*: ``False`` compares values on the CPU;
    * *check_layout*: ``False`` compares sparse tensors by their dense values.

    Shapes, quantization parameters and container keys/lengths are always compared.
    """
    if (rtol is None) != (atol is None):
        raise ValueError("pass rtol and atol together (or neither, for exact comparison)")
    if (rtol is None and not allow_subclasses and check_requires_grad and check_dtype and check_device
            and check_layout):
        checks = _EXACT
    else:
        checks = _Checks(rtol, atol, bool(allow_subclasses), bool(check_requires_grad), bool(check_dtype),
                         bool(check_device), bool(check_layout))
    _compare(expected, actual, "", checks)


def _same_type(e: Any, a: Any, checks: _Checks) -> bool:
    if type(e) is type(a):
        return True
    return checks.allow_subclasses and (isinstance(a, type(e)) or isinstance(e, type(a)))


def _compare(e: Any, a: Any, path: str, checks: _Checks) -> None:
    import torch

    if isinstance(e, torch.Tensor) or isinstance(a, torch.Tensor):
        _compare_tensors(e, a, path, checks)
        return
    if not _same_type(e, a, checks):
        raise RoundTripMismatch(path, f"type {type(a).__name__} != expected {type(e).__name__} ({a!r} vs {e!r})")
    if isinstance(e, torch.nn.Module):
        _compare(e.state_dict(), a.state_dict(), f"{path}.state_dict()", checks)
        return
    if isinstance(e, torch.ScriptObject):
        _compare(e.__getstate__(), a.__getstate__(), f"{path}.__getstate__()", checks)
        return
    if isinstance(e, dict):
        missing = [k for k in e if k not in a]
        extra = [k for k in a if k not in e]
        if missing or extra:
            raise RoundTripMismatch(path, f"keys differ: missing {missing}, unexpected {extra}")
        for k in e:
            _compare(e[k], a[k], f"{path}[{k!r}]", checks)
        return
    if isinstance(e, (list, tuple)):
        if len(e) != len(a):
            raise RoundTripMismatch(path, f"length {len(a)} != expected {len(e)}")
        for i, (x, y) in enumerate(zip(e, a)):
            _compare(x, y, f"{path}[{i}]", checks)
        return
    if isinstance(e, float) and math.isnan(e) and math.isnan(a):
        return
    if isinstance(e, _EXACT_SCALARS) or isinstance(e, (torch.dtype, torch.device, torch.Size, torch.qscheme)):
        if e != a:
            raise RoundTripMismatch(path, f"{a!r} != expected {e!r}")
        return
    if e != a:
        raise RoundTripMismatch(path, f"{a!r} != expected {e!r} (compared with ==)")


def _compare_tensors(e: Any, a: Any, path: str, checks: _Checks) -> None:
    import torch

    if not (isinstance(e, torch.Tensor) and isinstance(a, torch.Tensor)):
        raise RoundTripMismatch(path, f"type {type(a).__name__} != expected {type(e).__name__}")
    if not _same_type(e, a, checks):
        raise RoundTripMismatch(
            path, f"tensor class {type(a).__name__} != expected {type(e).__name__} (allow_subclasses=True "
            "accepts related classes such as Parameter vs Tensor)"
        )
    compared = [
        ("dtype", checks.check_dtype, "check_dtype=False"),
        ("device", checks.check_device, "check_device=False"),
        ("layout", checks.check_layout, "check_layout=False"),
        ("shape", True, ""),
        ("requires_grad", checks.check_requires_grad, "check_requires_grad=False"),
    ]
    for attr, strict, knob in compared:
        x, y = getattr(e, attr), getattr(a, attr)
        if strict and x != y:
            hint = f" ({knob} ignores it)" if knob else ""
            raise RoundTripMismatch(path, f"{attr} {y} != expected {x}{hint}")
    if e.is_quantized or a.is_quantized:
        if e.is_quantized != a.is_quantized:
            raise RoundTripMismatch(path, f"quantized {a.is_quantized} != expected {e.is_quantized}")
        _compare_quantized(e, a, path)
        return
    if e.device != a.device:  # only reached with check_device=False
        e, a = e.cpu(), a.cpu()
    if e.layout != torch.strided:
        e = e.to_dense()
    if a.layout != torch.strided:
        a = a.to_dense()
    if e.dtype != a.dtype:  # only reached with check_dtype=False
        common = torch.promote_types(e.dtype, a.dtype)
        e, a = e.to(common), a.to(common)
    a, e = a.detach(), e.detach()
    try:
        if torch.equal(a, e):  # identical values are close under any tolerance (NaNs fall through)
            return
    except (RuntimeError, NotImplementedError):  # a tensor kind torch.equal does not support
        pass
    try:
        torch.testing.assert_close(
            a, e, rtol=0 if checks.rtol is None else checks.rtol,
            atol=0 if checks.atol is None else checks.atol,
            equal_nan=True, check_device=True, check_dtype=True, check_layout=True,
        )
    except AssertionError as err:
        raise RoundTripMismatch(path, f"tensor values differ: {err}") from None


def _compare_quantized(e: Any, a: Any, path: str) -> None:
    import torch

    exact = _EXACT
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
        _compare_tensors(e.q_per_channel_scales(), a.q_per_channel_scales(), f"{path}.q_per_channel_scales()", exact)
        _compare_tensors(e.q_per_channel_zero_points(), a.q_per_channel_zero_points(), f"{path}.q_per_channel_zero_points()", exact)
    _compare_tensors(e.int_repr().cpu(), a.int_repr().cpu(), f"{path}.int_repr()", exact)
