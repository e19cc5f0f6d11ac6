"""Generate one test per load mode x quantized engine x device, pytorch style: ``TestFoo`` becomes ``TestFooCPU``,
... holding ``test_<name>_<qengine>_<load_mode>_<device>`` (``..._fbgemm_to_qnnpack_...`` for ``@cross_engine``,
``..._to_cpu`` twins off cpu).  Cases that cannot run here skip with the reason: ids are the same everywhere."""

from __future__ import annotations

import importlib
import inspect
import types
import unittest
from typing import Any, Callable, MutableMapping, TypeVar, Union

from .case import SerializationRoundTripTestCase
from .dimensions import class_suffix, is_device_type, resolve_devices, validate_qengines
from .errors import RoundTripConfigError, dimension
from .modes import LoadMode
from .variants import FRAMEWORKS, case_test, class_dims, dtype_suffix, dtype_variants, specs, user_parametrize_fn

_KEEP: Any = object()

#: Attributes pytorch's decorators set that only pytorch's device-type test bases act on: never dropped silently.
_ONLY_PYTORCH = {"precision_overrides": "@precisionOverride", "tolerance_overrides": "@toleranceOverride"}
_ONLY_PYTORCH["num_required_devices"] = "@deviceCountAtLeast"

_GENERATED: dict[str, dict[str, tuple[str, ...]]] = {}  # module -> generic class -> generated class names

F = TypeVar("F", bound=Callable[..., Any])


def cross_engine(fn: F) -> F:
    """Mark a test to run for every ordered pair of distinct declared engines (save, load)."""
    fn._tst_cross_engine = True  # type: ignore[attr-defined]
    return fn


def round_trip_dims(*, load_modes: Any = _KEEP, qengines: Any = _KEEP, devices: Any = _KEEP) -> Callable[[F], F]:
    """Narrow or drop this method's dimensions; an omitted one keeps the class's.  ``load_modes=()`` drops the
    load-mode dimension (a test that never loads), ``qengines=None`` the engine one; a tuple narrows (or adds)
    one.  ``devices=("cpu",)`` runs the method only there; elsewhere its tests skip saying so (``@onlyCPU``)."""
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
        if unknown := [d for d in dims["devices"] if not is_device_type(d)]:
            raise RoundTripConfigError(
                f"round_trip_dims: unknown device type {unknown[0]!r}; use cpu, cuda, xpu, "
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
    test_case = isinstance(generic_cls, type) and issubclass(generic_cls, unittest.TestCase)
    if not (test_case and issubclass(generic_cls, SerializationRoundTripTestCase)):
        raise RoundTripConfigError(
            f"{generic_cls!r} must subclass SerializationRoundTripTestCase and unittest.TestCase "
            "(class TestFoo(SerializationRoundTripTestCase, TestCase))"
        )
    name = generic_cls.__name__
    modes, engines = class_dims(generic_cls)
    devices = resolve_devices(generic_cls.devices)
    tests, bases = _test_methods(generic_cls)
    if not tests:
        raise RoundTripConfigError(f"{name} has no test methods; define at least one 'def test_...(self, device)'")
    for test_name, fn in tests.items():
        if unhonoured := [decorator for attr, decorator in _ONLY_PYTORCH.items() if hasattr(fn, attr)]:
            raise RoundTripConfigError(
                f"{name}.{test_name} is decorated with {unhonoured[0]}, which only pytorch's device-type test classes "
                "apply; instantiate_round_trip_tests cannot honour it.  Instantiate the class with "
                "torch.testing._internal.common_device_type.instantiate_device_type_tests instead (the "
                "load-mode and engine dimensions work there too), or drop the decorator."
            )
        dims = getattr(fn, "_tst_dims", {})
        fn_engines = dims.get("qengines", engines)
        if getattr(fn, "_tst_cross_engine", False) and (fn_engines is None or len(fn_engines) < 2):
            raise RoundTripConfigError(
                f"{name}.{test_name} is @cross_engine but "
                f"{'its round_trip_dims give' if 'qengines' in dims else 'the class declares'} "
                f"{len(fn_engines or ())} qengine(s); declare at least two"
            )
    module_name = scope.get("__name__", generic_cls.__module__)
    generated = []
    for device in devices:
        class_name = name + class_suffix(device)
        if class_name in scope:
            raise RoundTripConfigError(
                f"{class_name} already exists in the module; rename {name} or the existing {class_name}"
            )
        # a subclass of the author's class, as pytorch makes: super(), nested classes, class attributes work
        attrs = {"device_type": device, "_tst_generic": generic_cls, "__module__": module_name}
        cls = type(class_name, (generic_cls,), {**attrs, "__qualname__": class_name, "__doc__": generic_cls.__doc__})
        _add_methods(generic_cls, cls, tests, (modes, engines), device)
        scope[class_name] = cls
        generated.append(cls)
    # The generic class stays in the module, so a nested class resolves (pickled ``getattr(TestFoo, 'Net')``),
    # without tests (kept aside for another instantiation, inherited ones masked): no runner collects them.
    generic_cls._tst_tests = tests  # type: ignore[attr-defined]
    for test_name in tests:
        if test_name in vars(generic_cls):
            delattr(generic_cls, test_name)  # as pytorch does
        if hasattr(generic_cls, test_name):  # still inherited from a base
            setattr(generic_cls, test_name, None)
    for klass in bases:  # a shared generic base in this module is generic too: never collected
        if scope.get(klass.__name__) is klass:
            del scope[klass.__name__]
    _GENERATED.setdefault(module_name, {})[name] = tuple(c.__name__ for c in generated)
    return generated


def _add_methods(generic_cls: type, cls: type, tests: dict[str, Any], dims: tuple[Any, Any], device: str) -> None:
    """Give device class *cls* a method per test, case, author's parametrization (pytorch's ``parametrize_fn``)
    and ``@dtypes``: ``test_<name>[_<params>][_<engine>][_<load_mode>]_<device>[_to_cpu][_<dtype>]``."""
    part = class_suffix(device).lower()
    for name, fn in tests.items():
        user = user_parametrize_fn(fn)
        for spec in specs(fn, dims, device):
            for test, suffix, kwargs, decorator_fn in user(case_test(fn, spec), generic_cls, cls):
                for dtype_kwargs in dtype_variants(fn, device):
                    params = {**kwargs, **dtype_kwargs}
                    decorated = test
                    for decorator in decorator_fn(params):
                        decorated = decorator(decorated)
                    method_name = spec.method_name(f"{name}_{suffix}" if suffix else name, part) + dtype_suffix(params)
                    if method_name in vars(cls) or (method_name not in tests and hasattr(generic_cls, method_name)):
                        raise RoundTripConfigError(
                            f"{generic_cls.__name__}.{name} generates {method_name}, which another test or "
                            "attribute of the class already names; rename one of them"
                        )
                    setattr(cls, method_name, _bound(decorated, params, fn, cls.__name__, method_name))


def _bound(test: Callable[..., Any], params: dict[str, Any], fn: Callable[..., Any], owner: str, name: str) -> Any:
    def generated(self: Any) -> Any:
        return test(self, **params)

    generated.__name__, generated.__qualname__ = name, f"{owner}.{name}"
    generated.__module__, generated.__doc__ = fn.__module__, fn.__doc__
    # pytest reports the author's def (no fixtures in a unittest class); library frames stay in tracebacks:
    # ``__unittest`` would, behind pytorch's TestCase wrapper, cut the author's lines too.
    generated.__wrapped__ = generated.place_as = inspect.unwrap(fn)  # type: ignore[attr-defined]
    generated._tst_wrapped = True  # type: ignore[attr-defined]
    for attr in ("__unittest_skip__", "__unittest_skip_why__", "__unittest_expecting_failure__"):
        if hasattr(test, attr):
            setattr(generated, attr, getattr(test, attr))
    return generated


def _test_methods(generic_cls: type) -> tuple[dict[str, Callable[..., Any]], list[type]]:
    """The class's test methods, own and inherited (nearest wins), and the ``TestCase`` bases defining some."""
    found: dict[str, Any] = {}  # a subclass's "test_x = None" hides the base's test_x
    bases: list[type] = []
    for klass in generic_cls.__mro__:
        if f"{klass.__module__}.".startswith(FRAMEWORKS) or klass in (SerializationRoundTripTestCase, object):
            continue
        attrs = {**vars(klass), **vars(klass).get("_tst_tests", {})}
        own = {name: value for name, value in attrs.items() if name.startswith("test") and name not in found}
        found.update(own)
        if any(map(callable, own.values())) and klass is not generic_cls and issubclass(klass, unittest.TestCase):
            bases.append(klass)
    return {name: value for name, value in found.items() if callable(value)}, bases


def import_round_trip_tests(
    module: Union[str, types.ModuleType], scope: MutableMapping[str, Any], *generic_names: str
) -> list[type]:
    """Bind into *scope* (an aggregator's ``globals()``) *module*'s test classes, all or those generated from
    *generic_names*: which exist depends on the device filters, so importing ``TestXCPU`` by name may fail."""
    if not isinstance(module, types.ModuleType):
        if not isinstance(module, str) or not module:
            raise RoundTripConfigError(
                f"import_round_trip_tests needs a module or its dotted name, got {module!r}; "
                'e.g. import_round_trip_tests("ao.sparsity.test_qlinear_packed_params", globals())'
            )
        module = importlib.import_module(module)  # a real ImportError (a typo, a broken file) propagates
    generated = _GENERATED.get(module.__name__, {})
    if generic_names:
        if unknown := [g for g in generic_names if g not in generated]:
            raise RoundTripConfigError(
                f"{module.__name__} never passed {', '.join(unknown)} to instantiate_round_trip_tests "
                f"(instantiated there: {', '.join(sorted(generated)) or 'none'}); check the generic class name"
            )
        wanted = {name for g in generic_names for name in generated[g] if hasattr(module, name)}
        classes = [getattr(module, name) for name in wanted]
    else:
        test_cases = [c for c in vars(module).values() if inspect.isclass(c) and issubclass(c, unittest.TestCase)]
        # of this module, and not an instantiated generic class (no tests of its own)
        classes = [c for c in test_cases if c.__module__ == module.__name__ and "_tst_tests" not in vars(c)]
        if not classes and not generated:
            raise RoundTripConfigError(
                f"{module.__name__} defines no unittest.TestCase class and instantiated no round-trip tests; "
                "is it the right module?"
            )
    order = list(vars(module))
    classes.sort(key=lambda c: order.index(c.__name__) if c.__name__ in order else len(order))
    for cls in classes:
        if (existing := scope.get(cls.__name__)) is not None and existing is not cls:
            raise RoundTripConfigError(
                f"{cls.__name__} from {module.__name__} would replace {existing!r} already in the aggregator; "
                "rename one of the test classes"
            )
    scope.update({cls.__name__: cls for cls in classes})
    return classes
