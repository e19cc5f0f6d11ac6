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

import functools
import importlib
import inspect
import itertools
import types
import unittest
from typing import Any, Callable, MutableMapping, Optional, TypeVar, Union

from ..core.errors import RoundTripConfigError, dimension
from ..core.modes import LoadMode
from ..torch_facts.devices import aliases, class_suffix, device_skip_reason, is_device_type, resolve_devices
from ..torch_facts.engines import (
    describe_engine_change,
    engine_state,
    override_qengine,
    qengine_skip_reason,
    validate_qengines,
)
from ..torch_facts.registry import safe_globals_context_missing
from .case import CaseSpec, SerializationRoundTripTestCase
from .checked_loads import ends_on_rejection

__all__ = [
    "instantiate_round_trip_tests",
    "cross_engine",
    "round_trip_dims",
    "no_round_trip_dims",
    "import_round_trip_tests",
]

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


def _specs(
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


def _runner(fn: Callable[..., Any]) -> Callable[..., Any]:
    takes_device = len(inspect.signature(fn).parameters) >= 2
    fn = ends_on_rejection(fn)  # methods inherited from a plain mixin were never wrapped

    def run_case(self: Any, spec: CaseSpec) -> Any:
        reason = _skip_reason(fn, spec)
        if reason:
            raise unittest.SkipTest(reason)
        self._tst_case = spec
        device = class_suffix(spec.device_type).lower() if spec.device_type == "privateuse1" else spec.device_type
        args = (device,) if takes_device else ()
        if not spec.save_qengine:
            return fn(self, *args)
        with override_qengine(spec.save_qengine, allocator=False):
            # As under pytorch's override_quantized_engine: the allocator as found (the body may install
            # pytorch's own).  The body must leave the engine and allocator as it got them, else that
            # is reported as leaked state (and restored).
            given = engine_state()
            try:
                return fn(self, *args)
            finally:
                self._tst_note_leaks(
                    [
                        f"{line}, set for this {spec.save_qengine} test"
                        for line in describe_engine_change(given, engine_state())
                    ]
                )

    # __wrapped__: pytest follows it to the author's def
    return functools.update_wrapper(run_case, fn, ("__module__", "__name__", "__qualname__", "__doc__"), ())


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
        dims = getattr(fn, "_tst_dims", {})
        fn_engines = dims.get("qengines", engines)
        if getattr(fn, "_tst_cross_engine", False) and (fn_engines is None or len(fn_engines) < 2):
            raise RoundTripConfigError(
                f"{generic_cls.__name__}.{name} is @cross_engine but "
                f"{'its round_trip_dims give' if 'qengines' in dims else 'the class declares'} "
                f"{len(fn_engines or ())} qengine(s); declare at least two"
            )
    module_name = scope.get("__name__", generic_cls.__module__)
    # The generated classes' base: the generic class minus its test methods, inherited ones masked
    # by None (no runner collects it).
    base_dict = {k: v for k, v in vars(generic_cls).items() if k not in tests and k not in ("__dict__", "__weakref__")}
    base_dict.update({name: None for name in tests if any(hasattr(b, name) for b in generic_cls.__bases__)})
    base = type(generic_cls.__name__, generic_cls.__bases__, base_dict)

    generated = []
    for device in devices:
        class_name = generic_cls.__name__ + class_suffix(device)
        if class_name in scope:
            raise RoundTripConfigError(
                f"{class_name} already exists in the module; rename {generic_cls.__name__} or the existing {class_name}"
            )
        methods: dict[str, Any] = {}
        part = class_suffix(device).lower()
        for name, fn in tests.items():
            specs = _specs(fn, modes, engines, device)
            for spec in specs:
                method_name = spec.method_name(name, part)
                if method_name in methods or method_name in base_dict:
                    raise RoundTripConfigError(
                        f"{generic_cls.__name__}.{name} generates {method_name}, which another test or "
                        "attribute of the class already names; rename one of them"
                    )
                methods[method_name] = None  # reserved; parameterized fills it in below
            parameterized.expand(
                [param(spec) for spec in specs],
                name_func=lambda f, num, p, part=part: p.args[0].method_name(f.__name__, part),
                doc_func=lambda f, num, p: f.__doc__,
                namespace=methods,
            )(_runner(fn))
        for method in methods.values():
            # parameterized drops __wrapped__ and points pytest at place_as: point both at the author's
            # def (unittest classes take no fixtures, so its signature is harmless); never wrap again.
            method.__wrapped__ = method.place_as
            method.place_as = inspect.unwrap(method.place_as)
            method._tst_wrapped = True
        cls = type(class_name, (base,), {**methods, "__module__": module_name, "__qualname__": class_name})
        scope[class_name] = cls
        generated.append(cls)
    for klass in (generic_cls, *bases):  # a shared generic base in this module is generic too: never collected
        if scope.get(klass.__name__) is klass:
            del scope[klass.__name__]
    _GENERATED.setdefault(module_name, {})[generic_cls.__name__] = tuple(c.__name__ for c in generated)
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
            if inspect.isclass(obj) and issubclass(obj, unittest.TestCase) and obj.__module__ == module.__name__
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
