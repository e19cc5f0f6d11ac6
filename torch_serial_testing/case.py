"""The ``SerializationRoundTripTestCase`` mixin: the author's declarations, the test's coordinates and
its round trips, wired to the load (:mod:`.outcomes`), isolation (:mod:`.isolation`) and comparison.

When torch should reject a test's load, the test ends there as a pass and says so
("default: rejected as expected (...)") in verbose output.
"""

from __future__ import annotations

import contextlib
import os
import sys
import warnings
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Iterator, Optional, Sequence

from .declarations import Declaration, SafeGlobal, as_safe_globals, normalize_safe_globals, refuse_local
from .engines import override_qengine, qnnpack_allocator, validate_qengines
from .errors import LeakedGlobalStateError, RoundTripConfigError, dimension
from .isolation import GlobalState, start_ignoring, stop_ignoring
from .modes import LoadMode
from .outcomes import (
    MISSING,
    OPEN_SUBTESTS_ATTRIBUTE,
    RoundTripRecord,
    SUBTEST_NO_MESSAGE,
    current_subtest,
    ExpectedRejection,
    ends_on_rejection,
    load_each_mode,
    load_in_test,
    note,
    save,
)
from .variants import CaseSpec, author_class, resolvable, with_dims

if TYPE_CHECKING:
    from .checkpoint import Checkpoint


def _main_module_names() -> list[str]:
    """Module names under which the ``__main__`` script could also be imported (best first)."""
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if not path:
        return []
    spec = getattr(main, "__spec__", None)
    names = [spec.name] if spec is not None and spec.name and spec.name != "__main__" else []
    path = os.path.splitext(os.path.abspath(path))[0]
    for entry in sys.path:  # the dotted name relative to each sys.path entry that holds it
        root = os.path.abspath(entry or os.getcwd())
        if path.startswith(root + os.sep):
            dotted = path[len(root) + 1 :].replace(os.sep, ".")
            if dotted not in names:
                names.append(dotted)
    base = os.path.basename(path)
    return names if base in names else [*names, base]


def _stable_names(names: Sequence[str], expect: str) -> list[str]:
    """*names* with ``__main__.X`` renamed: as pinned in *expect*, else the shortest importable name.

    A class of a file run as a script (``python test_foo.py``, pytorch's habit) is pickled as
    ``__main__.Name``, imported as ``test_foo.Name``: a golden record pins the importable name.
    """
    if not any(n.startswith("__main__.") for n in names):
        return list(names)
    candidates, pinned = _main_module_names(), set(expect.splitlines())
    out = []
    for name in names:
        if name.startswith("__main__.") and candidates:
            options = [f"{module}.{name[len('__main__.') :]}" for module in candidates]
            name = next((o for o in options if o in pinned), None) or min(options, key=len)
        out.append(name)
    return sorted(out)


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
        for attribute in ("safe_globals", "state_dict_safe_globals"):
            declared = getattr(cls, attribute)
            if getattr(cls, f"_tst_{attribute}_source", None) is not declared:  # else judged for a base already
                with resolvable(cls, declared):
                    setattr(cls, f"_tst_{attribute}", normalize_safe_globals(declared))
                setattr(cls, f"_tst_{attribute}_source", declared)
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
                setattr(cls, name, with_dims(ends_on_rejection(value)))

    def setUp(self) -> None:
        getattr(super(), "setUp", lambda: None)()
        self.round_trip_outcomes: list[str] = []
        state = GlobalState.capture()
        self.addCleanup(self._restore_global_state, state)  # type: ignore[attr-defined]
        if self.ignore_warnings:
            self._tst_ignoring = start_ignoring(self.ignore_warnings)
            self.addCleanup(self._tst_unquiet)  # type: ignore[attr-defined]

    def _tst_unquiet(self) -> None:
        token = self.__dict__.pop("_tst_ignoring", None)
        if token is not None:
            stop_ignoring(token)

    def _tst_note_leaks(self, leaks: Sequence[str]) -> None:
        """Leaks found before the final restore (engine state at the end of an engine test's body)."""
        self.__dict__.setdefault("_tst_noted_leaks", []).extend(leaks)

    def _restore_global_state(self, state: GlobalState) -> None:
        if state.restored:
            return
        leaks = [*self.__dict__.pop("_tst_noted_leaks", []), *state.restore()]
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
        """``unittest`` subTest in which an expected rejection ends only that subtest, as a pass; a
        ``GeneratorExit`` (the block yields and its generator is closed) passes through, not recorded."""
        args = () if msg is MISSING else (msg,)
        closing: Optional[GeneratorExit] = None
        # named in the records also where the result has no subTest support (pytest < 9)
        open_subtests = self.__dict__.setdefault(OPEN_SUBTESTS_ATTRIBUTE, [])
        open_subtests.append((SUBTEST_NO_MESSAGE if msg is MISSING else msg, params))
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
                label = ", ".join([repr(msg)] * bool(args) + [f"{k}={v!r}" for k, v in params.items()])
                in_flight.abandoned_subtest = label
            raise closing

    # This generated test's coordinates; outside instantiation no mode and no engine, on cpu.
    load_mode = property(lambda self: self._tst_case.mode if self._tst_case else None)
    qengine = property(
        lambda self: self._tst_case.save_qengine if self._tst_case else None,
        doc="The engine the module is built and saved under.",
    )
    load_qengine = property(
        lambda self: self._tst_case.load_qengine if self._tst_case else None,
        doc="The engine the checkpoint is loaded under (differs only in cross-engine tests).",
    )
    device_type = property(lambda self: self._tst_case.device_type if self._tst_case else "cpu")
    load_device = property(
        lambda self: (self._tst_case.map_location if self._tst_case else None) or "cpu",
        doc="Where loads put tensors: the device (``npu``), or ``cpu`` in a ``..._to_cpu`` twin.",
    )

    def loading_engine(self) -> contextlib.AbstractContextManager[None]:
        """Context for post-load checks that must run under the load engine (the allocator as found)."""
        engine = self.load_qengine
        same = engine is None or engine == self.qengine
        return contextlib.nullcontext() if same else override_qengine(engine, allocator=False)

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
                f"{getattr(factory, '__qualname__', factory)} returned "
                f"{type(module).__name__}, not a torch.nn.Module; return the module instance"
            )
        return module

    def round_trip(
        self,
        obj: Any,
        *,
        mode: Optional[LoadMode | str] = None,
        safe_globals: Optional[Sequence[Any]] = None,
        map_location: Any = MISSING,
    ) -> Any:
        """Save *obj* to memory and load it back in this test's mode (or *mode*); the loaded object.  If
        torch should reject the load here, the test ends as a pass once the rejection is checked.  The
        class's ``safe_globals`` apply unless *safe_globals* is given (``()`` for a plain dict)."""
        return load_in_test(
            self, save(obj), mode, *self._declared(safe_globals, "safe_globals", "round_trip"), map_location, obj
        )

    def round_trip_each_mode(self, obj: Any, check: Any = None, *, safe_globals: Any = None) -> dict[LoadMode, Any]:
        """Save *obj* once, load it in each of the class's modes (a ``subTest`` each: a rejection ends only its
        mode's), ``check(loaded, mode)``: one build per case, in a ``round_trip_dims(load_modes=())`` test."""
        return load_each_mode(
            self, save(obj), self._declared(safe_globals, "safe_globals", "round_trip_each_mode"), obj, check
        )

    def _declared(
        self, given: Optional[Sequence[Any]], attribute: str, method: str
    ) -> tuple[Sequence[SafeGlobal], Declaration]:
        """The globals a load trusts (the class's *attribute*, or *given* to *method*) and where they come from."""
        owner = author_class(type(self), attribute)  # never a generated TestFooCPU
        if given is None:
            return getattr(self, f"_tst_{attribute}"), Declaration(owner, attribute, method)
        refuse_local(given, "safe_globals=")  # checked like a class declaration
        return as_safe_globals(given), Declaration(owner, None, method)

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
        """Round-trip ``module.state_dict()`` into a fresh module from *factory*, under the class's
        ``state_dict_safe_globals`` unless *safe_globals* is given; the module, or with *return_state*
        ``(module, loaded state_dict)``."""
        module = self.build_module(factory) if module is None else module
        declared = self._declared(safe_globals, "state_dict_safe_globals", "round_trip_state_dict")
        state_dict = module.state_dict()
        state = load_in_test(self, save(state_dict), mode, *declared, MISSING, state_dict)
        with self.loading_engine():
            fresh = self.build_module(factory)
            fresh.load_state_dict(state, strict=strict)
        return (fresh, state) if return_state else fresh

    def round_trip_file(
        self,
        obj: Any,
        *,
        mode: Optional[LoadMode | str] = None,
        safe_globals: Optional[Sequence[Any]] = None,
        map_location: Any = MISSING,
        mmap: bool = False,
        **load_kwargs: Any,
    ) -> Any:
        """As :meth:`round_trip`, loading through a file path: the saved bytes go to a private
        temporary file (removed after the load) and ``torch.load(path, ..., mmap=mmap, **load_kwargs)``
        reads them.  *load_kwargs*: any other keyword in ``load.LOAD_KWARGS`` (the mode and
        *map_location* have their own arguments; pickle_load_args such as ``encoding`` are refused: torch
        ignores them in weights-only loads)."""
        extra = {"mmap": True, **load_kwargs} if mmap else dict(load_kwargs)
        declared, where = self._declared(safe_globals, "safe_globals", "round_trip_file")
        return load_in_test(
            self, save(obj), mode, declared, where, map_location, obj, from_file=True, extra_kwargs=extra
        )

    def round_trip_pickle(self, obj: Any, *, protocol: Optional[int] = None) -> Any:
        """``pickle.loads(pickle.dumps(obj, protocol))``, asserted to do what torch does here: a tensor's
        pickle rebuilds its storages with ``torch.load(..., weights_only=False)``, which the
        ``TORCH_FORCE_*`` switches reach (see :func:`.load.pickle_round_trip`).  It has no load mode: in a
        generated test it runs the same in every mode (``round_trip_dims(load_modes=())`` runs it once)."""
        from .loading import pickle_round_trip

        with self.loading_engine(), qnnpack_allocator(self.load_qengine):
            result = pickle_round_trip(obj, protocol)
        outcomes: list[str] = self.round_trip_outcomes
        if result.summary not in outcomes:
            outcomes.append(result.summary)
            self._tst_say(result.summary)
        note(
            self,
            RoundTripRecord("pickle.loads", None, True, result.weights_only, result.summary, current_subtest(self)),
        )
        return result.value

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
        return load_in_test(
            self,
            checkpoint,
            mode,
            *self._declared(safe_globals, "safe_globals", "load_checkpoint"),
            map_location,
            MISSING,
        )

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
        """Deep comparison, exact by default, naming the path of the first difference; the knobs
        (as in ``torch.testing.assert_close``) are those of :func:`assert_round_trip_equal`."""
        from .comparison import assert_round_trip_equal

        assert_round_trip_equal(
            expected,
            actual,
            rtol=rtol,
            atol=atol,
            allow_subclasses=allow_subclasses,
            check_requires_grad=check_requires_grad,
            check_dtype=check_dtype,
            check_device=check_device,
            check_layout=check_layout,
        )

    def required_globals(self, obj_or_buffer: Any) -> list[str]:
        """Globals the checkpoint of *obj_or_buffer* needs beyond torch's allowlist."""
        from .prediction import required_globals

        return required_globals(obj_or_buffer)

    def assertRequiredGlobalsExpectedInline(self, obj_or_buffer: Any, expect: str, skip: int = 0) -> None:  # noqa: N802
        """Pin the required globals, one per line (none: ``""``, or one empty line), as an expecttest golden record that
        is the same however the file is run (:func:`_stable_names`); ``EXPECTTEST_ACCEPT=1`` rewrites it."""
        from expecttest import assert_expected_inline

        names = _stable_names(self.required_globals(obj_or_buffer), expect)
        # No global: "" -- or one empty line, as records written before 0.1.0's final form pinned it.
        actual = "".join(f"{name}\n" for name in names) or ("\n" if expect == "\n" else "")
        assert_expected_inline(
            actual,
            expect,
            skip=skip + 1,
            assert_eq=self.assertMultiLineEqual,  # type: ignore[attr-defined]  # a mixin of a TestCase
            debug_id=self.id(),  # type: ignore[attr-defined]
        )
