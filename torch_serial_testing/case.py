"""The ``SerializationRoundTripTestCase`` mixin: a test's declarations, coordinates and round trips."""

from __future__ import annotations

import contextlib
import os
import sys
import warnings
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Iterator, Optional, Sequence, Union

import torch

from .declarations import Declaration, as_safe_globals, normalize_safe_globals
from .dimensions import override_qengine, qnnpack_allocator, validate_qengines
from .errors import LeakedGlobalStateError, RoundTripConfigError, dimension
from .isolation import GlobalState, start_ignoring, stop_ignoring
from .modes import LoadMode
from .outcomes import MISSING, OPEN_SUBTESTS_ATTRIBUTE, ExpectedRejection, ends_on_rejection, load_in_test
from .outcomes import report, save
from .variants import CaseSpec, author_class, resolvable, with_dims

if TYPE_CHECKING:
    from .checkpoint import Checkpoint

_Mode = Optional[Union[LoadMode, str]]
_Globals = Optional[Sequence[Any]]


def _stable_names(names: Sequence[str], expect: str) -> list[str]:
    """*names* with a script's ``__main__.X`` as pinned in *expect*, else as its shortest importable name."""
    if not any(n.startswith("__main__.") for n in names):
        return list(names)
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if not path:
        return sorted(names)
    spec_name = getattr(getattr(main, "__spec__", None), "name", None)
    path = os.path.splitext(os.path.abspath(path))[0]
    roots = (os.path.abspath(entry or os.getcwd()) + os.sep for entry in sys.path)
    dotted = [path[len(root) :].replace(os.sep, ".") for root in roots if path.startswith(root)]
    by_spec = [spec_name] if spec_name and spec_name != "__main__" else []
    candidates = dict.fromkeys([*by_spec, *dotted, os.path.basename(path)])  # best first
    pinned = set(expect.splitlines())

    def stable(name: str) -> str:
        options = [f"{module}.{name[len('__main__.') :]}" for module in candidates]
        return next((o for o in options if o in pinned), None) or min(options, key=len)

    return sorted(stable(n) if n.startswith("__main__.") else n for n in names)


def _coordinate(field: str, default: Any = None, doc: Optional[str] = None) -> Any:
    return property(lambda self: (getattr(self._tst_case, field) if self._tst_case else None) or default, doc=doc)


class SerializationRoundTripTestCase:
    """Mixin for ``unittest.TestCase`` (or expecttest / pytorch's ``TestCase``) round-trip tests."""

    #: Globals the full-module checkpoint legitimately needs (objects, 'module.Name' or (obj, name)).
    safe_globals: ClassVar[Sequence[Any]] = ()
    #: Globals a ``state_dict()`` checkpoint needs (usually none).
    state_dict_safe_globals: ClassVar[Sequence[Any]] = ()
    #: Declared globals the checkpoint does not need fail the test unless this is True.
    allow_unneeded_safe_globals: ClassVar[bool] = False
    #: Leaked global state fails the test (True) or only warns (False); it is restored either way.
    fail_on_leaked_state: ClassVar[bool] = True
    #: Message regexes of warnings this class's tests provoke on purpose; ignored during its tests only.
    ignore_warnings: ClassVar[Sequence[str]] = ()
    #: Load modes to generate tests for (None: all three), e.g. ``("default",)``.
    load_modes: ClassVar[Optional[Sequence[Any]]] = None
    qengines: ClassVar[Optional[Sequence[str]]] = None  #: Quantized engines (None: no engine dimension).
    devices: ClassVar[Optional[Sequence[str]]] = None  #: Device types (None: the available ones).

    _tst_case: ClassVar[Optional[CaseSpec]] = None
    _tst_in_flight: Optional[ExpectedRejection] = None  # raised by a load, not yet caught by the library

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)  # bad declarations fail here, at class creation, not mid-run
        for attribute in ("safe_globals", "state_dict_safe_globals"):
            declared = getattr(cls, attribute)
            if getattr(cls, f"_tst_{attribute}_source", None) is not declared:  # else judged for a base already
                with resolvable(cls, declared):
                    setattr(cls, f"_tst_{attribute}", normalize_safe_globals(declared, f"{cls.__name__}.{attribute}"))
                setattr(cls, f"_tst_{attribute}_source", declared)
        if isinstance(cls.ignore_warnings, (str, bytes)):
            raise RoundTripConfigError(
                f"{cls.__name__}.ignore_warnings must be a tuple of message regexes, e.g. (r'TypedStorage',)"
            )
        if cls.load_modes is not None:
            modes = dimension("load_modes", cls.load_modes, "('default',)")
            cls.load_modes = dimension("load_modes", tuple(LoadMode.parse(m) for m in modes), "('default',)")
        validate_qengines(cls.qengines)
        if (make := cls.__dict__.get("make_module")) is not None and not callable(make):
            raise RoundTripConfigError(f"{cls.__name__}.make_module must be a method returning a torch.nn.Module")
        for name, value in list(cls.__dict__.items()):
            if name.startswith("test") and callable(value):
                setattr(cls, name, with_dims(ends_on_rejection(value)))

    def setUp(self) -> None:
        getattr(super(), "setUp", lambda: None)()
        self.round_trip_outcomes: list[str] = []
        self.addCleanup(self._restore_global_state, GlobalState.capture())  # type: ignore[attr-defined]
        if self.ignore_warnings:
            self.addCleanup(stop_ignoring, start_ignoring(self.ignore_warnings))  # type: ignore[attr-defined]

    def _restore_global_state(self, state: GlobalState) -> None:
        if state.restored:
            return
        leaks = [*self.__dict__.pop("_tst_noted_leaks", []), *state.restore()]  # noted: engine state, by variants
        if state.kept_at_import:  # torch's own registrations are not news
            self._tst_say("kept safe globals registered at import time: " + ", ".join(state.kept_at_import))
        if not leaks:
            return
        message = f"{self.id()} leaked global state (now restored): " + "; ".join(leaks)  # type: ignore[attr-defined]
        if self.fail_on_leaked_state:
            raise LeakedGlobalStateError(message)
        warnings.warn(message, RuntimeWarning, stacklevel=1)

    def _tst_say(self, text: str) -> None:
        """A line in unittest's verbose output (where the round-trip outcomes go)."""
        test_result = getattr(getattr(self, "_outcome", None), "result", None)
        if test_result is not None and getattr(test_result, "showAll", False) and hasattr(test_result, "stream"):
            test_result.stream.write(text + " ... ")
            test_result.stream.flush()

    @contextlib.contextmanager
    def subTest(self, msg: Any = MISSING, **params: Any) -> Iterator[None]:  # noqa: N802 - unittest API
        """``unittest`` subTest that an expected rejection ends as a pass (a closed generator's exit passes through)."""
        args = () if msg is MISSING else (msg,)
        closing: Optional[GeneratorExit] = None
        open_subtests = self.__dict__.setdefault(OPEN_SUBTESTS_ATTRIBUTE, [])  # for results without subTests
        open_subtests.append((msg, params))
        try:
            with super().subTest(*args, **params):  # type: ignore[misc]
                try:
                    yield
                except ExpectedRejection:
                    self._tst_in_flight = None
                except GeneratorExit as exit_:
                    closing = exit_
        finally:
            open_subtests.pop()
        if closing is not None:
            in_flight = self._tst_in_flight
            if in_flight is not None and in_flight.abandoned_subtest is None:  # a rejection unwinds its caller
                in_flight.abandoned_subtest = ", ".join([*map(repr, args), *(f"{k}={v!r}" for k, v in params.items())])
            raise closing

    # This generated test's coordinates; outside instantiation no mode and no engine, on cpu.
    load_mode = _coordinate("mode")
    qengine = _coordinate("save_qengine", doc="The engine the module is built and saved under.")
    load_qengine = _coordinate("load_qengine", doc="The engine loads run under (differs only in cross-engine tests).")
    device_type = _coordinate("device_type", "cpu")
    load_device = _coordinate("map_location", "cpu", "Where loads put tensors: the device, or cpu in a _to_cpu twin.")

    def loading_engine(self) -> contextlib.AbstractContextManager[None]:
        """Context for post-load checks that must run under the load engine (the allocator as found)."""
        engine = self.load_qengine
        return contextlib.nullcontext() if engine in (None, self.qengine) else override_qengine(engine, allocator=False)

    def make_module(self) -> Any:
        """Override: return the ``torch.nn.Module`` this class round-trips."""
        raise NotImplementedError(
            f"{type(self).__name__} must define make_module(self) returning the module to round-trip"
        )

    def build_module(self, factory: Optional[Callable[[], Any]] = None) -> Any:
        """Call *factory* (default :meth:`make_module`) and check it returned a module."""
        factory = factory or self.make_module
        module = factory()
        if not isinstance(module, torch.nn.Module):
            raise RoundTripConfigError(
                f"{getattr(factory, '__qualname__', factory)} returned "
                f"{type(module).__name__}, not a torch.nn.Module; return the module instance"
            )
        return module

    def _declared(self, given: _Globals, method: str, attribute: str = "safe_globals") -> Declaration:
        """The globals a load trusts: the class's *attribute*, or *given* to *method*."""
        owner = author_class(type(self), attribute)  # never a generated TestFooCPU
        if given is None:
            return Declaration(owner, attribute, method, getattr(self, f"_tst_{attribute}"))
        return Declaration(owner, None, method, as_safe_globals(given, "safe_globals="))

    def round_trip(
        self, obj: Any, *, mode: _Mode = None, safe_globals: _Globals = None, map_location: Any = MISSING
    ) -> Any:
        """Save *obj* and load it back in this test's mode (or *mode*) under the class's ``safe_globals`` unless
        given (``()`` for a plain dict); the loaded object.  A load torch should reject ends the test as a pass."""
        return load_in_test(self, save(obj), mode, self._declared(safe_globals, "round_trip"), map_location, obj)

    def round_trip_each_mode(self, obj: Any, check: Any = None, *, safe_globals: Any = None) -> dict[LoadMode, Any]:
        """Save *obj* once, load it in each of the class's modes (a ``subTest`` each: a rejection ends only its
        mode's), ``check(loaded, mode)``: one build per case, in a ``round_trip_dims(load_modes=())`` test."""
        checkpoint, declared = save(obj), self._declared(safe_globals, "round_trip_each_mode")
        if self.load_mode is not None:
            raise RoundTripConfigError(
                f"round_trip_each_mode loads in every load mode itself, but {self.id()} is generated per load "  # type: ignore[attr-defined]
                f"mode ({self.load_mode.value}): every mode would be loaded once per mode.  Decorate the test with "
                "@round_trip_dims(load_modes=()) (it keeps its engine and device dimensions)"
            )
        loaded: dict[LoadMode, Any] = {}
        for mode in type(self).load_modes or tuple(LoadMode):  # a declared dimension is never empty
            with self.subTest(load_mode=mode.value):
                loaded[mode] = value = load_in_test(self, checkpoint, mode, declared, MISSING, obj)
                if check is not None:
                    check(value, mode)
        return loaded

    def round_trip_state_dict(
        self,
        module: Any = None,
        *,
        mode: _Mode = None,
        factory: Optional[Callable[[], Any]] = None,
        safe_globals: _Globals = None,
        strict: bool = True,
        return_state: bool = False,
    ) -> Any:
        """Round-trip ``module.state_dict()`` into a fresh module from *factory* (``state_dict_safe_globals``
        unless *safe_globals* is given); the module, or with *return_state* ``(module, loaded state_dict)``."""
        module = self.build_module(factory) if module is None else module
        declared = self._declared(safe_globals, "round_trip_state_dict", "state_dict_safe_globals")
        state_dict = module.state_dict()
        state = load_in_test(self, save(state_dict), mode, declared, MISSING, state_dict)
        with self.loading_engine():
            fresh = self.build_module(factory)
            fresh.load_state_dict(state, strict=strict)
        return (fresh, state) if return_state else fresh

    def round_trip_file(
        self,
        obj: Any,
        *,
        mode: _Mode = None,
        safe_globals: _Globals = None,
        map_location: Any = MISSING,
        mmap: bool = False,
        **load_kwargs: Any,
    ) -> Any:
        """As :meth:`round_trip`, through a temporary file read by ``torch.load(path, mmap=mmap, **load_kwargs)``
        (``loading.LOAD_KWARGS``; pickle_load_args such as ``encoding`` are refused: weights-only loads ignore them)."""
        extra = {"mmap": True, **load_kwargs} if mmap else dict(load_kwargs)
        declared = self._declared(safe_globals, "round_trip_file")
        return load_in_test(self, save(obj), mode, declared, map_location, obj, extra)

    def round_trip_pickle(self, obj: Any, *, protocol: Optional[int] = None) -> Any:
        """``pickle.loads(pickle.dumps(obj, protocol))``, asserted to do what torch does (a tensor's pickle loads
        with ``torch.load(weights_only=False)``, which ``TORCH_FORCE_*`` reaches); no mode of its own."""
        from .loading import pickle_round_trip

        with self.loading_engine(), qnnpack_allocator(self.load_qengine):
            result = pickle_round_trip(obj, protocol)
        report(self, "pickle.loads", None, True, result.weights_only, result.summary)
        return result.value

    def save_checkpoint(self, obj: Any) -> Checkpoint:
        """``torch.save`` *obj* into memory; the result may later be loaded in any mode."""
        return save(obj)

    def load_checkpoint(
        self, checkpoint: Checkpoint, *, mode: _Mode = None, safe_globals: _Globals = None, map_location: Any = MISSING
    ) -> Any:
        """Load *checkpoint* in a mode under this test's load engine, asserting the predicted outcome."""
        declared = self._declared(safe_globals, "load_checkpoint")
        return load_in_test(self, checkpoint, mode, declared, map_location, MISSING)

    def assertRoundTripEqual(self, expected: Any, actual: Any, **checks: Any) -> None:  # noqa: N802 - unittest naming
        """Deep comparison, exact by default, naming the first difference's path; the keywords (``rtol``, ``atol``,
        ``allow_subclasses``, ``check_*``) are those of :func:`assert_round_trip_equal`."""
        from .comparison import assert_round_trip_equal

        assert_round_trip_equal(expected, actual, **checks)

    def required_globals(self, obj_or_buffer: Any) -> list[str]:
        """Globals the checkpoint of *obj_or_buffer* needs beyond torch's allowlist."""
        from .prediction import required_globals

        return required_globals(obj_or_buffer)

    def assertRequiredGlobalsExpectedInline(self, obj_or_buffer: Any, expect: str, skip: int = 0) -> None:  # noqa: N802
        """Pin the required globals, one per line, as an expecttest golden record that is the same however the
        file is run; ``EXPECTTEST_ACCEPT=1`` rewrites it.  Start one as an empty triple-quoted string (expecttest
        rewrites only those); it also pins "none needed" (as do ``""`` and one empty line)."""
        from expecttest import assert_expected_inline

        names = _stable_names(self.required_globals(obj_or_buffer), expect)
        actual = "".join(f"{name}\n" for name in names) or ("\n" if expect == "\n" else "")  # none: as recorded
        test: Any = self  # a mixin of a TestCase
        assert_expected_inline(actual, expect, skip=skip + 1, assert_eq=test.assertMultiLineEqual, debug_id=test.id())
