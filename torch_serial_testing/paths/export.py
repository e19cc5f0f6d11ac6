"""``torch.export`` round trips: ``torch.export.save``/``torch.export.load`` of an ``ExportedProgram``.

An ``ExportedProgram`` archive is **not a torch.load checkpoint**: ``torch.export.save`` writes a zip archive with
no ``data.pkl`` record, so ``torch.load`` cannot read it in any load mode; it raises torch's reader error (the
file looks "corrupted") -- weights-only or not, whatever is allowlisted.  ``torch.export.load`` reads it, and reads
the weights and constants inside with ``torch.load(weights_only=False)`` (which ``TORCH_FORCE_WEIGHTS_ONLY_LOAD``
forces weights-only: plain tensors load either way), so only an archive the same call just wrote is ever loaded.

:class:`ExportRoundTrips` adds two methods to the mixin (``class TestX(ExportRoundTrips,
SerializationRoundTripTestCase, TestCase)``):

* :meth:`~ExportRoundTrips.round_trip_export`: save into memory, ``torch.export.load`` back, compared by running
  the loaded program on the example inputs (the program's own by default), its state dict, constants and graph
  code, exactly by default.  No load mode: ``torch.export.load`` has none.
* :meth:`~ExportRoundTrips.round_trip_export_torch_load`: what ``torch.load`` does with that archive in the test's
  load mode, predicted (torch's exact error, asked of torch once per ``weights_only`` by loading a tiny archive
  without ``data.pkl``: :func:`no_data_pkl_refusal`) and asserted: an expected rejection, which ends the test as a pass.
  It fails the day torch reads such an archive.

On a torch without ``torch.export.save``/``load`` (before 2.1) both skip, saying so."""

from __future__ import annotations

import io
import pickle
import unittest
import zipfile
from typing import Any, Optional, Sequence

import torch

from ..errors import ProbeFailed, RoundTripConfigError, UnexpectedLoadOutcome
from ..outcomes import report
from .script import Refusal, WithTheMixin, example_calls, load_archive, probe_archive, require_the_mixin

#: Why ``torch.load`` cannot read an ``ExportedProgram`` archive, as the test's outcome says it.
NOT_A_CHECKPOINT = (
    "a torch.export archive is not a torch.save checkpoint (it has no data.pkl): torch.load cannot read it in any "
    "load mode; torch.export.load reads it"
)


def export_skip_reason() -> Optional[str]:
    """Why this torch cannot save and load an ``ExportedProgram``, or None."""
    export = getattr(torch, "export", None)
    if export is None or not all(hasattr(export, f) for f in ("save", "load", "ExportedProgram")):
        return f"this torch ({torch.__version__}) has no torch.export.save/load (torch >= 2.1)"
    return None


_no_data_pkl: dict[tuple[bool, tuple[str, ...]], Refusal] = {}


def probe_layout(names: Sequence[str]) -> Sequence[str]:
    """The *layout* :func:`no_data_pkl_refusal` asks about for an archive of these record names: torch's reader opens
    one whose records share a folder (then it lacks data.pkl: the plain probe, ``()``); a flat one (torch 2.4's
    ``torch.export.save``) it refuses at once, naming its first record: the names, never the contents."""
    return () if len({name.partition("/")[0] for name in names if "/" in name}) == 1 else names


def no_data_pkl_refusal(weights_only: bool = True, layout: Sequence[str] = ()) -> Refusal:
    """What torch raises loading a zip archive that has no ``data.pkl`` record, weights-only or not: the exception's
    type and exact message, asked of torch once per ``weights_only`` and *layout* (the record names of a flat
    archive ``torch.export.save`` wrote, each empty in the probe; empty: one folder with a version record).
    ``RuntimeError`` from torch's reader, which torch 2.4 also refuses a flat archive with, and wraps in
    ``UnpicklingError`` weights-only.  Anything but a refusal by ``torch.serialization``: :class:`ProbeFailed`."""
    key = (weights_only, tuple(layout))
    if key not in _no_data_pkl:
        error, where = probe_archive((), weights_only=weights_only, paths=layout or None, contents=b"")
        if not isinstance(error, (RuntimeError, pickle.UnpicklingError)) or not where.startswith("torch.serialization"):
            raise ProbeFailed(
                f"torch.load(weights_only={weights_only}) of a zip archive without data.pkl raised "
                f"{type(error).__name__} in {where}: {error}"
            )
        _no_data_pkl[key] = (type(error), str(error))
    return _no_data_pkl[key]


def _export_save(program: Any, method: str) -> bytes:
    if reason := export_skip_reason():
        raise unittest.SkipTest(reason)
    if not isinstance(program, torch.export.ExportedProgram):
        raise RoundTripConfigError(
            f"{method} takes an ExportedProgram, got {type(program).__name__}: pass "
            "torch.export.export(module, args) (torch.export.save writes nothing else)"
        )
    buf = io.BytesIO()
    torch.export.save(program, buf)
    return buf.getvalue()


def _calls(program: Any, example_inputs: Optional[Sequence[Any]], method: str) -> list:
    if example_inputs is not None:
        return example_calls(example_inputs, method)
    own = getattr(program, "example_inputs", None)  # (args, kwargs) the program was exported with
    if not own:
        raise RoundTripConfigError(
            f"{method}: this ExportedProgram keeps no example inputs; pass example_inputs=[(x,), ...]"
        )
    args, kwargs = own
    return [(tuple(args), dict(kwargs))]


def _state(program: Any, calls: list) -> dict[str, Any]:
    module = program.module()
    return {
        "state_dict": dict(program.state_dict),
        "constants": dict(program.constants),
        "code": program.graph_module.code,
        "outputs": [module(*args, **kwargs) for args, kwargs in calls],
    }


class ExportRoundTrips(WithTheMixin):
    """``torch.export`` round trips for a :class:`~torch_serial_testing.SerializationRoundTripTestCase`, listed
    first: ``class TestX(ExportRoundTrips, SerializationRoundTripTestCase, TestCase)``."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        require_the_mixin(cls, ExportRoundTrips)

    def round_trip_export(self, program: Any, example_inputs: Optional[Sequence[Any]] = None, **checks: Any) -> Any:
        """``torch.export.save`` *program* (an ``ExportedProgram``) into memory and ``torch.export.load`` it back under
        this test's load engine; assert the loaded program's outputs on *example_inputs* (argument tuples; default:
        the inputs it was exported with), state dict, constants and graph code equal the original's, exactly unless
        *checks* (``rtol``/``atol``, as :meth:`assertRoundTripEqual`) relax it.  The loaded program."""
        data = _export_save(program, "round_trip_export")
        calls = _calls(program, example_inputs, "round_trip_export")
        expected = _state(program, calls)
        with self.loading_engine():
            loaded = torch.export.load(io.BytesIO(data))
            if not isinstance(loaded, torch.export.ExportedProgram):
                raise UnexpectedLoadOutcome(f"torch.export.load returned a {type(loaded).__name__}")
            actual = _state(loaded, calls)
        self.assertRoundTripEqual(expected, actual, **checks)
        inputs = f"{len(calls)} example input{'' if len(calls) == 1 else 's'}"
        summary = f"torch.export.load: loaded and compared (outputs on {inputs}, state, code)"
        report(self, "torch.export.load", None, True, None, summary)
        return loaded

    def round_trip_export_torch_load(self, program: Any, *, mode: Any = None) -> None:
        """Save *program* with ``torch.export.save`` and read it with ``torch.load`` in this test's load mode (or
        *mode*): refused in every mode, with torch's exact message (:func:`no_data_pkl_refusal`), which ends the test
        as a pass saying so; it fails if torch loads it, or refuses it otherwise."""
        data = _export_save(program, "round_trip_export_torch_load")
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            layout = probe_layout(archive.namelist())
        refusals = (no_data_pkl_refusal(False, layout), no_data_pkl_refusal(True, layout))
        load_archive(self, data, mode, None, refusals=refusals, why=lambda loaded: NOT_A_CHECKPOINT)
