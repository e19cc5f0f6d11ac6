"""Generate one named test per load mode x quantized engine x device, pytorch style.

``instantiate_round_trip_tests(TestFoo, globals())`` replaces ``TestFoo`` by ``TestFooCPU``, ... (as
``instantiate_device_type_tests`` does) holding ``test_<name>_<qengine>_<load_mode>_<device>``, plus
``..._fbgemm_to_qnnpack_...`` for ``@cross_engine`` and a ``..._<device>_to_cpu`` twin off cpu.
Inherited test methods are generated too; cases that cannot run here skip with the reason, so test ids
are the same everywhere.  Methods carry the author's function as ``__wrapped__`` (pytest reports its
file and line); library frames stay in tracebacks (``__unittest`` would, behind pytorch's ``TestCase``
wrapper, cut the author's lines).  ``import_round_trip_tests`` binds the classes into an aggregator.
"""

from __future__ import annotations

import importlib
import inspect
import types
import unittest
from typing import Any, Callable, MutableMapping, Optional, TypeVar, Union

from .case import SerializationRoundTripTestCase
from .devices import class_suffix, is_device_type, resolve_devices
from .engines import validate_qengines
from .errors import RoundTripConfigError, dimension
from .modes import LoadMode
from .variants import case_test, dtype_suffix, dtype_variants, refuse_unhonoured, specs, user_parametrize_fn

_KEEP: Any = object()

# module name -> generic class name -> names of the classes generated from it (possibly none).
_GENERATED: dict[str, dict[str, tuple[str, ...]]] = {}

F = TypeVar("F", bound=Callable[..., Any])


def cross_engine(fn: F) -> F:
    """Mark a test to run for every ordered pair of distinct declared engines (save, load)."""
    fn._tst_cross_engine = True  # type: ignore[attr-defined]
    return fn


def round_trip_dims(*, load_modes: Any = _KEEP, qengines: Any = _KEEP, devices: Any = _KEEP) -> Callable[[F], F]:
    """Narrow or drop this method's dimensions; an omitted one keeps the class's.

    ``load_modes=()`` drops the load-mode dimension (a test that never loads), ``qengines=None``
    the engine dimension; a tuple narrows (or adds) one.  ``devices=("cpu",)`` runs the method only
    in those device classes; in the others its tests skip saying so (as pytorch's ``@onlyCPU``).
    """
    dims: dict[str, Any] = {}
    if load_modes is not _KEEP:
        if isinstance(load_modes, (str, bytes)) or not hasattr(load_modes, "__iter__"):
            raise RoundTripConfigError(
                f"round_trip_dims(load_modes=...) must be a tuple, got {load_modes!r}; "
                "write load_modes=('default',) or load_modes=() for none"
            )
        modes = tuple(LoadMode.parse(m) for m in load_modes)
        dims["load_modes"] = dimension("load_modes", modes, "('default',)") if modes else ()
    if qengines is not _KEEP:
        dims["qengines"] = validate_qengines(qengines)
    if devices is not _KEEP:
        dims["devices"] = dimension("devices", devices, "('cpu',)")
        for d in dims["devices"]:
            if not is_device_type(d):
                raise RoundTripConfigError(
                    f"round_trip_dims: unknown device type {d!r}; use cpu, cuda, xpu, "
                    "mps, privateuse1 or a registered backend name"
                )

    def decorate(fn: F) -> F:
        if not callable(fn):
            raise RoundTripConfigError("round_trip_dims(...) decorates a test method: put it above 'def test_...'")
        fn._tst_dims = {**getattr(fn, "_tst_dims", {}), **dims}  # type: ignore[attr-defined]
        return fn

    return decorate


def no_round_trip_dims(fn: F) -> F:
    """The test never loads: no load-mode and no engine dimension, one test per device class."""
    return round_trip_dims(load_modes=(), qengines=None)(fn)


def instantiate_round_trip_tests(generic_cls: type, scope: MutableMapping[str, Any]) -> list[type]:
    """Replace *generic_cls* in *scope* (usually ``globals()``) by one class per device type; the classes."""
    if not (
        isinstance(generic_cls, type)
        and issubclass(generic_cls, SerializationRoundTripTestCase)
        and issubclass(generic_cls, unittest.TestCase)
    ):
        raise RoundTripConfigError(
            f"{generic_cls!r} must subclass SerializationRoundTripTestCase and unittest.TestCase "
            "(class TestFoo(SerializationRoundTripTestCase, TestCase))"
        )
    modes = tuple(generic_cls.load_modes) if generic_cls.load_modes is not None else tuple(LoadMode)
    engines = validate_qengines(generic_cls.qengines)
    devices = resolve_devices(generic_cls.devices)
    tests, bases = _test_methods(generic_cls)
    if not tests:
        raise RoundTripConfigError(
            f"{generic_cls.__name__} has no test methods; define at least one 'def test_...(self, device)'"
        )
    for name, fn in tests.items():
        refuse_unhonoured(generic_cls.__name__, name, fn)
        dims = getattr(fn, "_tst_dims", {})
        fn_engines = dims.get("qengines", engines)
        if getattr(fn, "_tst_cross_engine", False) and (fn_engines is None or len(fn_engines) < 2):
            raise RoundTripConfigError(
                f"{generic_cls.__name__}.{name} is @cross_engine but "
                f"{'its round_trip_dims give' if 'qengines' in dims else 'the class declares'} "
                f"{len(fn_engines or ())} qengine(s); declare at least two"
            )
    module_name = scope.get("__name__", generic_cls.__module__)

    generated = []
    for device in devices:
        class_name = generic_cls.__name__ + class_suffix(device)
        if class_name in scope:
            raise RoundTripConfigError(
                f"{class_name} already exists in the module; rename {generic_cls.__name__} or the existing {class_name}"
            )
        # A subclass of the author's class (as pytorch's instantiate_device_type_tests makes): super(),
        # nested classes and class attributes work; the generic tests leave the generic class below.
        cls = type(
            class_name,
            (generic_cls,),
            {
                "device_type": device,
                "_tst_generic": generic_cls,
                "__module__": module_name,
                "__qualname__": class_name,
                "__doc__": generic_cls.__doc__,
            },
        )
        for method_name, method in _methods(generic_cls, cls, tests, modes, engines, device).items():
            setattr(cls, method_name, method)
        scope[class_name] = cls
        generated.append(cls)
    # The generic class stays in the module under its name, so what it holds resolves there (a nested
    # helper class pickles as ``getattr(TestFoo, 'Net')``), but with no test (each kept aside for
    # another instantiation, an inherited one masked by None), so no runner collects a generic test.
    generic_cls._tst_tests = tests  # type: ignore[attr-defined]
    for name in tests:
        if name in vars(generic_cls):
            delattr(generic_cls, name)  # as pytorch does
        if hasattr(generic_cls, name):  # still inherited from a base
            setattr(generic_cls, name, None)
    for klass in bases:  # a shared generic base in this module is generic too: never collected
        if scope.get(klass.__name__) is klass:
            del scope[klass.__name__]
    _GENERATED.setdefault(module_name, {})[generic_cls.__name__] = tuple(c.__name__ for c in generated)
    return generated


def _methods(
    generic_cls: type,
    cls: type,
    tests: dict[str, Callable[..., Any]],
    modes: tuple[LoadMode, ...],
    engines: Optional[tuple[str, ...]],
    device: str,
) -> dict[str, Callable[..., Any]]:
    """The generated test methods of device class *cls*: per test, case, the author's parametrizations
    (pytorch's ``parametrize_fn`` protocol) and ``@dtypes``; named ``test_<name>[_<params>][_<engine>]
    [_<load_mode>]_<device>[_to_cpu][_<dtype>]``."""
    methods: dict[str, Callable[..., Any]] = {}
    part = class_suffix(device).lower()
    for name, fn in tests.items():
        user = user_parametrize_fn(fn)
        for spec in specs(fn, modes, engines, device):
            case = case_test(fn, spec)
            variants = user(case, generic_cls, cls) if user is not None else [(case, "", {}, _no_decorators)]
            for test, suffix, kwargs, decorator_fn in variants:
                for dtype_kwargs in dtype_variants(fn, device):
                    params = {**kwargs, **dtype_kwargs}
                    decorated = test
                    for decorator in decorator_fn(params):
                        decorated = decorator(decorated)
                    method_name = spec.method_name(f"{name}_{suffix}" if suffix else name, part) + dtype_suffix(params)
                    if method_name in methods or (method_name not in tests and hasattr(generic_cls, method_name)):
                        raise RoundTripConfigError(
                            f"{generic_cls.__name__}.{name} generates {method_name}, which another test or "
                            "attribute of the class already names; rename one of them"
                        )
                    methods[method_name] = _bound(decorated, params, fn, cls.__name__, method_name)
    return methods


def _no_decorators(_kwargs: dict[str, Any]) -> list[Any]:
    return []


def _bound(
    test: Callable[..., Any], params: dict[str, Any], fn: Callable[..., Any], class_name: str, name: str
) -> Callable[..., Any]:
    def generated(self: Any) -> Any:
        return test(self, **params)

    generated.__name__, generated.__qualname__ = name, f"{class_name}.{name}"
    generated.__module__, generated.__doc__ = fn.__module__, fn.__doc__
    # pytest reports the author's def (``__wrapped__``, ``place_as``); unittest classes take no fixtures,
    # so its signature is harmless.  Never wrapped again.
    author = inspect.unwrap(fn)
    generated.__wrapped__ = author  # type: ignore[attr-defined]
    generated.place_as = author  # type: ignore[attr-defined]
    generated._tst_wrapped = True  # type: ignore[attr-defined]
    for attr in ("__unittest_skip__", "__unittest_skip_why__", "__unittest_expecting_failure__"):
        if hasattr(test, attr):
            setattr(generated, attr, getattr(test, attr))
    return generated


def _test_methods(generic_cls: type) -> tuple[dict[str, Callable[..., Any]], list[type]]:
    """The class's test methods, own and inherited (nearest wins), and the ``TestCase`` bases defining some."""
    tests: dict[str, Callable[..., Any]] = {}
    seen: set[str] = set()
    bases: list[type] = []
    for klass in generic_cls.__mro__:
        # a test framework's base class (unittest, expecttest, pytorch's common_utils) has no tests of ours
        framework = f"{klass.__module__}.".startswith(("unittest.", "expecttest.", "torch.testing._internal."))
        if framework or klass in (SerializationRoundTripTestCase, unittest.TestCase, object):
            continue
        own = False
        for name, value in {**vars(klass), **vars(klass).get("_tst_tests", {})}.items():
            if not name.startswith("test") or name in seen:
                continue
            seen.add(name)  # a subclass's "test_x = None" hides the base's test_x
            if callable(value):
                tests[name] = value
                own = True
        if own and klass is not generic_cls and issubclass(klass, unittest.TestCase):
            bases.append(klass)
    return tests, bases


def import_round_trip_tests(
    module: Union[str, types.ModuleType], scope: MutableMapping[str, Any], *generic_names: str
) -> list[type]:
    """Bind into *scope* (an aggregator's ``globals()``) the test classes *module* defines here: all of
    them, or those generated from *generic_names*; in module order.  Which generated classes exist
    depends on the machine and the device filters, so importing ``TestXCPU`` by name would turn a
    device filter into an ImportError taking the aggregator down."""
    if not isinstance(module, types.ModuleType):
        if not isinstance(module, str) or not module:
            raise RoundTripConfigError(
                f"import_round_trip_tests needs a module or its dotted name, got {module!r}; "
                'e.g. import_round_trip_tests("ao.sparsity.test_qlinear_packed_params", globals())'
            )
        module = importlib.import_module(module)  # a real ImportError (a typo, a broken file) propagates
    generated = _GENERATED.get(module.__name__, {})
    if generic_names:
        unknown = [g for g in generic_names if g not in generated]
        if unknown:
            raise RoundTripConfigError(
                f"{module.__name__} never passed {', '.join(unknown)} to instantiate_round_trip_tests "
                f"(instantiated there: {', '.join(sorted(generated)) or 'none'}); check the generic class name"
            )
        wanted = {name for g in generic_names for name in generated[g]}
        classes = [getattr(module, name) for name in wanted if hasattr(module, name)]
    else:
        classes = [
            obj
            for obj in vars(module).values()
            if inspect.isclass(obj)
            and issubclass(obj, unittest.TestCase)
            and obj.__module__ == module.__name__
            and "_tst_tests" not in vars(obj)  # an instantiated generic class: no tests of its own
        ]
        if not classes and not generated:
            raise RoundTripConfigError(
                f"{module.__name__} defines no unittest.TestCase class and instantiated no round-trip tests; "
                "is it the right module?"
            )
    order = list(vars(module))
    classes.sort(key=lambda c: order.index(c.__name__) if c.__name__ in order else len(order))
    for cls in classes:
        existing = scope.get(cls.__name__)
        if existing is not None and existing is not cls:
            raise RoundTripConfigError(
                f"{cls.__name__} from {module.__name__} would replace {existing!r} already in the aggregator; "
                "rename one of the test classes"
            )
    scope.update({cls.__name__: cls for cls in classes})
    return classes
