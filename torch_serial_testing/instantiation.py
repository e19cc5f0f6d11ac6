"""Generate one named test per load mode x quantized engine x device, pytorch style.

``instantiate_round_trip_tests(TestFoo, globals())`` replaces the generic
``TestFoo`` in the caller's scope with ``TestFooCPU``, ``TestFooCUDA``, ...
(as pytorch's ``instantiate_device_type_tests`` does), each holding methods
named ``test_<name>_<qengine>_<load_mode>_<device>``:

* cross-engine tests (``@cross_engine``): ``test_<name>_fbgemm_to_qnnpack_<mode>_<device>``
* for a non-cpu device, a save-there-load-on-cpu twin: ``..._<device>_to_cpu``

Each generated method calls the author's function directly (one library frame
in a traceback, then the author's) and carries it as ``__wrapped__``, so
pytest (``-v``, JUnit XML) attributes the test to the author's file and line.
The frame is deliberately not hidden with ``__unittest``: behind pytorch's
``TestCase`` method wrapper, unittest would then cut an assertion failure's
traceback at that frame, dropping the author's lines.
Cases that cannot run here (engine unsupported, device absent, mode
unsupported by this torch) are still generated and skip with the reason, so
test ids are the same everywhere.  The generic class is removed from the
scope, so no runner collects it; the names generated from it are recorded
per module (:func:`generated_class_names`) for ``import_round_trip_tests``.
"""

from __future__ import annotations

import inspect
import itertools
import unittest
from typing import Any, Callable, MutableMapping, Optional, TypeVar

from .case import CaseSpec, ExpectedRejection, SerializationRoundTripTestCase
from .devices import class_suffix, device_skip_reason, resolve_devices
from .engines import describe_engine_change, engine_state, override_qengine, qengine_skip_reason, validate_qengines
from .errors import RoundTripConfigError
from .load_modes import LoadMode, mode_skip_reason

__all__ = ["instantiate_round_trip_tests", "cross_engine"]

# module name -> generic class name -> names of the classes generated from it (possibly none).
_GENERATED: dict[str, dict[str, tuple[str, ...]]] = {}

F = TypeVar("F", bound=Callable[..., Any])


def cross_engine(fn: F) -> F:
    """Mark a test to run for every ordered pair of distinct declared engines (save, load)."""
    fn._tst_cross_engine = True  # type: ignore[attr-defined]
    return fn


def _device_part(device_type: str) -> str:
    return class_suffix(device_type).lower()


def _specs(fn: Callable[..., Any], modes: tuple[LoadMode, ...], engines: Optional[tuple[str, ...]], device: str) -> list[CaseSpec]:
    if engines is None:
        pairs: list[tuple[Optional[str], Optional[str]]] = [(None, None)]
    elif getattr(fn, "_tst_cross_engine", False):
        pairs = list(itertools.permutations(engines, 2))
    else:
        pairs = [(e, e) for e in engines]
    targets = [False] if device == "cpu" else [False, True]
    return [
        CaseSpec(mode, device, save, load, to_cpu)
        for save, load in pairs
        for mode in modes
        for to_cpu in targets
    ]


def _skip_reason(spec: CaseSpec) -> Optional[str]:
    for engine in dict.fromkeys(e for e in (spec.save_qengine, spec.load_qengine) if e):
        reason = qengine_skip_reason(engine)
        if reason:
            return reason
    reason = device_skip_reason(spec.device_type)
    if reason:
        return reason
    return mode_skip_reason(spec.mode)


def _case_method(fn: Callable[..., Any], spec: CaseSpec, name: str, class_name: str) -> Callable[..., Any]:
    """One generated test: *fn* run for *spec*, reported at *fn*'s file and line (``__wrapped__``)."""
    takes_device = len(inspect.signature(fn).parameters) >= 2
    # The author's function, without the mixin's rejection wrapper: run_case does its job itself,
    # so a traceback holds one library frame, not two.
    author = fn.__wrapped__ if getattr(fn, "_tst_wrapped", False) else fn

    def run_case(self: Any) -> Any:
        reason = _skip_reason(spec)
        if reason:
            raise unittest.SkipTest(reason)
        self._tst_case = spec
        device = class_suffix(spec.device_type).lower() if spec.device_type == "privateuse1" else spec.device_type
        if not spec.save_qengine:
            try:
                return author(self, device) if takes_device else author(self)
            except ExpectedRejection:  # an expected rejection ends the test as a pass
                return None
        with override_qengine(spec.save_qengine):
            # One rule with tests that have no engine dimension: the body must leave the engine
            # and allocator as it got them, else it is reported as leaked state (and restored).
            given = engine_state()
            try:
                return author(self, device) if takes_device else author(self)
            except ExpectedRejection:  # an expected rejection ends the test as a pass
                return None
            finally:
                self._tst_note_leaks(
                    [f"{line}, set for this {spec.save_qengine} test" for line in describe_engine_change(given, engine_state())]
                )

    run_case.__name__ = name
    run_case.__qualname__ = f"{class_name}.{name}"
    run_case.__doc__ = fn.__doc__
    run_case.__module__ = fn.__module__
    run_case.__wrapped__ = author  # type: ignore[attr-defined]
    run_case._tst_wrapped = True  # type: ignore[attr-defined]  # the mixin must not wrap it again
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
    modes = tuple(generic_cls.load_modes) if generic_cls.load_modes is not None else tuple(LoadMode)
    engines = validate_qengines(generic_cls.qengines)
    devices = resolve_devices(generic_cls.devices)
    tests = {n: f for n, f in generic_cls.__dict__.items() if n.startswith("test") and callable(f)}
    if not tests:
        raise RoundTripConfigError(
            f"{generic_cls.__name__} has no test methods; define at least one 'def test_...(self, device)'"
        )
    for name, fn in tests.items():
        if getattr(fn, "_tst_cross_engine", False) and (engines is None or len(engines) < 2):
            raise RoundTripConfigError(
                f"{generic_cls.__name__}.{name} is @cross_engine but the class declares "
                f"{len(engines or ())} qengine(s); declare at least two"
            )
    module_name = scope.get("__name__", generic_cls.__module__)
    # The base the generated classes share: the generic class minus its test methods.
    base_dict = {k: v for k, v in generic_cls.__dict__.items() if k not in tests and k not in ("__dict__", "__weakref__")}
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
            for spec in _specs(fn, modes, engines, device):
                method_name = spec.method_name(name, _device_part(device))
                if method_name in methods or method_name in base_dict:
                    raise RoundTripConfigError(
                        f"{generic_cls.__name__}.{name} generates {method_name}, which another test or "
                        "attribute of the class already names; rename one of them"
                    )
                methods[method_name] = _case_method(fn, spec, method_name, class_name)
        cls = type(class_name, (base,), {**methods, "__module__": module_name, "__qualname__": class_name})
        scope[class_name] = cls
        generated.append(cls)
    if scope.get(generic_cls.__name__) is generic_cls:
        del scope[generic_cls.__name__]
    _GENERATED.setdefault(module_name, {})[generic_cls.__name__] = tuple(c.__name__ for c in generated)
    return generated


def generated_class_names(module_name: str) -> dict[str, tuple[str, ...]]:
    """Generic class name -> generated class names, for each instantiation in *module_name* so far."""
    return dict(_GENERATED.get(module_name, {}))
