"""predict() against the real torch.load: the differential corpus (CI subset) and the API it exercises.

* the TORCH_FORCE_* truthiness asked of the running torch (and of torch-2.8- and 2.5-like
  stand-ins of ``torch.serialization.load``),
* predict()/load() taking safe globals in every form the mixin takes (R0),
* required_globals()'s unambiguous keyword forms,
* the CI subset of the differential matrix: every corpus kind, fewer formats and environment
  states, compared in fresh processes (``python -m tools.differential --full`` runs it all).
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import unittest
from unittest import mock

import torch

from test.helpers.other_torches import load_standin, switch_reader
from test.helpers.roundtrip_fixtures import TinyNet
from torch_serial_testing import Checkpoint, CheckpointInfo, load, predict, required_globals
from torch_serial_testing import modes as load_call
from torch_serial_testing.errors import CheckpointFormatError, RoundTripConfigError
from torch_serial_testing.declarations import declared_entries
from torch_serial_testing.unpickler import ProbeFailed
from torch_serial_testing.tools import facts
from torch_serial_testing.tools import required_globals as tools_required_globals

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from tools.differential import corpus, corpus_classes, oracle, worker  # noqa: E402
from tools.differential.cases import CI_ENVS, CI_FORMATS  # noqa: E402

WO, NO = load_call.FORCE_WO, load_call.FORCE_NO_WO

#: torch.load's switch reading as torch 2.8 wrote it: raw values, compared case-sensitively.
TORCH_28_LIKE = dict(lower=False)
#: torch 2.5-like: one switch, lower-cased, and a full load by default.
TORCH_25_LIKE = dict(reads_no=False, default=False)


def _forced_weights_only_by_torch(value: str) -> bool:
    """Whether this torch's real torch.load, weights_only=False, is forced weights-only by *value*."""
    data = io.BytesIO()
    torch.save(TinyNet(), data)  # needs a global outside torch's allowlist
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCH_FORCE_")}
    env[WO] = value
    with mock.patch.dict(os.environ, env, clear=True):
        data.seek(0)
        try:
            torch.load(data, weights_only=False)
        except Exception:  # noqa: BLE001 - the forced weights-only load refuses TinyNet
            return True
    return False


def _both_refused_by_torch() -> bool:
    """Whether this torch's real torch.load refuses every load with both switches set (>= 2.6)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCH_FORCE_")}
    data = io.BytesIO()
    torch.save({"x": 1}, data)
    with mock.patch.dict(os.environ, {**env, WO: "1", NO: "1"}, clear=True):
        data.seek(0)
        try:
            torch.load(data)
        except RuntimeError:
            return True
    return False


class TestSwitchReadings(unittest.TestCase):
    def test_running_torch_is_asked(self) -> None:
        found, _any_case, _strips = facts.truthy_spellings(WO)
        self.assertTrue({"1", "y", "yes", "true"} <= set(found))
        self.assertEqual(list(found), [s for s in facts.CANDIDATE_SPELLINGS if _forced_weights_only_by_torch(s)])

    def test_predicted_truthiness_matches_a_real_load(self) -> None:
        for value in ("1", "Y", "true", "TRUE", "YES", "yes ", " 1", "on", "0", ""):
            with self.subTest(value=value):
                self.assertEqual(load_call.is_truthy(value, WO), _forced_weights_only_by_torch(value))
                exp = predict("weights_only_false", Checkpoint.save(TinyNet()), environ={WO: value})
                self.assertEqual(exp.weights_only, _forced_weights_only_by_torch(value))

    def test_torch_28_compares_case_sensitively(self) -> None:
        with load_standin(switch_reader(**TORCH_28_LIKE)):
            for name in (WO, NO):
                self.assertTrue(load_call.is_truthy("true", name))
                self.assertFalse(load_call.is_truthy("TRUE", name))
                self.assertFalse(load_call.is_truthy("Y", name))
            self.assertIn("case-sensitive", facts.describe_spellings(WO))
            self.assertTrue(facts.torch_reads_force_no_weights_only())

    def test_prediction_on_a_torch_28_like_reading(self) -> None:
        with load_standin(switch_reader(**TORCH_28_LIKE)):
            switches = facts.WeightsOnlySwitches.from_environ({WO: "TRUE", NO: "yes"})
            self.assertEqual((switches.force_weights_only, switches.force_no_weights_only), (False, True))
            exp = predict("weights_only_false", Checkpoint.save(TinyNet()), environ={WO: "TRUE"})
            self.assertEqual((exp.weights_only, exp.loads), (False, True))
            exp = predict("weights_only_false", Checkpoint.save(TinyNet()), environ={WO: "true"})
            self.assertEqual((exp.weights_only, exp.loads), (True, False))

    def test_doctor_names_this_torchs_spellings(self) -> None:
        from torch_serial_testing.tools.cli import doctor

        problems: list[str] = []
        with load_standin(switch_reader(**TORCH_28_LIKE)):
            active, text = doctor._force_effect(WO, "TRUE", False, problems)
        self.assertFalse(active)
        self.assertIn("case-sensitive", text)
        self.assertIn("case-sensitive", problems[0])

    def test_torch_25_like_reads_one_switch(self) -> None:
        with load_standin(switch_reader(**TORCH_25_LIKE)):
            self.assertTrue(load_call.is_truthy("Yes", WO))
            self.assertFalse(load_call.is_truthy("1", NO))
            self.assertFalse(facts.torch_reads_force_no_weights_only())
            self.assertFalse(facts.WeightsOnlySwitches.from_environ({WO: "1", NO: "1"}).conflict)

    def test_without_an_answer_nothing_is_decided(self) -> None:
        # Formerly, without torch's source, the version decided which switches it reads; now a
        # canary load that cannot run decides nothing, and the predictions say so.
        def broken(*args, **kwargs):
            raise OSError("no torch.serialization.load here")

        with load_standin(broken), mock.patch.object(torch, "__version__", "2.5.1"):
            with self.assertRaisesRegex(ProbeFailed, "canary raised OSError"):
                facts.torch_reads_force_no_weights_only()
            exp = predict("default", Checkpoint.save(TinyNet()), environ={NO: "1"})
            self.assertIn("canary raised OSError: no torch.serialization.load here", exp.unknown)
        # Asked of torch again: the second switch exactly where this torch's load reads it (>= 2.6).
        self.assertEqual(facts.torch_reads_force_no_weights_only(), _both_refused_by_torch())
        self.assertEqual(facts.WeightsOnlySwitches.from_environ({WO: "1", NO: "1"}).conflict, _both_refused_by_torch())


class TestPredictArguments(unittest.TestCase):
    """R0: predict() takes safe globals in every form the mixin does, and only predicts."""

    def setUp(self) -> None:
        self.checkpoint = Checkpoint.save(TinyNet())
        self.needed = required_globals(self.checkpoint)

    def test_objects_strings_and_tuples(self) -> None:
        objects = [sys.modules["test.helpers.roundtrip_fixtures"].TinyNet] + (
            [set] if "builtins.set" in self.needed else []
        )
        for declared in (objects, self.needed, [(o, n) for o, n in zip(objects, sorted(self.needed))]):
            with self.subTest(declared=declared):
                self.assertTrue(predict("safe_globals", self.checkpoint, declared).loads)
        self.assertFalse(predict("safe_globals", self.checkpoint, []).loads)

    def test_objects_with_their_own_name_attribute(self) -> None:
        class Sub(torch.Tensor):
            pass

        np = __import__("numpy")
        exp = predict("safe_globals", self.checkpoint, [Sub, np.dtype])
        self.assertFalse(exp.loads)  # TinyNet is still missing, and nothing is misread
        self.assertEqual(declared_entries([Sub, np.dtype])[1][1], "numpy.dtype")
        self.assertTrue(declared_entries([Sub])[0][1].endswith("Sub"))
        # the real torch agrees: a subclass declared as an object loads
        result = load(
            Checkpoint.save(torch.ones(2).as_subclass(corpus_classes.MyTensor)),
            "safe_globals",
            [corpus_classes.MyTensor],
        )
        self.assertTrue(result.loaded)
        self.assertTrue(
            predict(
                "safe_globals",
                Checkpoint.save(torch.ones(2).as_subclass(corpus_classes.MyTensor)),
                [corpus_classes.MyTensor],
            ).loads
        )

    def test_predict_refuses_nothing(self) -> None:
        exp = predict("safe_globals", self.checkpoint, [os.system, "os.system", (print, "builtins.eval")])
        self.assertFalse(exp.loads)

    def test_bad_arguments_name_the_fix(self) -> None:
        with self.assertRaisesRegex(RoundTripConfigError, r"order is predict\(mode, checkpoint"):
            predict(self.checkpoint, "default")  # type: ignore[arg-type]
        with self.assertRaisesRegex(RoundTripConfigError, r"order is load\(checkpoint, mode"):
            load("default", self.checkpoint)  # type: ignore[arg-type]
        with self.assertRaisesRegex(RoundTripConfigError, "tuple or list"):
            predict("safe_globals", self.checkpoint, "test.helpers.roundtrip_fixtures.TinyNet")
        with self.assertRaisesRegex(RoundTripConfigError, r"must be \(object, 'module.Name'\)"):
            predict("safe_globals", self.checkpoint, [(TinyNet,)])

    def test_predict_reads_bytes_and_buffers(self) -> None:
        data = self.checkpoint.rewound().getvalue()
        for form in (data, io.BytesIO(data)):
            self.assertEqual(predict("default", form), predict("default", self.checkpoint))


class TestRequiredGlobalsForms(unittest.TestCase):
    #: A file given to the core's required_globals: the tools read files.
    FILE_REFUSAL = (
        "required_globals({!r}): a file is read by torch_serial_testing.tools.required_globals(path); "
        "to get the globals of the str object itself, call required_globals(obj=...)"
    )

    def test_keywords_say_what_is_meant(self) -> None:
        data = Checkpoint.save(TinyNet()).rewound().getvalue()
        expected = required_globals(TinyNet())
        self.assertIn("test.helpers.roundtrip_fixtures.TinyNet", expected)
        self.assertEqual(required_globals(checkpoint=data), expected)
        self.assertEqual(required_globals(checkpoint=io.BytesIO(data)), expected)
        self.assertEqual(required_globals(obj=data), required_globals(obj=b"x"))
        self.assertEqual(required_globals(obj=TinyNet()), expected)
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "ckpt.pt")
            with open(path, "wb") as fh:
                fh.write(data)
            self.assertEqual(tools_required_globals(path), expected)  # files: the tools' reader
            self.assertEqual(required_globals(obj=path), required_globals(obj="x"))
            with self.assertRaises(TypeError) as cm:
                required_globals(checkpoint=path)
            self.assertEqual(str(cm.exception), self.FILE_REFUSAL.format(path))
            with self.assertRaisesRegex(TypeError, "unexpected keyword argument 'path'"):
                required_globals(path=path)  # type: ignore[call-arg]

    def test_positional_forms(self) -> None:
        data = Checkpoint.save(TinyNet()).rewound().getvalue()
        self.assertEqual(required_globals(data), required_globals(checkpoint=data))
        with self.assertRaises(CheckpointFormatError) as cm:
            required_globals(b"not a checkpoint")
        self.assertEqual(
            str(cm.exception),
            "not a zip archive (the first bytes are b'not '): torch.save has written zip archives since torch 1.6; "
            "read other formats (legacy streams, tar archives) and files with "
            "torch_serial_testing.tools.scan_checkpoint",
        )
        # A positional str is never guessed to be a path any more: the core reads no files.
        for value in ("no/such/file.pt", __file__):
            with self.subTest(value=value):
                with self.assertRaises(TypeError) as cm:
                    required_globals(value)
                self.assertEqual(str(cm.exception), self.FILE_REFUSAL.format(value))
        with self.assertRaisesRegex(TypeError, "exactly one of"):
            required_globals(data, obj=data)
        with self.assertRaisesRegex(TypeError, "exactly one of"):
            required_globals()

    def test_the_tools_read_every_format(self) -> None:
        buf = io.BytesIO()
        torch.save(TinyNet(), buf, _use_new_zipfile_serialization=False)
        legacy = buf.getvalue()
        with self.assertRaisesRegex(CheckpointFormatError, r"^not a zip archive .*tools\.scan_checkpoint$"):
            required_globals(legacy)
        self.assertEqual(tools_required_globals(legacy), required_globals(TinyNet()))


class TestOracleComparison(unittest.TestCase):
    """The comparison flags what it must (so a green matrix means agreement, not blindness)."""

    def _pred(self, **kw):
        # weights-only on every torch (a bare load is a full one before torch 2.6): it names TinyNet
        exp = predict("safe_globals", Checkpoint.save(TinyNet()), environ={})
        base = {"outcome": "rejects", "warns": False, "missing": list(exp.missing), "opcodes": [], "_exp": exp}
        base.update(kw)
        return base

    def test_disagreements_are_flagged(self) -> None:
        ok_act = {"outcome": "loads", "warned": False}
        self.assertIsNone(worker.compare(self._pred(outcome="loads"), ok_act, "k", "zip-p2", None))
        self.assertIn("torch loaded", worker.compare(self._pred(), ok_act, "k", "zip-p2", None))
        self.assertIn("warning", worker.compare(self._pred(outcome="loads", warns=True), ok_act, "k", "zip-p2", None))
        refused = {
            "outcome": "rejects",
            "warned": False,
            "type": "UnpicklingError",
            "message": "GLOBAL foo.Bar was not an allowed global by default.",
        }
        self.assertIn("names a global", worker.compare(self._pred(), refused, "k", "zip-p2", None))
        refused["message"] = f"GLOBAL {self._pred()['missing'][0]} was not an allowed global by default."
        self.assertIsNone(worker.compare(self._pred(), refused, "k", "zip-p2", None))
        refused["type"] = "RuntimeError"
        self.assertIn("exception type", worker.compare(self._pred(), refused, "k", "zip-p2", None))
        conflict = {"outcome": "conflict", "warned": False, "type": "RuntimeError"}
        self.assertIn("conflict", worker.compare(self._pred(), conflict, "k", "zip-p2", None))

    def test_only_a_crash_of_an_explicit_full_load_is_torch_side(self) -> None:
        items = worker.work_items([7, 8], probe=False)
        full = next(i for i, (p, _) in enumerate(items) if worker.PASSES[p] == ("weights_only_false",))
        other = next(i for i, (p, _) in enumerate(items) if "weights_only_false" not in worker.PASSES[p])
        crash = "process died (-11) "
        # a crash in the pass that only loads weights_only=False, with no forced weights-only load: torch's
        self.assertEqual(
            oracle.torch_side_failures([({}, [{"i": full, "id": items[full][1], "crash": crash}])], items),
            {items[full][1]: f"weights_only=False: torch crashed: {crash}"},
        )
        # the same pass where TORCH_FORCE_WEIGHTS_ONLY_LOAD may make it weights-only, or another pass: not
        forced = {oracle.FORCE_WO: "YES"}
        self.assertEqual(
            oracle.torch_side_failures([(forced, [{"i": full, "id": items[full][1], "crash": crash}])], items), {}
        )
        self.assertEqual(
            oracle.torch_side_failures([({}, [{"i": other, "id": items[other][1], "crash": crash}])], items), {}
        )


class TestOracleCommand(unittest.TestCase):
    def test_unknown_kind_is_named(self) -> None:
        from tools.differential.__main__ import main

        with self.assertRaisesRegex(SystemExit, "unknown kinds: no_such_kind"):
            main(["--kinds", "tensor_float32,no_such_kind"])

    def test_every_kind_builds_or_says_why(self) -> None:
        self.assertGreaterEqual(len(corpus.kinds()), 153)
        for kind, engine in corpus.LOAD_QENGINE.items():
            self.assertIn(kind, corpus.kinds())
            self.assertIn(engine, ("qnnpack", "fbgemm", "x86", "onednn"))
        self.assertTrue(corpus.SCRIPT_KINDS <= set(corpus.kinds()))


#: The unpickler-model causes of issue #12 (R1-R6), owned by the scanner's model of torch's
#: weights-only unpickler.  Until that model is in this tree (CheckpointInfo.weights_only_blocker),
#: their disagreements are reported as a skip naming them; once it is, they fail like any other.
MODEL_CAUSES = ("R1 ", "R2 ", "R3 ", "R4 ", "R5 ", "R6 ")
MODEL_IN_TREE = "weights_only_blocker" in getattr(CheckpointInfo, "__dataclass_fields__", {})


def _is_model_cause(cause: str) -> bool:
    return any(label in cause for label in MODEL_CAUSES)


class TestWorkerTemporaryFiles(unittest.TestCase):
    """A worker that dies on a case runs no exit handlers: its temporary files go with the run's folder."""

    # Stands in for tools/differential/worker.py (same arguments, same progress records): makes a
    # temporary folder as torch 2.8 does at import, then dies on the first case and passes the second.
    DYING_WORKER = textwrap.dedent(
        """
        import json, os, sys, tempfile
        manifest, out, start, role = sys.argv[1:]
        made = tempfile.mkdtemp()
        with open(out, "a") as fh:
            fh.write(json.dumps({"begin": int(start), "made": made}) + "\\n")
            fh.flush()
            if start == "0":
                os._exit(7)
            fh.write(json.dumps({"i": int(start), "made": made}) + "\\n")
        """
    )

    def test_a_dying_workers_temporary_folder_is_inside_the_run(self) -> None:
        with tempfile.TemporaryDirectory() as here:
            script = os.path.join(here, "dying_worker.py")
            with open(script, "w") as fh:
                fh.write(self.DYING_WORKER)
            run = os.path.join(here, "run")
            os.mkdir(run)
            with mock.patch.object(oracle, "WORKER", script):
                records = oracle.run_worker(run, "t", "run", {}, [], timeout=120, n_items=2)
            self.assertEqual([r.get("i") for r in records], [1, 0], records)
            self.assertIn("process died (7)", records[1]["crash"])
            with open(os.path.join(run, "t.jsonl")) as fh:
                made = [json.loads(line)["made"] for line in fh if "begin" in line]
            self.assertEqual(len(made), 2)
            for folder in made:
                self.assertEqual(os.path.dirname(os.path.realpath(folder)), os.path.realpath(run))
            self.assertTrue(os.path.isdir(made[0]), "the dying worker's folder is removed only with the run's")

    def test_the_run_folder_is_the_childs_temporary_directory(self) -> None:
        with tempfile.TemporaryDirectory() as run:
            proc = subprocess.run(
                [sys.executable, "-c", "import tempfile; print(tempfile.gettempdir())"],
                env=oracle._subprocess_env({WO: "1"}, run),
                capture_output=True,
                text=True,
                timeout=120,
            )
            self.assertEqual(proc.returncode, 0, proc.stderr)
            self.assertEqual(os.path.realpath(proc.stdout.strip()), os.path.realpath(run))
        # without a run folder the child keeps the caller's
        self.assertEqual(oracle._subprocess_env({}).get("TMPDIR"), os.environ.get("TMPDIR"))


class TestDifferentialCorpusCI(unittest.TestCase):
    """Every corpus kind x CI formats x CI environment states x 4 load variants, in fresh processes."""

    report: oracle.Report

    @classmethod
    def setUpClass(cls) -> None:
        cls.report = oracle.run(full=False, jobs=2)

    def test_every_kind_is_compared_or_visibly_excluded(self) -> None:
        self.assertEqual(self.report.envs, len(CI_ENVS))
        self.assertGreater(self.report.checkpoints, len(corpus.kinds()))
        self.assertEqual(self.report.cases, self.report.agreements + self.report.disagreement_total)
        excluded_everywhere = {e.kind for e in self.report.excluded if e.format == "*"} | {
            k
            for k in corpus.kinds()
            if all(any(e.kind == k and e.format == f for e in self.report.excluded) for f in CI_FORMATS if f != "jit")
        }
        compared = self.report.cases // max(1, self.report.envs)
        self.assertGreater(compared, 0)
        for e in self.report.excluded:
            self.assertTrue(e.error.strip(), f"exclusion without torch's reason: {e}")
        # A few kinds whose build or save torch refuses here; the rest reach the comparison.
        self.assertLess(len(excluded_everywhere), len(corpus.kinds()) // 4, sorted(excluded_everywhere))

    def test_no_library_side_disagreements(self) -> None:
        library = {c: n for c, n in self.report.disagreements.items() if MODEL_IN_TREE or not _is_model_cause(c)}
        self.assertEqual(library, {}, "\n" + self.report.details())

    def test_unpickler_model_causes(self) -> None:
        model = {c: n for c, n in self.report.disagreements.items() if _is_model_cause(c)}
        if model and not MODEL_IN_TREE:
            self.skipTest(
                "the weights-only unpickler model (R1-R6, branch scanner) is not in this tree; disagreements: "
                + "; ".join(f"{c} x{n}" for c, n in sorted(model.items()))
            )
        self.assertEqual(model, {}, "\n" + self.report.details())


if __name__ == "__main__":
    unittest.main()
