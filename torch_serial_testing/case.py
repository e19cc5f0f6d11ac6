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
import json
import os
import unittest
from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Iterator, Optional, Sequence

from . import allowlist, load_modes
from .allowlist import SafeGlobal, as_safe_globals, normalize_safe_globals, safe_globals_snippet
from .checkpoint import Checkpoint
from .comparison import assert_round_trip_equal
from .engines import override_qengine, validate_qengines
from .errors import AllowlistError, LeakedGlobalStateError, RoundTripConfigError, dimension
from .isolation import GlobalState
from .load_modes import LoadMode

__all__ = ["SerializationRoundTripTestCase", "ExpectedRejection", "CaseSpec", "REPORT_ENV"]

#: Set to a file path to get one JSON line per round trip (test id, mode, outcome).
REPORT_ENV = "TORCH_SERIAL_TESTING_REPORT"
_MISSING: Any = object()


class ExpectedRejection(Exception):
    """torch rejected the load exactly as predicted; the test ends here as a pass."""

    def __init__(self, summary: str) -> None:
        super().__init__(summary)
        self.summary = summary


@dataclass(frozen=True)
class CaseSpec:
    """One generated test: load mode, engines (save, load), device and where to load to."""

    mode: LoadMode
    device_type: str
    save_qengine: Optional[str] = None
    load_qengine: Optional[str] = None
    to_cpu: bool = False

    def method_name(self, base: str, device_part: str) -> str:
        parts = [base]
        if self.save_qengine:
            same = self.save_qengine == self.load_qengine
            parts.append(self.save_qengine if same else f"{self.save_qengine}_to_{self.load_qengine}")
        parts += [self.mode.value, device_part]
        if self.to_cpu:
            parts.append("to_cpu")
        return "_".join(parts)

    @property
    def map_location(self) -> Optional[str]:
        if self.to_cpu:
            return "cpu"
        from .devices import torch_device_type

        return None if self.device_type == "cpu" else torch_device_type(self.device_type)


def _ends_on_rejection(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap a test method so an expected rejection ends it as a pass."""
    if getattr(fn, "_tst_wrapped", False):
        return fn

    @functools.wraps(fn)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return fn(self, *args, **kwargs)
        except ExpectedRejection:
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
    #: Instantiation dimensions: None means all modes / no engine dimension / available devices.
    load_modes: ClassVar[Optional[Sequence[Any]]] = None
    qengines: ClassVar[Optional[Sequence[str]]] = None
    devices: ClassVar[Optional[Sequence[str]]] = None

    _tst_safe_globals: ClassVar[tuple[SafeGlobal, ...]] = ()
    _tst_state_dict_safe_globals: ClassVar[tuple[SafeGlobal, ...]] = ()
    _tst_case: ClassVar[Optional[CaseSpec]] = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # Bad declarations fail here, at class creation, not in the middle of a run.
        cls._tst_safe_globals = normalize_safe_globals(cls.safe_globals)
        cls._tst_state_dict_safe_globals = normalize_safe_globals(cls.state_dict_safe_globals)
        if cls.load_modes is not None:
            modes = dimension("load_modes", cls.load_modes, "('default',)")
            cls.load_modes = dimension("load_modes", tuple(LoadMode.parse(m) for m in modes), "('default',)")
        validate_qengines(cls.qengines)
        make = cls.__dict__.get("make_module")
        if make is not None and not callable(make):
            raise RoundTripConfigError(f"{cls.__name__}.make_module must be a method returning a torch.nn.Module")
        for name, value in list(cls.__dict__.items()):
            if name.startswith("test") and callable(value):
                setattr(cls, name, _ends_on_rejection(value))

    # -- per-test state ---------------------------------------------------------------

    def setUp(self) -> None:
        parent = getattr(super(), "setUp", None)
        if parent is not None:
            parent()
        self.round_trip_outcomes: list[str] = []
        state = GlobalState.capture()
        self.addCleanup(self._restore_global_state, state)  # type: ignore[attr-defined]

    def _restore_global_state(self, state: GlobalState) -> None:
        leaks = state.restore()
        if not leaks:
            return
        message = f"{self.id()} leaked global state (now restored): " + "; ".join(leaks)  # type: ignore[attr-defined]
        if self.fail_on_leaked_state:
            raise LeakedGlobalStateError(message)
        import warnings

        warnings.warn(message, RuntimeWarning, stacklevel=1)

    @contextlib.contextmanager
    def subTest(self, msg: Any = _MISSING, **params: Any) -> Iterator[None]:  # noqa: N802 - unittest API
        """``unittest`` subTest in which an expected rejection ends only that subtest, as a pass."""
        args = () if msg is _MISSING else (msg,)
        with super().subTest(*args, **params):  # type: ignore[misc]
            try:
                yield
            except ExpectedRejection:
                pass

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
        map_location: Any = _MISSING,
    ) -> Any:
        """Save *obj* to memory and load it back in this test's mode (or *mode*).

        Returns the loaded object.  If torch should reject the load here, the
        test ends as a pass after checking it was rejected for that reason.
        """
        return self.load_checkpoint(
            Checkpoint.save(obj), mode=mode, safe_globals=safe_globals, map_location=map_location
        )

    def round_trip_state_dict(
        self,
        module: Any = None,
        *,
        mode: Optional[LoadMode | str] = None,
        factory: Optional[Callable[[], Any]] = None,
        safe_globals: Optional[Sequence[Any]] = None,
        strict: bool = True,
    ) -> Any:
        """Round-trip ``module.state_dict()`` and load it into a fresh module from *factory*."""
        module = self.build_module(factory) if module is None else module
        declared = self._tst_state_dict_safe_globals if safe_globals is None else safe_globals
        state = self.round_trip(module.state_dict(), mode=mode, safe_globals=declared)
        with self.loading_engine():
            fresh = self.build_module(factory)
            fresh.load_state_dict(state, strict=strict)
        return fresh

    def save_checkpoint(self, obj: Any) -> Checkpoint:
        """``torch.save`` *obj* into memory; the result may later be loaded in any mode."""
        return Checkpoint.save(obj)

    def load_checkpoint(
        self,
        checkpoint: Checkpoint,
        *,
        mode: Optional[LoadMode | str] = None,
        safe_globals: Optional[Sequence[Any]] = None,
        map_location: Any = _MISSING,
    ) -> Any:
        """Load *checkpoint* in a mode under this test's load engine, asserting the predicted outcome."""
        resolved = LoadMode.parse(mode) if mode is not None else self.load_mode
        if resolved is None:
            raise RoundTripConfigError(
                "this test has no load mode: pass mode=LoadMode.DEFAULT (or another mode), or "
                "generate the tests with instantiate_round_trip_tests(...)"
            )
        declared = self._tst_safe_globals if safe_globals is None else as_safe_globals(safe_globals)
        unavailable = load_modes.mode_skip_reason(resolved)
        if unavailable:  # before judging the declaration: the mode cannot run here at all
            raise unittest.SkipTest(unavailable)
        if resolved is LoadMode.SAFE_GLOBALS:
            self._check_declared(checkpoint, declared)
        if map_location is _MISSING:
            map_location = self._tst_case.map_location if self._tst_case else None
        with self.loading_engine():
            result = load_modes.load(checkpoint, resolved, declared, map_location)
        self._report(result)
        if not result.loaded:
            raise ExpectedRejection(result.summary)
        return result.value

    def _check_declared(self, checkpoint: Checkpoint, declared: Sequence[SafeGlobal]) -> None:
        needed = set(allowlist.required_globals(checkpoint))
        names = {sg.name for sg in declared}
        missing = sorted(needed - names)
        # A declared global the checkpoint uses but torch already allows (builtins.set since
        # torch 2.6) is not over-trust: it keeps one declaration valid across torch versions.
        used = set(checkpoint.info.globals)
        unneeded = sorted(n for n in names - needed if n not in used)
        if missing:
            raise AllowlistError(
                f"safe_globals misses {len(missing)} global(s) the checkpoint needs: {', '.join(missing)}\n"
                "Declare them (only if you trust them), e.g.:\n\n" + safe_globals_snippet(sorted(needed))
            )
        if unneeded and not self.allow_unneeded_safe_globals:
            raise AllowlistError(
                f"safe_globals over-trusts: the checkpoint does not need {', '.join(unneeded)}. "
                "Remove them, or set allow_unneeded_safe_globals = True on the class."
            )

    def _report(self, result: load_modes.LoadResult) -> None:
        summary = result.summary
        if summary not in self.round_trip_outcomes:
            self.round_trip_outcomes.append(summary)
            outcome = getattr(self, "_outcome", None)
            test_result = getattr(outcome, "result", None)
            if getattr(test_result, "showAll", False) and hasattr(test_result, "stream"):
                test_result.stream.write(summary + " ... ")
                test_result.stream.flush()
        path = os.environ.get(REPORT_ENV)
        if path:
            record = {
                "test": self.id(),  # type: ignore[attr-defined]
                "mode": result.expectation.mode.value,
                "loaded": result.loaded,
                "weights_only": result.expectation.weights_only,
                "summary": summary,
            }
            with open(path, "a", encoding="utf-8") as fh:
                fh.write(json.dumps(record) + "\n")

    # -- assertions -------------------------------------------------------------------------

    def assertRoundTripEqual(  # noqa: N802 - unittest naming
        self, expected: Any, actual: Any, *, rtol: Optional[float] = None, atol: Optional[float] = None
    ) -> None:
        """Exact deep comparison; the message names the path of the first difference."""
        assert_round_trip_equal(expected, actual, rtol=rtol, atol=atol)

    def required_globals(self, obj_or_buffer: Any) -> list[str]:
        """Globals the checkpoint of *obj_or_buffer* needs beyond torch's allowlist."""
        return allowlist.required_globals(obj_or_buffer)

    def assertRequiredGlobalsExpectedInline(  # noqa: N802
        self, obj_or_buffer: Any, expect: str, skip: int = 0
    ) -> None:
        """Pin the required globals, one per line, as an expecttest golden record.

        ``EXPECTTEST_ACCEPT=1`` rewrites the string literal at the call site.
        """
        from expecttest import assert_expected_inline

        actual = "\n".join(allowlist.required_globals(obj_or_buffer)) + "\n"
        assert_expected_inline(
            actual, expect, skip=skip + 1, assert_eq=self.assertMultiLineEqual, debug_id=self.id()  # type: ignore[attr-defined]
        )
