"""A replaced ``torch.load`` (torch_npu's) is judged by its outcome, never turned into skips.

torch_npu cannot be imported here, so ``npu_backend.fake_torch_npu`` reproduces what its
import does to serialization (see that module for the facts).  In-process tests install the
fake around each test; the flagship runs under it in a child process (the way torch_npu is
active on an Ascend machine from ``import torch`` on) in all four ``TORCH_FORCE_*`` states,
and every generated test must end exactly as under torch's own loader, with the replacement's
reporting differences written into the outcome text.
"""

import builtins
import contextlib
import io
import json
import os
import pickle
import re
import subprocess
import sys
import tempfile
import unittest
import warnings
from pathlib import Path
from unittest import mock

import torch

import torch_serial_testing as tst
from torch_serial_testing import Checkpoint
from torch_serial_testing.errors import ConflictingEnvironmentError, UnexpectedLoadOutcome
from torch_serial_testing.registry import registered_globals, restore_registry, snapshot_registry
from torch_serial_testing.serialization import torch_load_replacement

from npu_backend import fake_torch_npu
from test.helpers.isolation_fixtures import only_torchs_registrations
from test.helpers.python_compat import failure_ids, verbose_ids
from test.helpers.roundtrip_fixtures import (
    clean_env,
    DEFAULT_REASON,
    DEFAULT_WEIGHTS_ONLY,
    READS_FORCE_NO_WEIGHTS_ONLY,
    RUNNABLE_MODES,
    TINY_GLOBALS,
    TINY_SAFE_GLOBALS,
    TinyNet,
)
from test.test_flagship_environments import (
    FLAGSHIP_DIR,
    FLAGSHIP_MODULE,
    MODULE_GLOBALS,
    NO_LOAD_TESTS,
    both_forced_is_an_error,
    expected_load,
    round_trip_tests,
    running_tests,
    skipped_tests,
)

ROOT = Path(__file__).resolve().parents[2]
FORCE_WO = "TORCH_FORCE_WEIGHTS_ONLY_LOAD"
FORCE_NO_WO = "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD"
REPORT_ENV = "TORCH_SERIAL_TESTING_REPORT"
FAKE_LOAD = "npu_backend.fake_torch_npu.load"
REPLACED = f"torch.load is replaced by {FAKE_LOAD}, which "
REGISTERED_NOTE = f"runs with process-wide safe globals {fake_torch_npu.registered_name()}"
# ... and only that one: the globals torch registers itself (2.14: every builtin exception) are not listed.
REGISTERED_ONLY = re.escape(REGISTERED_NOTE) + r"[;)]"
#: What torch 2.14's distributed_c10d registers at import (torch's own: never in the note).
BUILTIN_EXCEPTIONS = [t for t in vars(builtins).values() if isinstance(t, type) and issubclass(t, BaseException)]
PRINTED_NOTE = f"printed the {FORCE_NO_WO} notice instead of warning"
REWORDED_NOTE = re.compile(
    r"worded the rejection itself \(UnpicklingError raised in npu_backend\.fake_torch_npu\.load, ending "
    r"'\[ERROR\] \S+ \(PID:\d+, Device:-1, RankID:-1\) ERR00010 PTA system call failed'\)"
)


class FakeInstalled(unittest.TestCase):
    def setUp(self):
        only_torchs_registrations(self)
        fake_torch_npu.install()
        self.addCleanup(fake_torch_npu.uninstall)


class TestTheFakeIsFaithful(FakeInstalled):
    """The fake does what torch_npu's loader does (so the library tests below mean something)."""

    def test_replaces_torch_load_only(self):
        self.assertIs(torch.load, fake_torch_npu.load)
        self.assertIsNot(torch.serialization.load, fake_torch_npu.load)
        self.assertEqual(torch_load_replacement(), FAKE_LOAD)
        self.assertIn(fake_torch_npu.registered_name(), registered_globals())

    def test_force_no_notice_is_printed_not_warned(self):
        if not READS_FORCE_NO_WEIGHTS_ONLY:
            self.skipTest("this torch does not read TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD (torch < 2.6)")
        buf = io.BytesIO()
        torch.save(TinyNet(), buf)
        buf.seek(0)
        out = io.StringIO()
        with (
            clean_env(**{FORCE_NO_WO: "1"}),
            warnings.catch_warnings(record=True) as caught,
            contextlib.redirect_stdout(out),
        ):
            warnings.simplefilter("always")
            self.assertIsInstance(torch.load(buf), TinyNet)
        self.assertIn(fake_torch_npu.FORCE_NO_NOTICE, out.getvalue())
        self.assertFalse([w for w in caught if FORCE_NO_WO in str(w.message)])

    def test_rejection_is_reworded_with_an_error_code(self):
        buf = io.BytesIO()
        torch.save(TinyNet(), buf)
        buf.seek(0)
        with self.assertRaises(pickle.UnpicklingError) as cm:
            torch.load(buf, weights_only=True)
        self.assertIn("test.helpers.roundtrip_fixtures.TinyNet", str(cm.exception))
        self.assertRegex(str(cm.exception), fake_torch_npu.ERROR_SUFFIX_PATTERN)

    def test_both_switches_raise_with_an_error_code(self):
        with clean_env(**{FORCE_WO: "1", FORCE_NO_WO: "1"}):
            if READS_FORCE_NO_WEIGHTS_ONLY:
                with self.assertRaisesRegex(RuntimeError, r"but both were set\.\n\[ERROR\] .* ERR00001 PTA"):
                    torch.load(io.BytesIO(b"unused"))
                return
            # torch < 2.6 reads only the first switch, and so does torch_npu: no conflict, a
            # weights-only load of the bytes (which are no checkpoint) fails on its own
            with self.assertRaises(Exception) as cm:
                torch.load(io.BytesIO(b"unused"))
            self.assertNotIn("both were set", str(cm.exception))

    def test_uninstall_restores_torch(self):
        fake_torch_npu.uninstall()
        self.assertIsNone(torch_load_replacement())
        self.assertNotIn(fake_torch_npu.registered_name(), registered_globals())
        fake_torch_npu.install()


class TestLibraryUnderTheFake(FakeInstalled):
    """Every mode gives torch's own verdict; the replacement's reporting is recorded, not judged."""

    def test_rejection_passes_and_records_the_rewording(self):
        if not DEFAULT_WEIGHTS_ONLY:
            self.skipTest("a bare torch.load is a full load on this torch: nothing to reject")
        with clean_env():
            result = tst.round_trip(TinyNet(), "default")
        self.assertFalse(result.loaded)
        self.assertTrue(
            result.summary.startswith(
                f"default: rejected as expected ({DEFAULT_REASON}; {', '.join(TINY_GLOBALS)} not allowlisted; {REPLACED}"
            ),
            result.summary,
        )
        self.assertRegex(result.summary, REWORDED_NOTE)
        self.assertRegex(result.summary, REGISTERED_ONLY)

    def test_force_no_loads_and_records_the_printed_notice(self):
        if not READS_FORCE_NO_WEIGHTS_ONLY:
            self.skipTest("this torch does not read TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD (torch < 2.6)")
        with clean_env(**{FORCE_NO_WO: "1"}), contextlib.redirect_stdout(io.StringIO()) as out:
            result = tst.round_trip(TinyNet(), "default")
        self.assertTrue(result.loaded)
        self.assertIsInstance(result.value, TinyNet)
        self.assertEqual(result.notes, (PRINTED_NOTE, REGISTERED_NOTE))
        self.assertIs(result.warned, False)
        self.assertEqual(
            result.summary,
            f"default: loaded as expected (weights_only=False forced by {FORCE_NO_WO}=1; {REPLACED}"
            f"{PRINTED_NOTE}; {REGISTERED_NOTE})",
        )
        # the notice still reaches the user: the library only watches it pass
        self.assertIn(fake_torch_npu.FORCE_NO_NOTICE, out.getvalue())

    def test_force_weights_only_and_the_other_modes(self):
        cases = [
            ({}, "weights_only_false", True),
            ({}, "safe_globals", True),
            ({FORCE_WO: "1"}, "weights_only_false", False),
            ({FORCE_WO: "1"}, "safe_globals", True),
            ({FORCE_WO: "1"}, "default", False),
        ]
        for env, mode, loads in cases:
            with self.subTest(env=env, mode=mode), clean_env(**env):
                result = tst.round_trip(TinyNet(), mode, safe_globals=TINY_SAFE_GLOBALS)
                self.assertIs(result.loaded, loads, result.summary)
                self.assertIn(REPLACED, result.summary)
                self.assertRegex(result.summary, REGISTERED_ONLY)
                if not loads:
                    self.assertRegex(result.summary, REWORDED_NOTE)

    def test_a_round_trip_test_starts_no_child_process(self):
        # Which registered globals are torch's own is told in the test process (registry.registered_by_torch):
        # a whole test -- setUp, round trips in every mode, the restore -- starts no process, and its
        # notes list only the replacement's global, not the ones torch registered itself (at import torch;
        # 2.14: every builtin exception, registered here as 2.14 does, before any test).
        from test.helpers.isolation_fixtures import run_tests
        from torch_serial_testing.tools import facts

        started = []

        def no_child(*args, **kwargs):
            started.append(repr(args)[:200])
            raise AssertionError("a round-trip test started a child process")

        snapshot = snapshot_registry()
        self.addCleanup(restore_registry, snapshot)
        torch.serialization.add_safe_globals(BUILTIN_EXCEPTIONS)
        summaries = []

        class RoundTrips(tst.SerializationRoundTripTestCase, unittest.TestCase):
            safe_globals = TINY_SAFE_GLOBALS

            def test_every_mode(self):
                for mode in RUNNABLE_MODES:  # (the safe_globals mode needs torch >= 2.5)
                    with self.subTest(mode=mode.value):
                        self.round_trip(TinyNet(), mode=mode)
                summaries.extend(self.round_trip_outcomes)

        with (
            clean_env(),
            mock.patch.dict(facts._own, clear=True),  # the tools' answer, were anything to ask for it
            mock.patch.object(subprocess.Popen, "_execute_child", no_child),
            mock.patch.object(os, "fork", no_child),
            mock.patch.object(os, "posix_spawn", no_child, create=True),
        ):
            result = run_tests(RoundTrips("test_every_mode"))
        self.assertEqual(started, [])
        self.assertEqual((result.errors, result.failures), ([], []))
        self.assertEqual(len(summaries), len(RUNNABLE_MODES), summaries)
        for summary in summaries:
            self.assertIn(REPLACED, summary)
            self.assertRegex(summary, REGISTERED_ONLY)
        registered = registered_globals()
        self.assertIn("builtins.ZeroDivisionError", registered)
        # (torch 2.13 and 2.14 also register the jagged nested tensor's classes at import; 2.15 does not)

    def test_doctor_says_when_torchs_own_registrations_are_unknown(self):
        # doctor (a tool) asks a fresh interpreter which registered globals are torch's own; when that
        # one cannot run, it lists them all and says why it cannot tell.
        from torch_serial_testing.tools import facts
        from torch_serial_testing.tools.cli.doctor import doctor_report

        with (
            clean_env(),
            mock.patch.dict(facts._own, clear=True),
            mock.patch.object(sys, "executable", "/bin/false"),
        ):
            report = doctor_report({})
        registered = ", ".join(sorted(registered_globals()))
        (explained,) = [p for p in report["problems"] if p.startswith(f"torch.load is replaced by {FAKE_LOAD}")]
        self.assertIn(
            f"registers its own safe globals (here, with torch's own: {registered}; which are torch's "
            "own is unknown: a fresh interpreter could not report torch's own registrations (",
            explained,
        )

    def test_both_switches_are_one_clear_error(self):
        if not READS_FORCE_NO_WEIGHTS_ONLY:
            self.skipTest("this torch does not read TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD (torch < 2.6)")
        with clean_env(**{FORCE_WO: "1", FORCE_NO_WO: "1"}):
            with self.assertRaisesRegex(ConflictingEnvironmentError, "are both set"):
                tst.round_trip(TinyNet(), "default")

    def test_a_wrong_outcome_still_fails(self):
        """A rejection that names none of the missing globals is a failure, replaced or not.

        (Loading what should be rejected, or the reverse, is covered in test_load_modes.)
        """

        def mute_load(f, *args, **kwargs):
            try:
                return fake_torch_npu.load(f, *args, **kwargs)
            except pickle.UnpicklingError:
                raise pickle.UnpicklingError("load failed") from None

        with clean_env(), mock.patch.object(torch, "load", mute_load):
            with self.assertRaisesRegex(
                UnexpectedLoadOutcome,
                r"^safe_globals: torch.load is replaced by \S*mute_load \(which worded the rejection itself.*\), "
                r"and it did not do what torch's own rules require: rejected, but the message names none of "
                r"the predicted causes \(globals " + re.escape(str(TINY_GLOBALS)),  # builtins.set too before torch 2.6
            ):
                tst.round_trip(TinyNet(), "safe_globals", safe_globals=())

    def test_foreign_bytes_are_still_only_loaded_weights_only(self):
        ckpt = Checkpoint.from_bytes(Checkpoint.save({"t": torch.ones(2)}).rewound().getvalue())
        with clean_env(**{FORCE_NO_WO: "1"}):
            with self.assertRaises(tst.UnsafeLoadRefused):
                tst.load(ckpt, "weights_only_false")
            if READS_FORCE_NO_WEIGHTS_ONLY:
                with self.assertRaises(tst.UnsafeLoadRefused):
                    tst.load(ckpt, "default")


def run_flagship_under_fake(extra_env):
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCH_FORCE_")}
    for name in (REPORT_ENV, "EXPECTTEST_ACCEPT"):
        env.pop(name, None)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), str(ROOT / "test"), os.environ.get("PYTHONPATH")) if p)
    env.update(extra_env)
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.jsonl"
        env[REPORT_ENV] = str(report)
        proc = subprocess.run(
            [sys.executable, "-m", "npu_backend.run", "--fake-torch-npu", "-m", "unittest", "-v", FLAGSHIP_MODULE],
            cwd=FLAGSHIP_DIR,
            env=env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=900,  # a hang guard only
        )
        records = [json.loads(line) for line in report.read_text().splitlines()] if report.exists() else []
    return proc, records


class TestFlagshipUnderFakeTorchNpu(unittest.TestCase):
    """The flagship under torch_npu's loader: torch's verdicts, no skip caused by the replacement."""

    maxDiff = None

    def run_ids(self, extra_env):
        proc, records = run_flagship_under_fake(extra_env)
        out = proc.stdout + proc.stderr
        expected_ids = set(round_trip_tests()) | set(NO_LOAD_TESTS)
        self.assertEqual(re.findall(r"^Ran (\d+) tests? in ", out, re.M), [str(len(expected_ids))], out[-3000:])
        self.assertEqual(set(verbose_ids(out)), expected_ids)
        # the only skips are the ones torch's own loader has too (a mode this torch lacks)
        self.assertEqual(len(re.findall(r" \.\.\. skipped ", out)), len(skipped_tests()), out[-5000:])
        self.assertNotIn("torch.load is replaced by npu_backend.fake_torch_npu.load; torch's own rules predicted", out)
        return proc, records, out

    def check(self, extra_env):
        if both_forced_is_an_error(extra_env):
            proc, records, out = self.run_ids(extra_env)
            self.assertEqual(proc.returncode, 1, out[-5000:])
            self.assertEqual(records, [], "no load may be attempted when both switches are set")
            blocks = [b for b in re.split(r"^={50,}\n", out, flags=re.M) if re.match(r"(ERROR|FAIL): ", b)]
            failed = set(failure_ids(out))  # a test's subtests each add a block
            self.assertEqual(failed, set(running_tests()))
            for block in blocks:
                self.assertIn(f"{FORCE_WO}=1 and {FORCE_NO_WO}=1 are both set", block)
            return
        proc, records, out = self.run_ids(extra_env)
        self.assertEqual(proc.returncode, 0, out[-5000:])
        by_test = {}
        for record in records:
            by_test.setdefault(record["test"], []).append(record)
        self.assertEqual(set(by_test), set(running_tests()))
        for test_id, (saved, mode, count) in running_tests().items():
            with self.subTest(test=test_id):
                loads, weights_only = expected_load(saved, mode, extra_env)
                self.assertEqual(len(by_test[test_id]), count)
                for record in by_test[test_id]:
                    summary = record["summary"]
                    self.assertIs(record["loaded"], loads, summary)
                    self.assertIs(record["weights_only"], weights_only, summary)
                    self.assertTrue(
                        summary.startswith(f"{mode}: {'loaded' if loads else 'rejected'} as expected ("), summary
                    )
                    self.assertIn(REPLACED, summary)
                    self.assertRegex(summary, REGISTERED_ONLY)
                    if not loads:
                        self.assertIn(f"{', '.join(MODULE_GLOBALS)} not allowlisted", summary)
                        self.assertRegex(summary, REWORDED_NOTE)
                    forced_no = mode == "default" and not weights_only and extra_env.get(FORCE_NO_WO)
                    self.assertIs(PRINTED_NOTE in summary, bool(forced_no and READS_FORCE_NO_WEIGHTS_ONLY), summary)
                    self.assertNotIn("torch warned", summary)
        if extra_env.get(FORCE_NO_WO) and READS_FORCE_NO_WEIGHTS_ONLY:
            self.assertIn(fake_torch_npu.FORCE_NO_NOTICE, proc.stdout)

    def test_unset(self):
        self.check({})

    def test_force_weights_only(self):
        self.check({FORCE_WO: "1"})

    def test_force_no_weights_only(self):
        self.check({FORCE_NO_WO: "1"})

    def test_both(self):
        self.check({FORCE_WO: "1", FORCE_NO_WO: "1"})


class TestDoctorExplainsAReplacedLoader(unittest.TestCase):
    def test_doctor_under_the_fake(self):
        env = {k: v for k, v in os.environ.items() if not k.startswith("TORCH_FORCE_")}
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(ROOT), str(ROOT / "test"), os.environ.get("PYTHONPATH")) if p
        )
        env["COLUMNS"] = "10000"  # the text is wrapped to the terminal: one line per problem here
        base = [sys.executable, "-m", "npu_backend.run", "--fake-torch-npu", "-m", "torch_serial_testing", "doctor"]
        text = subprocess.run(base, env=env, capture_output=True, text=True, timeout=300, cwd=ROOT)
        report = json.loads(
            subprocess.run(base + ["--json"], env=env, capture_output=True, text=True, timeout=300, cwd=ROOT).stdout
        )
        self.assertEqual(report["torch_load_replaced_by"], FAKE_LOAD)
        self.assertIn(fake_torch_npu.registered_name(), report["safe_globals"])
        explained = [p for p in report["problems"] if p.startswith(f"torch.load is replaced by {FAKE_LOAD}")]
        self.assertEqual(len(explained), 1, report["problems"])
        for phrase in (
            "judged by their outcome",
            "prints the TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD notice",
            "error-code suffix",
            "never skipped",
            "torch.serialization.load is still torch's own",
            # torch_npu's own, not those torch registers itself (2.14: every builtin exception)
            f"registers its own safe globals (here: {fake_torch_npu.registered_name()})",
        ):
            self.assertIn(phrase, explained[0])
        self.assertEqual(text.returncode, 1, text.stdout + text.stderr)
        self.assertIn(f"torch.load: REPLACED by {FAKE_LOAD}", text.stdout)
        self.assertIn(explained[0], text.stdout)


if __name__ == "__main__":
    unittest.main()
