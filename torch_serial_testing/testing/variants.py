"""One test method's variants: the library's dimensions spoken in pytorch's ``parametrize_fn`` protocol.

pytorch's parametrizing decorators (``@parametrize``, ``@swap``, ``@optims``, ``@ops``) set a
``parametrize_fn(test, generic_cls, device_cls)`` attribute on the test, yielding ``(test, name suffix,
keyword arguments, decorator_fn)`` per variant; ``instantiate_device_type_tests`` calls it.  The mixin
gives every test method a ``parametrize_fn`` that yields one variant per load mode x engine pair (the
library's :class:`CaseSpec`), composed with the author's own, so the dimensions exist under pytorch's
instantiation; :func:`~.instantiation.instantiate_round_trip_tests` calls the author's ``parametrize_fn``
itself.  Nothing here imports ``torch.testing._internal``: the protocol is duck-typed.
"""

from __future__ import annotations

import dataclasses
import inspect
import itertools
import unittest
from typing import Any, Callable, Iterator, Optional

from ..core.errors import RoundTripConfigError
from ..core.modes import LoadMode
from ..torch_facts.devices import aliases, class_suffix, device_skip_reason
from ..torch_facts.engines import describe_engine_change, engine_state, override_qengine, qengine_skip_reason
from ..torch_facts.registry import safe_globals_context_missing
from .spec import CaseSpec
from .checked_loads import ends_on_rejection
from .generated import keep_reachable

__all__ = [
    "specs",
    "case_test",
    "dims_parametrize_fn",
    "user_parametrize_fn",
    "refuse_unhonoured",
    "dtype_variants",
    "dtype_suffix",
]

Variant = tuple[Callable[..., Any], str, dict[str, Any], Callable[[dict[str, Any]], list[Any]]]

#: Attributes pytorch's decorators set that only pytorch's device-type test bases act on.
_ONLY_PYTORCH = {
    "precision_overrides": "@precisionOverride",
    "tolerance_overrides": "@toleranceOverride",
    "num_required_devices": "@deviceCountAtLeast",
}


def specs(
    fn: Callable[..., Any], modes: tuple[LoadMode, ...], engines: Optional[tuple[str, ...]], device: str
) -> list[CaseSpec]:
    dims = getattr(fn, "_tst_dims", {})
    modes, engines = dims.get("load_modes", modes), dims.get("qengines", engines)
    if engines is None:
        pairs: list[tuple[Optional[str], Optional[str]]] = [(None, None)]
    elif getattr(fn, "_tst_cross_engine", False):
        pairs = list(itertools.permutations(engines, 2))
    else:
        pairs = [(e, e) for e in engines]
    targets = [False] if device == "cpu" or not modes else [False, True]  # the to_cpu twin only for tests that load
    return [
        CaseSpec(mode, device, save, load, to_cpu)
        for save, load in pairs
        for mode in (modes or (None,))
        for to_cpu in targets
    ]


def _skip_reason(fn: Callable[..., Any], spec: CaseSpec) -> Optional[str]:
    """Why this case cannot run here (``round_trip_dims(devices=...)``, engine, device, mode), or None."""
    only = getattr(fn, "_tst_dims", {}).get("devices")
    if only is not None and not aliases(spec.device_type) & set(only):
        return f"{fn.__name__} runs only on {', '.join(only)} (round_trip_dims(devices=...))"
    engines = dict.fromkeys(e for e in (spec.save_qengine, spec.load_qengine) if e)
    return (
        next(filter(None, map(qengine_skip_reason, engines)), None)
        or device_skip_reason(spec.device_type)
        or (safe_globals_context_missing() if spec.mode is LoadMode.SAFE_GLOBALS else None)
    )


def case_test(fn: Callable[..., Any], spec: CaseSpec) -> Callable[..., Any]:
    """*fn* run as the case *spec*: skipped with the reason if it cannot run here, else under its engine.

    Keyword arguments (pytorch's ``device``, ``@parametrize``'s) pass through; a ``device`` parameter
    nobody filled gets the case's device, as does a positional second parameter of another name."""
    params = list(inspect.signature(fn).parameters)[1:]
    positional_device = bool(params) and "device" not in params
    fn = ends_on_rejection(fn)  # methods inherited from a plain mixin were never wrapped

    def run_case(self: Any, *args: Any, **kwargs: Any) -> Any:
        reason = _skip_reason(fn, spec)
        if reason:
            raise unittest.SkipTest(reason)
        self._tst_case = spec
        device = class_suffix(spec.device_type).lower() if spec.device_type == "privateuse1" else spec.device_type
        if "device" in params and "device" not in kwargs:
            kwargs["device"] = device
        elif positional_device and not args and not kwargs:
            args = (device,)
        if not spec.save_qengine:
            return fn(self, *args, **kwargs)
        with override_qengine(spec.save_qengine, allocator=False):
            # As under pytorch's override_quantized_engine: the allocator as found (the body may install
            # pytorch's own).  The body must leave the engine and allocator as it got them, else that
            # is reported as leaked state (and restored).
            given = engine_state()
            try:
                return fn(self, *args, **kwargs)
            finally:
                self._tst_note_leaks(
                    [
                        f"{line}, set for this {spec.save_qengine} test"
                        for line in describe_engine_change(given, engine_state())
                    ]
                )

    for attr in ("__module__", "__name__", "__qualname__", "__doc__"):
        setattr(run_case, attr, getattr(fn, attr, None))
    run_case.__wrapped__ = fn  # type: ignore[attr-defined]  # signature and location: the author's def
    run_case._tst_spec = spec  # type: ignore[attr-defined]
    return run_case


def _no_decorators(_kwargs: dict[str, Any]) -> list[Any]:
    return []


def user_parametrize_fn(fn: Callable[..., Any]) -> Optional[Callable[..., Iterator[Variant]]]:
    """The author's own ``parametrize_fn`` (``@parametrize``, ``@swap``, ...), without the library's."""
    if "_tst_user_parametrize_fn" in getattr(fn, "__dict__", {}):
        return fn._tst_user_parametrize_fn  # type: ignore[attr-defined, no-any-return]
    found = getattr(fn, "parametrize_fn", None)
    return found if callable(found) else None


def _class_dims(generic_cls: Any) -> tuple[tuple[LoadMode, ...], Optional[tuple[str, ...]]]:
    from ..torch_facts.engines import validate_qengines

    modes = tuple(generic_cls.load_modes) if getattr(generic_cls, "load_modes", None) is not None else tuple(LoadMode)
    return modes, validate_qengines(getattr(generic_cls, "qengines", None))


def dims_parametrize_fn(test: Callable[..., Any], generic_cls: Any, device_cls: Any) -> Iterator[Variant]:
    """pytorch's protocol for the library's dimensions: one variant per case of *generic_cls*'s declaration
    on *device_cls*'s device type (cpu without one), suffix ``<engine>_<load_mode>[_to_cpu]``."""
    modes, engines = _class_dims(generic_cls if generic_cls is not None else device_cls)
    if generic_cls is not None and getattr(device_cls, "_tst_generic", None) is not generic_cls:
        keep_reachable(generic_cls)  # pytorch's instantiation removed it from its module
    device = getattr(device_cls, "device_type", None)
    device = device if isinstance(device, str) else "cpu"
    for spec in specs(test, modes, engines, device):
        suffix = dataclasses.replace(spec, to_cpu=False).method_name("", "x")[1:-2]  # between name and device
        yield case_test(test, spec), suffix + ("_to_cpu" if spec.to_cpu else ""), {}, _no_decorators


def composed(
    inner: Callable[..., Iterator[Variant]], outer: Optional[Callable[..., Iterator[Variant]]]
) -> Callable[..., Iterator[Variant]]:
    """*outer* applied to every variant *inner* yields; names ``<outer>_<inner>``, keywords merged (a
    keyword both set is an error, as in pytorch)."""
    if outer is None:
        return inner

    def both(test: Callable[..., Any], generic_cls: Any, device_cls: Any) -> Iterator[Variant]:
        for test_in, name_in, kwargs_in, decorate_in in inner(test, generic_cls, device_cls):
            for test_out, name_out, kwargs_out, decorate_out in outer(test_in, generic_cls, device_cls):
                twice = set(kwargs_in) & set(kwargs_out)
                if twice:
                    raise RoundTripConfigError(
                        f"{test.__name__}: parameter(s) {', '.join(sorted(twice))} set by two parametrizations"
                    )
                name = "_".join(n for n in (name_out, name_in) if n)

                def decorate(kw: dict[str, Any], a: Any = decorate_in, b: Any = decorate_out) -> list[Any]:
                    return [*a(kw), *b(kw)]

                yield test_out, name, {**kwargs_in, **kwargs_out}, decorate

    return both


def refuse_unhonoured(owner: str, name: str, fn: Callable[..., Any]) -> None:
    """At class creation: a pytorch decorator whose effect only pytorch's device-type bases apply fails
    here, under the library's instantiation, naming it -- never silently dropped."""
    for attr, decorator in _ONLY_PYTORCH.items():
        if hasattr(fn, attr):
            raise RoundTripConfigError(
                f"{owner}.{name} is decorated with {decorator}, which only pytorch's device-type test classes "
                "apply; instantiate_round_trip_tests cannot honour it.  Instantiate the class with "
                "torch.testing._internal.common_device_type.instantiate_device_type_tests instead (the "
                "load-mode and engine dimensions work there too), or drop the decorator."
            )


def _dtype_part(dtype: Any) -> str:
    return str(dtype).split(".")[-1]


def dtype_variants(fn: Callable[..., Any], device: str) -> list[dict[str, Any]]:
    """pytorch's ``@dtypes`` (``fn.dtypes``: device type or ``'all'`` -> dtypes): the keyword arguments,
    ``{'dtype': ...}`` (or ``{'dtypes': (...)}``), of one variant per dtype for *device*."""
    table = getattr(fn, "dtypes", None)
    if table is None:
        return [{}]
    if not isinstance(table, dict):
        raise RoundTripConfigError(f"{fn.__name__}.dtypes is {table!r}, not the table pytorch's @dtypes sets")
    chosen = next((table[k] for k in (*sorted(aliases(device)), "all") if k in table), None)
    if chosen is None:
        raise RoundTripConfigError(
            f"{fn.__name__} is decorated with @dtypes for {', '.join(sorted(table))} only, not for {device} "
            "(nor 'all'); add @dtypes(...) for every device type the class runs on"
        )
    return [{"dtypes": d} if isinstance(d, (list, tuple)) else {"dtype": d} for d in chosen]


def dtype_suffix(params: dict[str, Any]) -> str:
    """The name part after the device for a ``dtype``/``dtypes`` argument, as pytorch names it
    (``_float32``, ``_float32_int64``), whichever decorator (``@dtypes``, ``@optims``) set it."""
    given = params.get("dtypes", params.get("dtype"))
    if given is None:
        return ""
    return "_" + "_".join(_dtype_part(d) for d in (given if isinstance(given, (list, tuple)) else (given,)))
