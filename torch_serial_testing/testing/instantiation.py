"""Generate one named test per load mode x quantized engine x device, pytorch style.

``instantiate_round_trip_tests(TestFoo, globals())`` replaces the generic
``TestFoo`` in the caller's scope with ``TestFooCPU``, ``TestFooCUDA``, ...
(as pytorch's ``instantiate_device_type_tests`` does), each holding methods
named ``test_<name>_<qengine>_<load_mode>_<device>``:

* cross-engine tests (``@cross_engine``): ``test_<name>_fbgemm_to_qnnpack_<mode>_<device>``
* for a non-cpu device, a save-there-load-on-cpu twin: ``..._<device>_to_cpu``
* a method narrows or drops dimensions with ``@round_trip_dims(...)`` or
  ``@no_round_trip_dims`` (no load mode, no engine: ``test_<name>_<device>``)

Test methods inherited from a shared base class or a plain mixin are generated
too (pytorch's own instantiation ignores them).

The expansion is done with ``parameterized.expand``.  Each generated method
carries the author's function as ``__wrapped__``, so pytest (``-v``, JUnit XML)
attributes the test to the author's file and line; library frames stay visible
in unittest tracebacks (hiding them with ``__unittest`` would, behind pytorch's
``TestCase`` method wrapper, cut an assertion failure's traceback before the
author's lines).  Cases that cannot run here (engine unsupported, device
absent, mode unsupported by this torch) are still generated and skip with the
reason, so test ids are the same everywhere.  The generic class is removed from
the scope, so no runner collects it; the names generated from it are recorded
per module (:func:`generated_class_names`) for ``import_round_trip_tests``.
"""

from __future__ import annotations

import inspect
import itertools
import unittest
from typing import Any, Callable, MutableMapping, Optional, TypeVar

from ..core.errors import RoundTripConfigError, dimension
from ..core.modes import LoadMode
from ..torch_facts.devices import aliases, class_suffix, device_skip_reason, is_device_type, resolve_devices
from ..torch_facts.engines import (
    describe_engine_change, engine_state, override_qengine, qengine_skip_reason, validate_qengines,
)
from ..torch_facts.registry import safe_globals_context_missing
from .case import CaseSpec, SerializationRoundTripTestCase, ends_on_rejection

__all__ = ["instantiate_round_trip_tests", "cross_engine", "round_trip_dims", "no_round_trip_dims"]

_KEEP: Any = object()

# module name -> generic class name -> names of the classes generated from it (possibly none).
_GENERATED: dict[str, dict[str, tuple[str, ...]]] = {}

F = TypeVar("F", bound=Callable[..., Any])


def cross_engine(fn: F) -> F:
    """Mark a test to run for every ordered pair of distinct declared engines (save, load)."""
    fn._tst_cross_engine = True  # type: ignore[attr-defined]
    return fn


def round_trip_dims(
    *, load_modes: Any = _KEEP, qengines: Any = _KEEP, devices: Any = _KEEP
) -> Callable[[F], F]:
    """Narrow or drop this method's dimensions; an omitted one keeps the class's.

    ``load_modes=()`` drops the load-mode dimension (a test that never loads: no
    ``_<mode>`` in its names); ``qengines=None`` drops the engine dimension; a tuple
    narrows (or, for a class without one, adds) a dimension.  ``devices=("cpu",)``
    keeps the method only in those device classes; in the others its tests are
    generated and skip saying so (as pytorch's ``@onlyCPU`` does).
    """
    dims: dict[str, Any] = {}
    if load_modes is not _KEEP:
        if isinstance(load_modes, (str, bytes)) or not hasattr(load_modes, "__iter__"):
            raise RoundTripConfigError(f"round_trip_dims(load_modes=...) must be a tuple, got {load_modes!r}; "
                                       "write load_modes=('default',) or load_modes=() for none")
        modes = tuple(LoadMode.parse(m) for m in load_modes)
        dims["load_modes"] = dimension("load_modes", modes, "('default',)") if modes else ()
    if qengines is not _KEEP:
        dims["qengines"] = validate_qengines(qengines)
    if devices is not _KEEP:
        names = dimension("devices", devices, "('cpu',)")
        for d in names:
            if not is_device_type(d):
                raise RoundTripConfigError(f"round_trip_dims: unknown device type {d!r}; use cpu, cuda, xpu, "
                                           "mps, privateuse1 or a registered backend name")
        dims["devices"] = names

    def decorate(fn: F) -> F:
        if not callable(fn):
            raise RoundTripConfigError("round_trip_dims(...) decorates a test method: put it above 'def test_...'")
        fn._tst_dims = {**getattr(fn, "_tst_dims", {}), **dims}  # type: ignore[attr-defined]
        return fn

    return decorate


def no_round_trip_dims(fn: F) -> F:
    """The test never loads: no load-mode and no engine dimension, one test per device class."""
    return round_trip_dims(load_modes=(), qengines=None)(fn)


def _device_part(device_type: str) -> str:
    return class_suffix(device_type).lower()


def _specs(fn: Callable[..., Any], modes: tuple[LoadMode, ...], engines: Optional[tuple[str, ...]], device: str) -> list[CaseSpec]:
    dims = getattr(fn, "_tst_dims", {})
    modes = dims.get("load_modes", modes)
    engines = dims.get("qengines", engines)
    if engines is None:
        pairs: list[tuple[Optional[str], Optional[str]]] = [(None, None)]
    elif getattr(fn, "_tst_cross_engine", False):
        pairs = list(itertools.permutations(engines, 2))
    else:
        pairs = [(e, e) for e in engines]
    # The save-there-load-on-cpu twin exists only for tests that load.
    targets = [False] if device == "cpu" or not modes else [False, True]
    return [
        CaseSpec(mode, device, save, load, to_cpu)
        for save, load in pairs
        for mode in (modes or (None,))
        for to_cpu in targets
    ]


def _only_on(fn: Callable[..., Any], device: str) -> Optional[str]:
    """Why *fn* does not run in *device*'s class (``round_trip_dims(devices=...)``), or None."""
    only = getattr(fn, "_tst_dims", {}).get("devices")
    if only is None or aliases(device) & set(only):
        return None
    return f"{fn.__name__} runs only on {', '.join(only)} (round_trip_dims(devices=...))"


def _skip_reason(spec: CaseSpec) -> Optional[str]:
    for engine in dict.fromkeys(e for e in (spec.save_qengine, spec.load_qengine) if e):
        reason = qengine_skip_reason(engine)
        if reason:
            return reason
    reason = device_skip_reason(spec.device_type)
    if reason:
        return reason
    return safe_globals_context_missing() if spec.mode is LoadMode.SAFE_GLOBALS else None


def _runner(fn: Callable[..., Any]) -> Callable[..., Any]:
    takes_device = len(inspect.signature(fn).parameters) >= 2
    fn = ends_on_rejection(fn)  # methods inherited from a plain mixin were never wrapped

    def run_case(self: Any, spec: CaseSpec) -> Any:
        reason = _only_on(fn, spec.device_type) or _skip_reason(spec)
        if reason:
            raise unittest.SkipTest(reason)
        self._tst_case = spec
        device = class_suffix(spec.device_type).lower() if spec.device_type == "privateuse1" else spec.device_type
        if not spec.save_qengine:
            return fn(self, device) if takes_device else fn(self)
        with override_qengine(spec.save_qengine):
            # One rule with tests that have no engine dimension: the body must leave the engine
            # and allocator as it got them, else it is reported as leaked state (and restored).
            given = engine_state()
            try:
                return fn(self, device) if takes_device else fn(self)
            finally:
                self._tst_note_leaks(
                    [f"{line}, set for this {spec.save_qengine} test" for line in describe_engine_change(given, engine_state())]
                )

    run_case.__name__ = fn.__name__
    run_case.__qualname__ = getattr(fn, "__qualname__", fn.__name__)
    run_case.__doc__ = fn.__doc__
    run_case.__module__ = fn.__module__
    run_case.__wrapped__ = fn  # type: ignore[attr-defined]  # pytest follows it to the author's def
    return run_case


def instantiate_round_trip_tests(generic_cls: type, scope: MutableMapping[str, Any]) -> list[type]:
    """Replace *generic_cls* in *scope* (usually ``globals()``) by one class per device type.

    Returns the generated classes.  Raises :class:`RoundTripConfigError` for an
    unknown engine or device, an empty dimension, a class without test methods
    or a generated name that already exists in *scope*.
    """
    if not (isinstance(generic_cls, type) and issubclass(generic_cls, SerializationRoundTripTestCase)
            and issubclass(generic_cls, unittest.TestCase)):
        raise RoundTripConfigError(
            f"{generic_cls!r} must subclass SerializationRoundTripTestCase and unittest.TestCase "
            "(class TestFoo(SerializationRoundTripTestCase, TestCase))"
        )
    from parameterized import param, parameterized  # imported on use: it pulls in unittest.mock

    modes = tuple(generic_cls.load_modes) if generic_cls.load_modes is not None else tuple(LoadMode)
    engines = validate_qengines(generic_cls.qengines)
    devices = resolve_devices(generic_cls.devices)
    tests, bases = _test_methods(generic_cls)
    if not tests:
        raise RoundTripConfigError(
            f"{generic_cls.__name__} has no test methods; define at least one 'def test_...(self, device)'"
        )
    for name, fn in tests.items():
        fn_engines = getattr(fn, "_tst_dims", {}).get("qengines", engines)
        if getattr(fn, "_tst_cross_engine", False) and (fn_engines is None or len(fn_engines) < 2):
            raise RoundTripConfigError(
                f"{generic_cls.__name__}.{name} is @cross_engine but "
                f"{'its round_trip_dims give' if 'qengines' in getattr(fn, '_tst_dims', {}) else 'the class declares'} "
                f"{len(fn_engines or ())} qengine(s); declare at least two"
            )
    module_name = scope.get("__name__", generic_cls.__module__)
    # The base the generated classes share: the generic class minus its test methods.  Inherited
    # test methods are masked (None is not collected by any runner): only generated ones remain.
    base_dict = {k: v for k, v in generic_cls.__dict__.items() if k not in tests and k not in ("__dict__", "__weakref__")}
    base_dict.update({name: None for name in tests if any(hasattr(b, name) for b in generic_cls.__bases__)})
    base = type(generic_cls.__name__, generic_cls.__bases__, base_dict)

    generated = []
    for device in devices:
        class_name = generic_cls.__name__ + class_suffix(device)
        if class_name in scope:
            raise RoundTripConfigError(
                f"{class_name} already exists in the module; rename {generic_cls.__name__} or the "
                f"existing {class_name}"
            )
        methods: dict[str, Any] = {}
        for name, fn in tests.items():
            specs = _specs(fn, modes, engines, device)
            for spec in specs:
                method_name = spec.method_name(name, _device_part(device))
                if method_name in methods or method_name in base_dict:
                    raise RoundTripConfigError(
                        f"{generic_cls.__name__}.{name} generates {method_name}, which another test or "
                        "attribute of the class already names; rename one of them"
                    )
                methods[method_name] = None  # reserved; parameterized fills it in below
            parameterized.expand(
                [param(spec) for spec in specs],
                name_func=lambda f, num, p, dev=device: p.args[0].method_name(f.__name__, _device_part(dev)),
                doc_func=lambda f, num, p: f.__doc__,
                namespace=methods,
            )(_runner(fn))
        for method in methods.values():
            # parameterized drops __wrapped__ and points pytest at its wrapped function (place_as):
            # point both at the author's def (unittest classes take no pytest fixtures, so a
            # __wrapped__ signature is harmless); the mixin must not wrap the method again.
            method.__wrapped__ = method.place_as
            method.place_as = inspect.unwrap(method.place_as)
            method._tst_wrapped = True
        cls = type(class_name, (base,), {**methods, "__module__": module_name, "__qualname__": class_name})
        scope[class_name] = cls
        generated.append(cls)
    if scope.get(generic_cls.__name__) is generic_cls:
        del scope[generic_cls.__name__]
    for klass in bases:  # a shared generic base in this module is generic too: never collected
        if scope.get(klass.__name__) is klass:
            del scope[klass.__name__]
    _GENERATED.setdefault(module_name, {})[generic_cls.__name__] = tuple(c.__name__ for c in generated)
    return generated


def generated_class_names(module_name: str) -> dict[str, tuple[str, ...]]:
    """Generic class name -> generated class names, for each instantiation in *module_name* so far."""
    return dict(_GENERATED.get(module_name, {}))


def _test_methods(generic_cls: type) -> tuple[dict[str, Callable[..., Any]], list[type]]:
    """The class's test methods, own and inherited (the nearest definition wins), and the
    ``TestCase`` bases that define some of them."""
    tests: dict[str, Callable[..., Any]] = {}
    seen: set[str] = set()
    bases: list[type] = []
    for klass in generic_cls.__mro__:
        if klass in (SerializationRoundTripTestCase, unittest.TestCase, object) or _is_framework(klass):
            continue
        own = False
        for name, value in vars(klass).items():
            if not name.startswith("test") or name in seen:
                continue
            seen.add(name)  # a subclass's "test_x = None" hides the base's test_x
            if callable(value):
                tests[name] = value
                own = True
        if own and klass is not generic_cls and issubclass(klass, unittest.TestCase):
            bases.append(klass)
    return tests, bases


def _is_framework(klass: type) -> bool:
    """A test framework's base class (unittest, expecttest, pytorch's common_utils): no tests of ours."""
    module = klass.__module__
    return any(module == m or module.startswith(m + ".") for m in ("unittest", "expecttest", "torch.testing._internal"))
