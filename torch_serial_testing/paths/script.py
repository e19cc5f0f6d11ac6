"""TorchScript round trips: ``torch.jit.save``/``torch.jit.load``, and ``torch.load`` of a TorchScript archive.

A TorchScript archive is not a ``torch.save`` checkpoint.  ``torch.jit.load`` reads it, and that is a full load
(the archive carries code as well as pickles), so only an archive the same call just wrote is ever loaded: the
bytes never leave the method.  ``torch.load`` recognises one by its ``constants.pkl`` record and warns that it
does; a full load (``weights_only=False``, or forced so) hands it to ``torch.jit.load``, a weights-only one refuses
it with ``RuntimeError`` whatever is allowlisted (or, on a torch that does not refuse it, hands it over too).
Which of the two this torch does, and its exact words, are asked of torch once, by loading a tiny archive weights-only
(:func:`torchscript_refusal`); the load mode's decision is the core's (:func:`~torch_serial_testing.modes.decide`).
So a test tells "not loadable this way" from "a global is not allowlisted".

:class:`TorchScriptRoundTrips` adds two methods to the mixin (``class TestX(TorchScriptRoundTrips,
SerializationRoundTripTestCase, TestCase)``):

* :meth:`~TorchScriptRoundTrips.round_trip_jit`: ``torch.jit.save`` into memory, ``torch.jit.load`` back under the
  test's load engine, compared with the original (``state_dict()``, each module's code, the outputs on the example
  inputs, exactly by default).  No load mode: ``torch.jit.load`` has no ``weights_only``.
* :meth:`~TorchScriptRoundTrips.round_trip_jit_torch_load`: the same archive read by ``torch.load`` in the test's
  load mode, predicted and asserted as a round trip is: loaded (then compared the same way) or an expected
  rejection that ends the test as a pass.

:func:`load_archive` is the ``torch.load`` of an archive that is not a ``torch.save`` checkpoint, shared with
:mod:`torch_serial_testing.paths.export`."""

from __future__ import annotations

import io
import os
import pickle
import unittest
import zipfile
from typing import TYPE_CHECKING, Any, Callable, Optional, Sequence

import torch

from ..case import SerializationRoundTripTestCase
from ..dimensions import qnnpack_allocator
from ..errors import ProbeFailed, RoundTripConfigError, UnexpectedLoadOutcome
from ..loading import mode_skip_reason
from ..modes import FORCE_NO_WO, FORCE_WO, LoadMode, decide, set_environ
from ..outcomes import MISSING, ExpectedRejection, report
from ..registry import registry_lock, restore_registry, snapshot_registry
from ..serialization import genuine, observe_serialization_warnings, raiser

if TYPE_CHECKING:  # the class the paths' mixins add methods to, as the type checker sees them
    WithTheMixin = SerializationRoundTripTestCase
else:
    WithTheMixin = object
#: What torch raises refusing an archive: the exception's type and its exact message.
Refusal = tuple[type, str]
#: Example inputs as calls: (args, kwargs) each.
_Calls = list[tuple[tuple[Any, ...], dict[str, Any]]]
#: What ``torch.load`` does with a TorchScript archive, as the test's outcome says it.
HANDED_TO_JIT = "a TorchScript archive: torch.load handed it to torch.jit.load"
REFUSED_WEIGHTS_ONLY = (
    "a TorchScript archive: torch.load refuses it weights-only, whatever is allowlisted; torch.jit.load reads it"
)


def probe_archive(
    records: Sequence[str], weights_only: bool = True, *, paths: Optional[Sequence[str]] = None, contents: bytes = b""
) -> tuple[Optional[BaseException], str]:
    """``torch.load(weights_only=...)`` of a tiny zip archive holding *records* (each a pickled ``None``) under a
    ``probe/`` folder with a version record -- or, given *paths*, exactly those names each holding *contents* (the
    layout of an archive the test wrote) -- with neither switch set: (what torch raised, or None; where).  The
    archive is the probe's own; a full load is asked only of an archive with no ``data.pkl`` (nothing to unpickle)."""
    names = list(paths) if paths is not None else ["probe/version", *(f"probe/{name}" for name in records)]
    if not weights_only and any(name.rpartition("/")[2] == "data.pkl" for name in names):
        raise ValueError("a full-load probe reads only an archive without data.pkl")
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as archive:
        for name in names:
            archive.writestr(
                name,
                b"3\n" if name == "probe/version" else pickle.dumps(None, protocol=2) if paths is None else contents,
            )
    buf.seek(0)
    with registry_lock, observe_serialization_warnings(consume_all=True):  # torch warns that it dispatches to jit
        switches = {name: os.environ.get(name) for name in (FORCE_WO, FORCE_NO_WO)}
        set_environ(dict.fromkeys(switches))
        try:
            genuine("load")(buf, weights_only=weights_only)
        except Exception as e:  # noqa: BLE001 - what and where are the answer
            return e, raiser(e)
        finally:
            set_environ(switches)
    return None, "nowhere"


_torchscript_refusal: list[Optional[str]] = []


def torchscript_refusal() -> Optional[str]:
    """torch's exact message refusing a TorchScript archive weights-only, or None when it hands the archive to
    ``torch.jit.load`` whatever ``weights_only`` says: asked once, with a tiny archive."""
    if not _torchscript_refusal:
        error, where = probe_archive(("data.pkl", "constants.pkl"))
        if where.startswith("torch.jit"):
            _torchscript_refusal.append(None)
        elif where.startswith("torch.serialization") and isinstance(error, RuntimeError):
            _torchscript_refusal.append(str(error))
        else:
            raise ProbeFailed(
                f"torch.load of a TorchScript archive with weights_only=True raised in {where}: "
                f"{type(error).__name__}: {error}"
            )
    return _torchscript_refusal[0]


def example_calls(example_inputs: Any, method: str) -> _Calls:
    """*example_inputs* (a sequence of argument tuples, as pytorch's ``calib_data``) as ``(args, kwargs)`` calls."""
    if isinstance(example_inputs, (torch.Tensor, str, bytes)) or not isinstance(example_inputs, (list, tuple)):
        raise RoundTripConfigError(
            f"{method}(example_inputs=...) is a list of argument tuples, one per call, e.g. [(x,)] or "
            f"[(x, y), (x2, y2)]; got {type(example_inputs).__name__}"
        )
    calls: _Calls = []
    for i, args in enumerate(example_inputs):
        if not isinstance(args, (list, tuple)):
            raise RoundTripConfigError(
                f"{method}: example_inputs[{i}] is a {type(args).__name__}, not a tuple of arguments; write "
                f"({type(args).__name__.lower()}_value,) -- a one-element tuple -- for a single argument"
            )
        calls.append((tuple(args), {}))
    return calls


def load_archive(
    test: Any,
    data: bytes,
    mode: Any,
    map_location: Any,
    *,
    refusals: tuple[Optional[Refusal], Optional[Refusal]],
    why: Callable[[bool], str],
) -> Any:
    """``torch.load`` of *data* (an archive *test* just wrote, never anything else) in *test*'s mode (or *mode*),
    asserted to do what torch's rules say: *refusals* are the exception type and exact message torch raises for a
    full and for a weights-only load (None: it loads), ``why(loaded)`` the reason the outcome gives.  The loaded
    object, or :class:`~torch_serial_testing.outcomes.ExpectedRejection` (the test passes)."""
    resolved = LoadMode.parse(mode) if mode is not None else test.load_mode
    if resolved is None:
        raise RoundTripConfigError(
            "this test has no load mode: pass mode='default' (or another mode), or give the method its load modes "
            "back (it narrowed them with round_trip_dims(load_modes=()) / no_round_trip_dims)"
        )
    if reason := mode_skip_reason(resolved):
        raise unittest.SkipTest(reason)
    decision = decide(resolved)  # both switches set: ConflictingEnvironmentError, one clear message
    refusal = refusals[decision.weights_only]
    if map_location is MISSING:
        map_location = test._tst_case.map_location if test._tst_case else None
    kwargs: dict[str, Any] = {} if map_location is None else {"map_location": map_location}
    buf = io.BytesIO(data)
    value: Any = None
    error: Optional[BaseException] = None
    with registry_lock, test.loading_engine(), qnnpack_allocator(test.load_qengine):
        snapshot = snapshot_registry() if resolved is LoadMode.SAFE_GLOBALS else None  # torch's exit may drop some
        try:
            with observe_serialization_warnings() as observed:
                if resolved is LoadMode.SAFE_GLOBALS:
                    with torch.serialization.safe_globals([]):  # nothing a declaration could add changes this
                        value = torch.load(buf, weights_only=True, **kwargs)
                else:
                    if (explicit := resolved.explicit_weights_only) is not None:  # default: not passed at all
                        kwargs["weights_only"] = explicit
                    value = torch.load(buf, **kwargs)
        except Warning:
            raise  # a warning the caller's filters turned into an error: theirs
        except Exception as e:  # noqa: BLE001 - judged below
            error = e
        finally:
            if snapshot is not None:
                restore_registry(snapshot)
    loaded, loads = error is None, refusal is None
    said = f"{decision.reason}; {why(loads)}"  # what torch should do, and why
    problem = None
    if loaded != loads:
        did = "loaded it" if loaded else f"raised {error!r}"
        problem = f"expected torch.load to {'load' if loads else 'refuse'} it ({said}); it {did}"
    elif not loaded and refusal is not None and (type(error) is not refusal[0] or str(error) != refusal[1]):
        problem = f"expected torch.load to raise {refusal[0].__name__}({refusal[1]!r}) ({said}); it raised {error!r}"
    elif decision.replaced_by is None and observed.seen != decision.warns:
        problem = f"expected torch {'to' if decision.warns else 'not to'} warn about {FORCE_NO_WO}; it did the opposite"
    if problem is not None:
        by = f"torch.load is replaced by {decision.replaced_by}: " if decision.replaced_by else ""
        raise UnexpectedLoadOutcome(f"{resolved.value}: {by}{problem}") from error
    warned = "; torch warned" if decision.warns else ""
    summary = f"{resolved.value}: {'loaded' if loaded else 'rejected'} as expected ({said}{warned})"
    report(test, "torch.load", resolved.value, loaded, decision.weights_only, summary)
    if not loaded:
        test._tst_in_flight = rejection = ExpectedRejection(summary)
        raise rejection
    return value


def require_the_mixin(cls: type, paths_mixin: type) -> None:
    """At class creation: *cls* uses *paths_mixin* with the mixin, else a clear error saying the bases to write."""
    if not issubclass(cls, SerializationRoundTripTestCase):
        name, paths = cls.__name__, paths_mixin.__name__
        raise RoundTripConfigError(
            f"{name} uses {paths}, which adds round trips to SerializationRoundTripTestCase: write "
            f"class {name}({paths}, SerializationRoundTripTestCase, TestCase)"
        )


def _jit_save(module: Any, method: str) -> bytes:
    if not isinstance(module, torch.jit.ScriptModule):
        raise RoundTripConfigError(
            f"{method} takes a TorchScript module, got {type(module).__name__}: pass torch.jit.script(module) "
            "or torch.jit.trace(module, example_inputs[0])"
        )
    buf = io.BytesIO()
    torch.jit.save(module, buf)
    return buf.getvalue()


def _state(module: Any, calls: _Calls) -> dict[str, Any]:
    """What a TorchScript module's copy must keep: its ``state_dict()``, the code of each of its modules (a module
    without ``forward`` has none) and its outputs on *calls*."""
    code = {}
    for name, sub in module.named_modules():
        try:
            code[name] = sub.code
        except (AttributeError, RuntimeError):  # a holder of methods and attributes
            code[name] = None
    outputs = [module(*args, **kwargs) for args, kwargs in calls]
    return {"state_dict()": module.state_dict(), "code": code, "outputs": outputs}


def _compare(test: Any, expected: dict[str, Any], loaded: Any, calls: _Calls, checks: dict[str, Any]) -> None:
    if not isinstance(loaded, torch.jit.ScriptModule):
        raise UnexpectedLoadOutcome(f"the archive loaded as a {type(loaded).__name__}, not a TorchScript module")
    with test.loading_engine():  # run as loaded: under the load engine
        actual = _state(loaded, calls)
    test.assertRoundTripEqual(expected, actual, **checks)


class TorchScriptRoundTrips(WithTheMixin):
    """TorchScript round trips for a :class:`~torch_serial_testing.SerializationRoundTripTestCase`, listed first:
    ``class TestX(TorchScriptRoundTrips, SerializationRoundTripTestCase, TestCase)``."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        require_the_mixin(cls, TorchScriptRoundTrips)

    def round_trip_jit(self, module: Any, example_inputs: Sequence[Any] = (), **checks: Any) -> Any:
        """``torch.jit.save`` *module* (scripted or traced) into memory and ``torch.jit.load`` it back under this
        test's load engine (and device); assert the copy keeps its ``state_dict()``, each module's code and its outputs
        on *example_inputs* (argument tuples, computed before saving), exactly unless *checks* (``rtol``/``atol``, as
        :meth:`assertRoundTripEqual`) relax it.  The loaded module."""
        calls = example_calls(example_inputs, "round_trip_jit")
        data, expected = _jit_save(module, "round_trip_jit"), _state(module, calls)
        map_location = self._tst_case.map_location if self._tst_case else None
        with self.loading_engine(), qnnpack_allocator(self.load_qengine):
            loaded = torch.jit.load(io.BytesIO(data), map_location=map_location)
        _compare(self, expected, loaded, calls, checks)
        inputs = f"{len(calls)} example input{'' if len(calls) == 1 else 's'}"
        summary = f"torch.jit.load: loaded and compared (state_dict, code, outputs on {inputs})"
        report(self, "torch.jit.load", None, True, None, summary)
        return loaded

    def round_trip_jit_torch_load(
        self,
        module: Any,
        example_inputs: Sequence[Any] = (),
        *,
        mode: Any = None,
        map_location: Any = MISSING,
        **checks: Any,
    ) -> Any:
        """As :meth:`round_trip_jit`, read back by ``torch.load`` in this test's load mode (or *mode*): a full load
        hands it to ``torch.jit.load`` (the copy is compared), a weights-only one is refused, both as this torch does
        (:func:`torchscript_refusal`).  A refusal ends the test as a pass, saying why."""
        calls = example_calls(example_inputs, "round_trip_jit_torch_load")
        data, expected = _jit_save(module, "round_trip_jit_torch_load"), _state(module, calls)
        refusal = torchscript_refusal()

        def why(loaded: bool) -> str:
            if refusal is None:
                return "a TorchScript archive: this torch hands it to torch.jit.load whatever weights_only says"
            return HANDED_TO_JIT if loaded else REFUSED_WEIGHTS_ONLY

        refused = None if refusal is None else (RuntimeError, refusal)
        loaded = load_archive(self, data, mode, map_location, refusals=(None, refused), why=why)
        _compare(self, expected, loaded, calls, checks)
        return loaded
