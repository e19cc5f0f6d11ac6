"""``torch_serial_testing.paths.export``: ``torch.export.save``/``load`` round trips, and what ``torch.load`` does
with such an archive.  Mutations (a ``torch.export.load`` or ``torch.load`` doing something else than torch does)
show that each assertion can fail."""

from __future__ import annotations

import functools
import io
import unittest
import warnings
import zipfile
from typing import Any
from unittest import mock

import torch

from test.helpers.roundtrip_fixtures import MODE_SKIPS
from test.paths.test_script import failure, run
from torch_serial_testing.errors import ProbeFailed, RoundTripConfigError, UnexpectedLoadOutcome
from torch_serial_testing.paths import export
from torch_serial_testing.paths.export import (
    NOT_A_CHECKPOINT,
    ExportRoundTrips,
    export_skip_reason,
    no_data_pkl_refusal,
)


class Scaled(torch.nn.Module):
    def __init__(self, k: float) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(3, 2)
        self.register_buffer("k", torch.tensor([k]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x).relu() * self.k


@functools.cache
def program(k: float = 2.0) -> Any:
    if reason := export_skip_reason():
        raise unittest.SkipTest(reason)
    torch.manual_seed(0)
    return torch.export.export(Scaled(k), (torch.randn(4, 3),))


def code_after_torchs_own_round_trip() -> str:
    buf = io.BytesIO()
    torch.export.save(program(), buf)
    buf.seek(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch 2.4's export.load warns about its own bare torch.load
        return torch.export.load(buf).graph_module.code


def run_export(body: Any, mode: str = "weights_only_false") -> Any:
    return run(body, mode, (ExportRoundTrips,))  # the script tests' small class, with export's methods


class TestRoundTripExport(unittest.TestCase):
    def test_loads_equal_on_its_own_example_inputs_and_is_recorded(self) -> None:
        if code_after_torchs_own_round_trip() != program().graph_module.code:  # asked of torch, not the library
            # torch 2.4's serializer writes a positional argument back as a keyword (``bias = ...``): the
            # library says so, where; the outputs, state and constants are compared before the code
            result, recs, _ = run_export(lambda test: test.round_trip_export(program()))
            self.assertIn("round trip mismatch at ['code']", failure(result))
            self.assertEqual(recs, [])
            return
        result, recs, loaded = run_export(lambda test: test.round_trip_export(program()))
        self.assertTrue(result.wasSuccessful(), failure(result))
        self.assertIsInstance(loaded, torch.export.ExportedProgram)
        self.assertEqual([(r.kind, r.mode, r.loaded) for r in recs], [("torch.export.load", None, True)])
        self.assertIn("outputs on 1 example input,", recs[0].summary)

    def test_a_copy_that_computes_otherwise_fails_naming_where(self) -> None:
        with mock.patch("torch.export.load", return_value=program(3.0)):
            result, _, _ = run_export(lambda test: test.round_trip_export(program(), [(torch.ones(4, 3),)]))
        self.assertEqual(len(result.failures), 1, failure(result))
        self.assertIn("round trip mismatch at ['state_dict']['k']", failure(result))

    def test_bad_arguments_say_the_fix(self) -> None:
        for args, words in (
            ((Scaled(1.0),), "takes an ExportedProgram, got Scaled: pass torch.export.export(module, args)"),
            ((program(), torch.ones(1)), "is a list of argument tuples"),
        ):
            with self.subTest(words=words):
                result, recs, _ = run_export(lambda test: test.round_trip_export(*args))
                self.assertIn(RoundTripConfigError.__name__, failure(result))
                self.assertIn(words, failure(result))
                self.assertEqual(recs, [])

    def test_without_the_mixin_the_class_is_refused_at_creation(self) -> None:
        with self.assertRaisesRegex(RoundTripConfigError, r"write class TestX\(ExportRoundTrips, Serialization"):
            type("TestX", (ExportRoundTrips, unittest.TestCase), {})

    def test_a_torch_without_export_save_skips_saying_so(self) -> None:
        with mock.patch.object(torch, "export", mock.Mock(spec=["export"])):
            reason = export_skip_reason()
            result, recs, _ = run_export(lambda test: test.round_trip_export(None))
        self.assertIn("has no torch.export.save/load (torch >= 2.1)", reason)
        self.assertEqual([str(why) for _, why in result.skipped], [reason])
        self.assertEqual(recs, [])


class TestTorchLoadOfAnExportArchive(unittest.TestCase):
    def test_the_refusal_is_torchs_own_words_for_a_real_archive(self) -> None:
        buf = io.BytesIO()
        torch.export.save(program(), buf)
        layout = export.probe_layout(zipfile.ZipFile(io.BytesIO(buf.getvalue())).namelist())
        for weights_only in (True, False):  # owned bytes, and torch fails before it unpickles anything
            kind, message = no_data_pkl_refusal(weights_only, layout)
            with self.subTest(weights_only=weights_only), self.assertRaises(kind) as caught:
                torch.load(io.BytesIO(buf.getvalue()), weights_only=weights_only)
            self.assertIs(type(caught.exception), kind)
            self.assertEqual(str(caught.exception), message)
            self.assertRegex(message, "data.pkl|not in a subdirectory")  # torch's reader: no data.pkl, or a flat zip

    def test_refused_in_every_mode_as_not_a_checkpoint(self) -> None:
        for mode in ("weights_only_false", "safe_globals", "default"):
            with self.subTest(mode=mode):
                result, recs, _ = run_export(lambda test: test.round_trip_export_torch_load(program()), mode)
                if mode in MODE_SKIPS:
                    self.assertEqual(len(result.skipped), 1)
                    continue
                self.assertTrue(result.wasSuccessful(), failure(result))
                self.assertEqual([(r.kind, r.mode, r.loaded) for r in recs], [("torch.load", mode, False)])
                self.assertIn(NOT_A_CHECKPOINT, recs[0].summary)
                self.assertNotIn("not allowlisted", recs[0].summary)

    def test_a_torch_that_reads_it_fails(self) -> None:
        with mock.patch("torch.load", return_value={}):
            result, recs, _ = run_export(lambda test: test.round_trip_export_torch_load(program()))
        self.assertIn(UnexpectedLoadOutcome.__name__, failure(result))
        self.assertIn("expected torch.load to refuse it", failure(result))
        self.assertEqual(recs, [])

    def test_the_probe_is_asked_once(self) -> None:
        known = no_data_pkl_refusal()
        with mock.patch.object(export, "_no_data_pkl", {}):
            self.assertEqual(no_data_pkl_refusal(), known)
            self.assertEqual(export._no_data_pkl, {(True, ()): known})
            with mock.patch.object(export, "probe_archive", side_effect=AssertionError("asked again")):
                self.assertEqual(no_data_pkl_refusal(), known)

    def test_a_probe_that_does_not_refuse_fails_loudly(self) -> None:
        with (
            mock.patch.object(export, "_no_data_pkl", {}),
            mock.patch.object(export, "probe_archive", return_value=(None, "nowhere")),
        ):
            with self.assertRaisesRegex(ProbeFailed, r"without data\.pkl raised NoneType in nowhere"):
                no_data_pkl_refusal(weights_only=False)


if __name__ == "__main__":
    unittest.main()
