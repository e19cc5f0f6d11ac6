"""A generated test's coordinates, and the test name pytorch's conventions give them."""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import itertools
import sys
import unittest
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, Optional

from .devices import aliases, class_suffix, device_skip_reason
from .engines import describe_engine_change, engine_state, override_qengine, qengine_skip_reason
from .errors import RoundTripConfigError
from .modes import LoadMode
from .outcomes import ends_on_rejection
from .registry import safe_globals_context_missing


@dataclass(frozen=True)
class CaseSpec:
    """One generated test's coordinates: load mode, engines (save, load), device, and where it loads to."""

    mode: Optional[LoadMode]  # None: the method dropped the load-mode dimension
    device_type: str
    save_qengine: Optional[str] = None
    load_qengine: Optional[str] = None
    to_cpu: bool = False

    def method_name(self, base: str, device_part: str) -> str:
        parts = [base]
        if self.save_qengine:
            same = self.save_qengine == self.load_qengine
            parts.append(self.save_qengine if same else f"{self.save_qengine}_to_{self.load_qengine}")
        if self.mode is not None:
            parts.append(self.mode.value)
        parts += [device_part, "to_cpu"] if self.to_cpu else [device_part]
        return "_".join(parts)

    @property
    def map_location(self) -> Optional[str]:
        if self.to_cpu:
            return "cpu"
        from .devices import torch_device_type

        return None if self.device_type == "cpu" else torch_device_type(self.device_type)


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
    from .engines import validate_qengines

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


_PACKAGE = __name__.rsplit(".", 2)[0] + "."  # this library's modules (also when vendored under another name)


def _parametrize_fn(test: Any, generic_cls: Any, device_cls: Any) -> Any:
    """pytorch's ``parametrize_fn`` protocol: the library's dimensions, then the author's parametrizations."""
    return composed(dims_parametrize_fn, test.__dict__.get("_tst_user_parametrize_fn"))(test, generic_cls, device_cls)


def with_dims(fn: Any) -> Any:
    """*fn* (wrapped by :func:`ends_on_rejection`) with the load-mode and engine dimensions as a
    ``parametrize_fn``, so pytorch's ``instantiate_device_type_tests`` generates them too."""
    if "_tst_user_parametrize_fn" not in fn.__dict__:
        fn._tst_user_parametrize_fn = getattr(fn, "parametrize_fn", None)
        fn.parametrize_fn = _parametrize_fn
    return fn


def _instantiated(klass: type) -> bool:
    """A class generated from the author's (by this library, or pytorch's ``(CPUTestBase, TestFoo)``)."""
    if "_tst_generic" in vars(klass):
        return True
    bases = klass.__bases__
    return len(bases) > 1 and f"{bases[0].__module__}.".startswith("torch.testing._internal.")


def author_class(cls: type, attribute: str) -> str:
    """The name of the author's class that declares *attribute* (or, undeclared, the author's nearest
    class): never a generated ``TestFooCPU``, whose fix would not go where the author can paste it."""
    framework = ("unittest.", "expecttest.", "torch.testing._internal.")
    authors = [
        k
        for k in cls.__mro__
        if not _instantiated(k)
        and not f"{k.__module__}.".startswith(framework)
        and not f"{k.__module__}.".startswith(_PACKAGE)
        and k is not object
    ]
    return next((k for k in authors if attribute in vars(k)), authors[0] if authors else cls).__name__


@contextlib.contextmanager
def resolvable(cls: type, declared: Iterable[Any]) -> Iterator[None]:
    """While the class statement of *cls* runs, its module does not hold it yet: a declared helper class
    nested in it (pytorch's ``TestLRScheduler.SchedulerTestNet``) would not resolve under its pickled
    name ``module.TestX.Net``, and the trust policy would refuse it.  Bind *cls* under its name for the
    judging only (the class statement binds it right after), and only when it declares such a class."""
    module = sys.modules.get(cls.__module__)
    prefix = f"{cls.__qualname__}."
    nested = not isinstance(declared, (str, bytes)) and any(
        isinstance(item, type) and item.__module__ == cls.__module__ and item.__qualname__.startswith(prefix)
        for item in (declared if hasattr(declared, "__iter__") else ())
    )
    if module is None or not nested or "." in cls.__qualname__ or cls.__name__ in vars(module):
        yield
        return
    setattr(module, cls.__name__, cls)
    try:
        yield
    finally:
        if vars(module).get(cls.__name__) is cls:
            delattr(module, cls.__name__)


def keep_reachable(generic_cls: Any) -> None:
    """Under pytorch's ``instantiate_device_type_tests``, which removes the generic class from its module:
    put it back when it holds nested classes, which pickle as ``getattr(TestFoo, 'Net')`` and so need
    ``module.TestFoo``.  pytorch strips the generic tests off the class, so nothing collects it -- unless
    it inherits tests from a base, which would then run generic: left removed then."""
    module = sys.modules.get(getattr(generic_cls, "__module__", ""))
    if module is None or not isinstance(generic_cls, type) or "." in generic_cls.__qualname__:
        return
    if generic_cls.__name__ in vars(module):
        return
    prefix = f"{generic_cls.__qualname__}."
    nested = any(isinstance(v, type) and v.__qualname__.startswith(prefix) for v in vars(generic_cls).values())
    inherited = any(
        n.startswith("test") and callable(v)
        for base in generic_cls.__mro__[1:]
        if not f"{base.__module__}.".startswith(("unittest.", "expecttest.", "torch.testing._internal.", _PACKAGE))
        for n, v in vars(base).items()
    )
    if nested and not inherited:
        setattr(module, generic_cls.__name__, generic_cls)
