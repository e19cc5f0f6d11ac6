"""The ``SerializationRoundTripTestCase`` mixin: thin wiring of the other modules.

A test class declares how to build its module (``make_module``), the globals it
legitimately needs (``safe_globals``) and, for instantiation, its dimensions
(``load_modes``, ``qengines``, ``devices``).  Each test calls
:meth:`~SerializationRoundTripTestCase.round_trip`, which saves to memory,
loads in the test's mode and asserts what torch should do here.  When torch
should reject the load, the test ends there as a pass and says so
("default: rejected as expected (...)") in verbose output.
"""

from __future__ import annotations

import contextlib
import functools
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Iterator, Optional, Sequence

from ..core.errors import LeakedGlobalStateError, RoundTripConfigError, dimension
from ..core.interrupts import deferred_interrupts, run_all
from ..core.modes import LoadMode
from ..core.names import qualified_name, show_name
from ..policy.declared import SafeGlobal, normalize_safe_globals
from ..torch_facts.engines import override_qengine, validate_qengines
from .casespec import CaseSpec
from .checked_loads import MISSING, REPORT_ENV, declared_argument, load_in_test, save
from .declarations import Declaration, refuse_local
from .golden import stable_names
from .ignored_warnings import start_ignoring, stop_ignoring
from .isolation import GlobalState
from .outcomes import ExpectedRejection, not_instantiated, rejection_outside_subtest, required_args

if TYPE_CHECKING:
    from ..scan.checkpoint import Checkpoint

__all__ = ["SerializationRoundTripTestCase", "ExpectedRejection", "CaseSpec", "REPORT_ENV"]


def ends_on_rejection(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap a test method so an expected rejection ends it as a pass.

    Also turns the runner calling a generic test directly (the class was never
    instantiated) into a message that says how to instantiate it.
    """
    if getattr(fn, "_tst_wrapped", False):
        return fn

    @functools.wraps(fn)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        if self._tst_case is None and not args and not kwargs:
            params = required_args(fn)
            if params:
                raise not_instantiated(type(self), fn.__name__, params)
        try:
            return fn(self, *args, **kwargs)
        except ExpectedRejection as rejection:
            self._tst_in_flight = None
            if rejection.abandoned_subtest is not None:
                raise rejection_outside_subtest(rejection.abandoned_subtest, rejection) from None
            return None

    wrapper._tst_wrapped = True  # type: ignore[attr-defined]
    return wrapper


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
    #: Message regexes of warnings this class's tests provoke on purpose (e.g. quantized tensor
    #: creation); ignored during each test only, so other warnings still show.
    ignore_warnings: ClassVar[Sequence[str]] = ()
    #: Instantiation dimensions: None means all modes / no engine dimension / available devices.
    load_modes: ClassVar[Optional[Sequence[Any]]] = None
    qengines: ClassVar[Optional[Sequence[str]]] = None
    devices: ClassVar[Optional[Sequence[str]]] = None

    _tst_safe_globals: ClassVar[tuple[SafeGlobal, ...]] = ()
    _tst_state_dict_safe_globals: ClassVar[tuple[SafeGlobal, ...]] = ()
    _tst_case: ClassVar[Optional[CaseSpec]] = None
    _tst_in_flight: Optional[ExpectedRejection] = None  # raised by a load, not yet caught by the library

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # Bad declarations fail here, at class creation, not in the middle of a run.
        refuse_local(cls.safe_globals, f"{cls.__name__}.safe_globals")
        refuse_local(cls.state_dict_safe_globals, f"{cls.__name__}.state_dict_safe_globals")
        cls._tst_safe_globals = normalize_safe_globals(cls.safe_globals)
        cls._tst_state_dict_safe_globals = normalize_safe_globals(cls.state_dict_safe_globals)
        if isinstance(cls.ignore_warnings, (str, bytes)):
            raise RoundTripConfigError(
                f"{cls.__name__}.ignore_warnings must be a tuple of message regexes, e.g. (r'TypedStorage',)"
            )
        if cls.load_modes is not None:
            modes = dimension("load_modes", cls.load_modes, "('default',)")
            cls.load_modes = dimension("load_modes", tuple(LoadMode.parse(m) for m in modes), "('default',)")
        validate_qengines(cls.qengines)
        make = cls.__dict__.get("make_module")
        if make is not None and not callable(make):
            raise RoundTripConfigError(f"{cls.__name__}.make_module must be a method returning a torch.nn.Module")
        for name, value in list(cls.__dict__.items()):
            if name.startswith("test") and callable(value):
                setattr(cls, name, ends_on_rejection(value))

    # -- per-test state ---------------------------------------------------------------

    def setUp(self) -> None:
        parent = getattr(super(), "setUp", None)
        if parent is not None:
            parent()
        self.round_trip_outcomes: list[str] = []
        with deferred_interrupts():  # the snapshot is kept where run()'s finally finds it
            state = GlobalState.capture()
            self._tst_state = state
        self.addCleanup(self._restore_global_state, state)  # type: ignore[attr-defined]
        dangerous = state.dangerous_registrations()
        if dangerous:
            raise RoundTripConfigError(
                "torch's process-wide safe-globals registry holds dangerous entries, registered before "
                "this test (e.g. by a module imported at collection time), so every weights-only load in "
                "this process would accept them: " + "; ".join(dangerous) + ". Remove that add_safe_globals call."
            )

        if self.ignore_warnings:
            self._tst_ignoring = start_ignoring(self.ignore_warnings)
            self.addCleanup(self._tst_unquiet)  # type: ignore[attr-defined]

    def _tst_unquiet(self) -> None:
        token = self.__dict__.pop("_tst_ignoring", None)
        if token is not None:
            stop_ignoring(token)

    def run(self, result: Any = None) -> Any:
        """unittest's run, plus a restore in ``finally``: cleanups never run after KeyboardInterrupt."""
        try:
            return super().run(result)  # type: ignore[misc]
        finally:
            state = self.__dict__.get("_tst_state")
            if state is not None and not state.restored:
                # Cleanups did not run (an interrupt): restore, report nothing, let it propagate.
                run_all([state.restore, self._tst_unquiet])
            self.__dict__.pop("_tst_state", None)
            self.__dict__.pop("_tst_noted_leaks", None)

    def _tst_note_leaks(self, leaks: Sequence[str]) -> None:
        """Leaks found before the final restore (engine state at the end of an engine test's body)."""
        self.__dict__.setdefault("_tst_noted_leaks", []).extend(leaks)

    def _restore_global_state(self, state: GlobalState) -> None:
        if state.restored:
            return
        leaks = [*self.__dict__.pop("_tst_noted_leaks", []), *state.restore()]
        imports = state.import_registrations
        if imports.kept:
            self._tst_say("kept safe globals registered at import time: "
                          + ", ".join(sorted(qualified_name(g) for g in imports.kept)))
        if imports.refused:
            # Never registered; always a failure (the imported module does not get what it asked for).
            raise LeakedGlobalStateError(
                f"{self.id()}: refused safe globals registered by modules imported during the test: "  # type: ignore[attr-defined]
                + "; ".join(f"{show_name(name)}: {why} (add_safe_globals in {mod})" for name, mod, why in imports.refused)
                + (" -- also leaked: " + "; ".join(leaks) if leaks else "")
            )
        if not leaks:
            return
        message = f"{self.id()} leaked global state (now restored): " + "; ".join(leaks)  # type: ignore[attr-defined]
        if self.fail_on_leaked_state:
            raise LeakedGlobalStateError(message)
        import warnings

        warnings.warn(message, RuntimeWarning, stacklevel=1)

    def _tst_say(self, text: str) -> None:
        """A line in unittest's verbose output (where the round-trip outcomes go)."""
        test_result = getattr(getattr(self, "_outcome", None), "result", None)
        if getattr(test_result, "showAll", False) and hasattr(test_result, "stream"):
            test_result.stream.write(text + " ... ")
            test_result.stream.flush()

    @contextlib.contextmanager
    def subTest(self, msg: Any = MISSING, **params: Any) -> Iterator[None]:  # noqa: N802 - unittest API
        """``unittest`` subTest in which an expected rejection ends only that subtest, as a pass.

        When the block yields (a generator) and the generator is closed, the ``GeneratorExit``
        passes through instead of being recorded as the subtest's error.
        """
        args = () if msg is MISSING else (msg,)
        closing: Optional[GeneratorExit] = None
        with super().subTest(*args, **params):  # type: ignore[misc]
            try:
                yield
            except ExpectedRejection:
                self._tst_in_flight = None
            except GeneratorExit as exit_:
                closing = exit_
        if closing is not None:
            in_flight = self._tst_in_flight
            if in_flight is not None and in_flight.abandoned_subtest is None:
                # closed because a rejection is unwinding the code that iterated this generator
                label = ", ".join([repr(msg)] * bool(args) + [f"{k}={v!r}" for k, v in params.items()])
                in_flight.abandoned_subtest = label
            raise closing

    @property
    def load_mode(self) -> Optional[LoadMode]:
        """This generated test's load mode (None outside instantiation)."""
        return self._tst_case.mode if self._tst_case else None

    @property
    def qengine(self) -> Optional[str]:
        """The engine the module is built and saved under."""
        return self._tst_case.save_qengine if self._tst_case else None

    @property
    def load_qengine(self) -> Optional[str]:
        """The engine the checkpoint is loaded under (differs only in cross-engine tests)."""
        return self._tst_case.load_qengine if self._tst_case else None

    @property
    def device_type(self) -> str:
        return self._tst_case.device_type if self._tst_case else "cpu"

    @property
    def load_device(self) -> str:
        """Where this test's loads put tensors: its device (``npu``), or ``cpu`` in a ``..._to_cpu`` twin."""
        return (self._tst_case.map_location if self._tst_case else None) or "cpu"

    def loading_engine(self) -> contextlib.AbstractContextManager[None]:
        """Context for post-load checks that must run under the load engine."""
        engine = self.load_qengine
        if engine is None or engine == self.qengine:
            return contextlib.nullcontext()
        return override_qengine(engine)

    # -- building -------------------------------------------------------------------------

    def make_module(self) -> Any:
        """Override: return the ``torch.nn.Module`` this class round-trips."""
        raise NotImplementedError(
            f"{type(self).__name__} must define make_module(self) returning the module to round-trip"
        )

    def build_module(self, factory: Optional[Callable[[], Any]] = None) -> Any:
        """Call *factory* (default :meth:`make_module`) and check it returned a module."""
        import torch

        factory = factory or self.make_module
        module = factory()
        if not isinstance(module, torch.nn.Module):
            raise RoundTripConfigError(
                f"{getattr(factory, '__qualname__', factory)} returned {type(module).__name__}, not a "
                "torch.nn.Module; return the module instance"
            )
        return module

    # -- round trips ------------------------------------------------------------------------

    def round_trip(
        self,
        obj: Any,
        *,
        mode: Optional[LoadMode | str] = None,
        safe_globals: Optional[Sequence[Any]] = None,
        map_location: Any = MISSING,
    ) -> Any:
        """Save *obj* to memory and load it back in this test's mode (or *mode*).

        Returns the loaded object.  If torch should reject the load here, the
        test ends as a pass after checking it was rejected for that reason.
        The class's ``safe_globals`` apply unless *safe_globals* is given
        (``safe_globals=()`` for a plain dict or state_dict in a module's class).
        """
        if safe_globals is None:
            where = Declaration(type(self).__name__, "safe_globals")
            declared: Sequence[SafeGlobal] = self._tst_safe_globals
        else:
            where = Declaration(type(self).__name__, None, "round_trip")
            declared = declared_argument(safe_globals)
        return load_in_test(self, save(obj), mode, declared, where, map_location, obj)

    def round_trip_state_dict(
        self,
        module: Any = None,
        *,
        mode: Optional[LoadMode | str] = None,
        factory: Optional[Callable[[], Any]] = None,
        safe_globals: Optional[Sequence[Any]] = None,
        strict: bool = True,
        return_state: bool = False,
    ) -> Any:
        """Round-trip ``module.state_dict()`` and load it into a fresh module from *factory*.

        The class's ``state_dict_safe_globals`` apply unless *safe_globals* is given.
        Returns the fresh module, or ``(fresh module, loaded state_dict)`` with
        *return_state* (to compare every key, as upstream tests do).
        """
        module = self.build_module(factory) if module is None else module
        if safe_globals is None:
            where = Declaration(type(self).__name__, "state_dict_safe_globals", "round_trip_state_dict")
            declared: Sequence[SafeGlobal] = self._tst_state_dict_safe_globals
        else:
            where = Declaration(type(self).__name__, None, "round_trip_state_dict")
            declared = declared_argument(safe_globals)
        state_dict = module.state_dict()
        state = load_in_test(self, save(state_dict), mode, declared, where, MISSING, state_dict)
        with self.loading_engine():
            fresh = self.build_module(factory)
            fresh.load_state_dict(state, strict=strict)
        return (fresh, state) if return_state else fresh

    def save_checkpoint(self, obj: Any) -> Checkpoint:
        """``torch.save`` *obj* into memory; the result may later be loaded in any mode."""
        return save(obj)

    def load_checkpoint(
        self,
        checkpoint: Checkpoint,
        *,
        mode: Optional[LoadMode | str] = None,
        safe_globals: Optional[Sequence[Any]] = None,
        map_location: Any = MISSING,
    ) -> Any:
        """Load *checkpoint* in a mode under this test's load engine, asserting the predicted outcome."""
        if safe_globals is None:
            where = Declaration(type(self).__name__, "safe_globals")
            declared: Sequence[SafeGlobal] = self._tst_safe_globals
        else:
            where = Declaration(type(self).__name__, None, "load_checkpoint")
            declared = declared_argument(safe_globals)
        return load_in_test(self, checkpoint, mode, declared, where, map_location, MISSING)

    # -- assertions -------------------------------------------------------------------------

    def assertRoundTripEqual(  # noqa: N802 - unittest naming
        self,
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
        """Deep comparison, exact by default; the message names the path of the first difference.

        The knobs (as in ``torch.testing.assert_close``) are those of :func:`assert_round_trip_equal`.
        """
        from .comparison import assert_round_trip_equal  # imported on first use

        assert_round_trip_equal(
            expected, actual, rtol=rtol, atol=atol, allow_subclasses=allow_subclasses,
            check_requires_grad=check_requires_grad, check_dtype=check_dtype, check_device=check_device,
            check_layout=check_layout,
        )

    def required_globals(self, obj_or_buffer: Any) -> list[str]:
        """Globals the checkpoint of *obj_or_buffer* needs beyond torch's allowlist."""
        from ..loading.required import required_globals

        return required_globals(obj_or_buffer)

    def assertRequiredGlobalsExpectedInline(  # noqa: N802
        self, obj_or_buffer: Any, expect: str, skip: int = 0
    ) -> None:
        """Pin the required globals, one per line, as an expecttest golden record.

        An empty record is ``""``.  Classes of a file run as a script (``python test_foo.py``)
        are pickled as ``__main__.Name``; they are recorded under the file's module name
        (``test_foo.Name``), so the record is the same however the file is run.
        ``EXPECTTEST_ACCEPT=1`` rewrites the string literal at the call site.
        """
        from expecttest import assert_expected_inline

        names = stable_names(self.required_globals(obj_or_buffer), expect)
        actual = "".join(f"{name}\n" for name in names)
        assert_expected_inline(
            actual, expect, skip=skip + 1, assert_eq=self.assertMultiLineEqual, debug_id=self.id()  # type: ignore[attr-defined]
        )
