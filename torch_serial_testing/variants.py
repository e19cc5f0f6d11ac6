"""A generated test's coordinates, and the test name pytorch's conventions give them."""

from __future__ import annotations

import contextlib
import functools
import inspect
import itertools
import sys
import types
import unittest
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, Optional

from .dimensions import aliases, class_suffix, device_skip_reason, torch_device_type
from .dimensions import describe_engine_change, engine_state, override_qengine, qengine_skip_reason, validate_qengines
from .errors import RoundTripConfigError
from .modes import LoadMode
from .outcomes import ends_on_rejection
from .registry import safe_globals_context_missing

#: Module prefixes of test frameworks; with this library's own (however vendored), never the author's.
FRAMEWORKS = ("unittest.", "expecttest.", "torch.testing._internal.")
_NOT_THE_AUTHORS = (*FRAMEWORKS, f"{__package__}.")

Variant = tuple[Callable[..., Any], str, dict[str, Any], Callable[[dict[str, Any]], list[Any]]]
Variants = Callable[..., Iterable[Variant]]  # pytorch's parametrize_fn(test, generic_cls, device_cls)


@dataclass(frozen=True)
class CaseSpec:
    """One generated test's coordinates: load mode, engines (save, load), device, and where it loads to."""

    mode: Optional[LoadMode]  # None: the method dropped the load-mode dimension
    device_type: str
    save_qengine: Optional[str] = None
    load_qengine: Optional[str] = None
    to_cpu: bool = False

    @property
    def variant(self) -> str:
        """The name part between a test's name and its device: ``[<engine>[_to_<engine>]][_<load mode>]``."""
        save, load = self.save_qengine, self.load_qengine
        engines = (save if save == load else f"{save}_to_{load}") if save else None
        return "_".join(p for p in (engines, self.mode.value if self.mode else None) if p)

    def method_name(self, base: str, device_part: str) -> str:
        return "_".join(p for p in (base, self.variant, device_part, "to_cpu" if self.to_cpu else None) if p)

    @property
    def map_location(self) -> Optional[str]:
        return "cpu" if self.to_cpu else None if self.device_type == "cpu" else torch_device_type(self.device_type)


def class_dims(cls: Any) -> tuple[tuple[LoadMode, ...], Optional[tuple[str, ...]]]:
    modes = getattr(cls, "load_modes", None)
    return (tuple(modes) if modes is not None else tuple(LoadMode)), validate_qengines(getattr(cls, "qengines", None))


def specs(fn: Callable[..., Any], declared: tuple[Any, Any], device: str) -> list[CaseSpec]:
    """*fn*'s cases on *device*: the class's *declared* (modes, engines) as its round_trip_dims change them."""
    dims = getattr(fn, "_tst_dims", {})
    modes, engines = dims.get("load_modes", declared[0]), dims.get("qengines", declared[1])
    if engines is None:
        pairs: list[tuple[Optional[str], Optional[str]]] = [(None, None)]
    elif getattr(fn, "_tst_cross_engine", False):
        pairs = list(itertools.permutations(engines, 2))
    else:
        pairs = [(e, e) for e in engines]
    targets = [False] if device == "cpu" or not modes else [False, True]  # the to_cpu twin only for tests that load
    cases = itertools.product(pairs, modes or (None,), targets)
    return [CaseSpec(mode, device, save, load, to_cpu) for (save, load), mode, to_cpu in cases]


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
    """*fn* run as the case *spec*: skipped with the reason if it cannot run here, else under its engine,
    given the case's device where nobody passed one (a ``device`` keyword, or a second parameter)."""
    params = list(inspect.signature(fn).parameters)[1:]
    positional_device = bool(params) and "device" not in params
    fn = ends_on_rejection(fn)  # methods inherited from a plain mixin were never wrapped

    def run_case(self: Any, *args: Any, **kwargs: Any) -> Any:
        if reason := _skip_reason(fn, spec):
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
            # as under pytorch's override_quantized_engine, the allocator as found; what the body changes leaks
            given = engine_state()
            try:
                return fn(self, *args, **kwargs)
            finally:
                changes = describe_engine_change(given, engine_state())  # reported with the final restore's
                noted = self.__dict__.setdefault("_tst_noted_leaks", [])
                noted.extend(f"{line}, set for this {spec.save_qengine} test" for line in changes)

    functools.update_wrapper(run_case, fn, updated=())  # its __wrapped__: signature and location of the author's def
    return run_case


def _unparametrized(test: Callable[..., Any], generic_cls: Any, device_cls: Any) -> list[Variant]:
    return [(test, "", {}, lambda _kwargs: [])]


def user_parametrize_fn(fn: Callable[..., Any]) -> Variants:
    """The author's own ``parametrize_fn`` (``@parametrize``, ``@swap``, ...), without the library's."""
    found = getattr(fn, "__dict__", {}).get("_tst_user_parametrize_fn", getattr(fn, "parametrize_fn", None))
    return found if callable(found) else _unparametrized


def _parametrize_fn(test: Any, generic_cls: Any, device_cls: Any) -> Iterator[Variant]:
    """pytorch's ``parametrize_fn`` protocol: a variant ``<engine>_<load_mode>[_to_cpu]`` per case of the library's
    dimensions, each parametrized further by the author's own ``parametrize_fn`` (``<theirs>_<ours>``)."""
    declared = class_dims(generic_cls if generic_cls is not None else device_cls)
    if generic_cls is not None and getattr(device_cls, "_tst_generic", None) is not generic_cls:
        keep_reachable(generic_cls)  # pytorch's instantiation removed it from its module
    device = getattr(device_cls, "device_type", None)
    user = user_parametrize_fn(test)
    for spec in specs(test, declared, device if isinstance(device, str) else "cpu"):
        name = spec.variant + ("_to_cpu" if spec.to_cpu else "")
        for test_out, name_out, kwargs, decorate in user(case_test(test, spec), generic_cls, device_cls):
            yield test_out, "_".join(n for n in (name_out, name) if n), kwargs, decorate


def with_dims(fn: Any) -> Any:
    """*fn* with the library's dimensions as a ``parametrize_fn``, for ``instantiate_device_type_tests``."""
    if "_tst_user_parametrize_fn" not in fn.__dict__:
        fn._tst_user_parametrize_fn = getattr(fn, "parametrize_fn", None)
        fn.parametrize_fn = _parametrize_fn
    return fn


def dtype_variants(fn: Callable[..., Any], device: str) -> list[dict[str, Any]]:
    """pytorch's ``@dtypes`` table: ``{'dtype': d}`` (or ``{'dtypes': (...)}``) per dtype for *device*."""
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
    """The name part after the device for a ``dtype``/``dtypes`` argument: ``_float32``, ``_float32_int64``."""
    given = params.get("dtypes", params.get("dtype"))
    listed = () if given is None else given if isinstance(given, (list, tuple)) else (given,)
    return "".join(f"_{str(d).split('.')[-1]}" for d in listed)


def author_class(cls: type, attribute: str) -> str:
    """The author's class declaring *attribute* (else the nearest): where a fix is pasted, never ``TestFooCPU``."""

    def generated(k: type) -> bool:  # by this library, or pytorch's ``(CPUTestBase, TestFoo)``
        by_pytorch = len(k.__bases__) > 1 and f"{k.__bases__[0].__module__}.".startswith("torch.testing._internal.")
        return "_tst_generic" in vars(k) or by_pytorch

    authors = [k for k in cls.__mro__[:-1] if not generated(k) and not f"{k.__module__}.".startswith(_NOT_THE_AUTHORS)]
    return next((k for k in authors if attribute in vars(k)), authors[0] if authors else cls).__name__


def _missing_holder(cls: Any, members: Iterable[Any]) -> Optional[types.ModuleType]:
    """The module a top-level *cls* is missing from if a class among *members* is nested in it (pickled through it)."""
    module = sys.modules.get(getattr(cls, "__module__", ""))
    if module is None or not isinstance(cls, type) or "." in cls.__qualname__ or cls.__name__ in vars(module):
        return None
    prefix, name = f"{cls.__qualname__}.", cls.__module__
    nested = any(isinstance(m, type) and m.__module__ == name and m.__qualname__.startswith(prefix) for m in members)
    return module if nested else None


@contextlib.contextmanager
def resolvable(cls: type, declared: Iterable[Any]) -> Iterator[None]:
    """*cls* bound in its module while its declaration of a class nested in it resolves (``module.TestX.Net``)."""
    listed = () if isinstance(declared, (str, bytes)) or not hasattr(declared, "__iter__") else declared
    module = _missing_holder(cls, listed)
    if module is not None:
        setattr(module, cls.__name__, cls)
    try:
        yield
    finally:
        if module is not None and vars(module).get(cls.__name__) is cls:
            delattr(module, cls.__name__)


def keep_reachable(generic_cls: Any) -> None:
    """Put back the generic class pytorch's instantiation removed if it holds nested classes (pickled through
    it) and no tests (pytorch strips its own; inherited ones would run generic)."""
    module = _missing_holder(generic_cls, getattr(generic_cls, "__dict__", {}).values())
    if module is not None and not any(
        n.startswith("test") and callable(v)
        for base in generic_cls.__mro__[1:]
        if not f"{base.__module__}.".startswith(_NOT_THE_AUTHORS)
        for n, v in vars(base).items()
    ):
        setattr(module, generic_cls.__name__, generic_cls)
