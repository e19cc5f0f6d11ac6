"""Older or future torch, simulated by changing what torch does (the library asks torch by probes).

A torch before 2.6 is a torch whose bare ``torch.load`` loads in full; a torch before 2.5 lacks
``torch.serialization.safe_globals``; a future torch without quantization supports no engine.
Each is made by changing torch's behaviour, and the library must follow it.  The real releases are
the nox sessions' matrix (``noxfile.py``); its table (``tools/compat_table.py``) and the sdist's
contents are checked here too.
"""

import contextlib
import csv
import io
import os
import re
import subprocess
import sys
import tempfile
import textwrap
import unittest
from unittest import mock

import torch

from test.helpers.roundtrip_fixtures import (
    DEFAULT_WEIGHTS_ONLY,
    MODE_SKIPS,
    RUNNABLE_MODES,
    SAFE_GLOBALS_SKIP,
    TINY_SAFE_GLOBALS,
    TinyNet,
    clean_env,
)
from torch_serial_testing import Checkpoint, LoadMode, UnexpectedLoadOutcome, instantiate_round_trip_tests
from torch_serial_testing import loading as load_modes
from torch_serial_testing.prediction import predict
from torch_serial_testing.declarations import normalize_safe_globals
from torch_serial_testing.modes import torch_default_weights_only
from torch_serial_testing.unpickler import ProbeFailed
from test.helpers.other_torches import as_genuine_load
from test.helpers.python_compat import decorator_skipped, expected_tests_run
from test.helpers.subprocess_env import child_env
from test.testing.test_instantiation import make_generic, run

TINY = normalize_safe_globals(TINY_SAFE_GLOBALS)


@contextlib.contextmanager
def bare_load_default(behaviour):
    """torch's bare ``torch.load`` made weights-only (True), a full load (False), or broken (an
    exception, raised where torch decides the default).  Where torch decides it in
    ``torch.serialization._default_to_weights_only`` (>= 2.6) that function is replaced; an older
    torch has none, and its ``torch.serialization.load`` is wrapped to decide the same way."""

    def decide(pickle_module=None):
        if isinstance(behaviour, BaseException):
            raise behaviour
        return behaviour

    if hasattr(torch.serialization, "_default_to_weights_only"):
        with mock.patch.object(torch.serialization, "_default_to_weights_only", decide):
            yield
        return
    real = torch.serialization.load

    def load(f, *args, weights_only=None, **kwargs):
        return real(f, *args, weights_only=decide() if weights_only is None else weights_only, **kwargs)

    with (
        mock.patch.object(torch.serialization, "load", load),
        mock.patch.object(torch, "load", load),
        as_genuine_load(load),  # the library calls torch's own load only: the wrapper plays it
    ):
        yield


class TestOlderTorch(unittest.TestCase):
    def test_without_safe_globals_context_the_mode_skips_visibly(self):
        generic = make_generic(devices=("cpu",))
        (cls,) = instantiate_round_trip_tests(generic, {})
        had_context = hasattr(torch.serialization, "safe_globals")  # torch >= 2.5
        reason = (
            f"the safe_globals mode needs torch.serialization.safe_globals (torch >= 2.5); "
            f"torch {torch.__version__} lacks it"
        )
        with contextlib.ExitStack() as stack:
            if had_context:  # hide it; a torch before 2.5 really lacks it, nothing to hide there
                stack.enter_context(mock.patch.object(torch.serialization, "safe_globals"))
                del torch.serialization.safe_globals
            self.assertFalse(hasattr(torch.serialization, "safe_globals"))
            self.assertEqual(load_modes.mode_skip_reason(LoadMode.SAFE_GLOBALS), reason)
            result, out = run([cls])
            with self.assertRaises(unittest.SkipTest) as cm:
                load_modes.load(Checkpoint.save(TinyNet()), "safe_globals", TINY)
            self.assertEqual(str(cm.exception), reason)
        self.assertEqual(hasattr(torch.serialization, "safe_globals"), had_context)
        self.assertTrue(result.wasSuccessful(), out)
        skipped = sorted(t.id().rsplit(".", 1)[1] for t, _ in result.skipped)
        self.assertEqual(skipped, ["test_nodevice_safe_globals_cpu", "test_rt_safe_globals_cpu"])
        self.assertEqual([r for _, r in result.skipped], [reason, reason])

    def test_safe_globals_skip_fact_matches_this_torch(self):
        # The facts the tests derive their expectations from (roundtrip_fixtures), checked against
        # torch itself: only the safe_globals mode can skip, exactly where torch lacks the context.
        has_context = hasattr(torch.serialization, "safe_globals")
        self.assertEqual(set(MODE_SKIPS), set() if has_context else {"safe_globals"})
        self.assertEqual(SAFE_GLOBALS_SKIP is None, has_context)
        self.assertEqual(RUNNABLE_MODES, tuple(m for m in LoadMode if has_context or m is not LoadMode.SAFE_GLOBALS))
        if not has_context:
            self.assertEqual(
                SAFE_GLOBALS_SKIP,
                f"the safe_globals mode needs torch.serialization.safe_globals (torch >= 2.5); "
                f"torch {torch.__version__} lacks it",
            )

    def test_before_the_default_flip_default_is_expected_to_load(self):
        # torch before 2.6: a bare torch.load is a full load.  Simulated by torch's behaviour (its
        # bare torch.load loads in full); the version string only words the reason.
        ckpt = Checkpoint.save(TinyNet())
        with clean_env(), bare_load_default(False), mock.patch.object(torch, "__version__", "2.5.1"):
            self.assertEqual(torch_default_weights_only(), (False, "the default before torch 2.6 (torch 2.5.1)"))
            exp = predict(LoadMode.DEFAULT, ckpt, environ={})
            result = load_modes.load(ckpt, LoadMode.DEFAULT)
        self.assertEqual((exp.weights_only, exp.loads, exp.unknown), (False, True, None))
        self.assertEqual(exp.reason, "weights_only=False the default before torch 2.6 (torch 2.5.1)")
        # and torch really did that: the full load of the owned checkpoint went through
        self.assertTrue(result.loaded)
        self.assertIsInstance(result.value, TinyNet)
        self.assertEqual(
            result.summary,
            "default: loaded as expected (weights_only=False the default before torch 2.6 (torch 2.5.1))",
        )
        # torch's behaviour, not the version string, decides: a bare load that is weights-only
        # under the same version string is predicted (and is) a rejection.
        with clean_env(), bare_load_default(True), mock.patch.object(torch, "__version__", "2.5.1"):
            self.assertEqual(torch_default_weights_only(), (True, "since torch 2.6"))
            exp = predict(LoadMode.DEFAULT, ckpt, environ={})
            result = load_modes.load(ckpt, LoadMode.DEFAULT)
        self.assertEqual((exp.weights_only, exp.loads), (True, False))
        self.assertFalse(result.loaded)
        self.assertIn("test.helpers.roundtrip_fixtures.TinyNet not allowlisted", result.summary)
        # Asked again once torch is itself again (the answers are remembered per torch function):
        self.assertEqual(torch_default_weights_only()[0], DEFAULT_WEIGHTS_ONLY)
        with mock.patch.object(torch, "__version__", "2.5.1"):  # the version string alone changes nothing
            self.assertEqual(torch_default_weights_only()[0], DEFAULT_WEIGHTS_ONLY)
            self.assertEqual(predict(LoadMode.DEFAULT, ckpt, environ={}).weights_only, DEFAULT_WEIGHTS_ONLY)

    def test_fbcode_style_default(self):
        # A torch >= 2.6 built to keep the old default (fbcode): asked, not inferred from the version.
        with clean_env(), bare_load_default(False), mock.patch.object(torch, "__version__", "2.13.0"):
            self.assertEqual(torch_default_weights_only(), (False, "this torch build (fbcode) keeps the old default"))
            exp = predict(LoadMode.DEFAULT, Checkpoint.save(TinyNet()), environ={})
        self.assertEqual((exp.weights_only, exp.loads), (False, True))
        self.assertEqual(exp.reason, "weights_only=False this torch build (fbcode) keeps the old default")

    def test_a_default_that_cannot_be_asked_is_unknown_never_guessed(self):
        # torch's bare load breaks (here: the function deciding its default raises): the canary
        # cannot answer, so the prediction is unknown and a load says so instead of guessing.
        ckpt = Checkpoint.save(TinyNet())
        with clean_env(), bare_load_default(LookupError("simulated: the default cannot be decided")):
            with self.assertRaisesRegex(
                ProbeFailed,
                r"^torch\.load of the library's canary raised LookupError: "
                r"simulated: the default cannot be decided$",
            ):
                torch_default_weights_only()
            exp = predict(LoadMode.DEFAULT, ckpt, environ={})
            with self.assertRaises(UnexpectedLoadOutcome) as cm:
                load_modes.load(ckpt, LoadMode.DEFAULT)
            # the explicit modes do not depend on the default: still predicted
            explicit = predict(LoadMode.WEIGHTS_ONLY_FALSE, ckpt, environ={})
        self.assertEqual(
            exp.unknown,
            "torch.load of the library's canary raised LookupError: simulated: the default cannot be decided",
        )
        self.assertEqual(exp.reason, "what torch.load decides here is unknown")
        self.assertEqual(
            exp.summary(False),
            "default: rejected, not predicted (what torch.load decides here is "
            "unknown; torch.load of the library's canary raised LookupError: "
            "simulated: the default cannot be decided)",
        )
        # loaded all the same (torch raised from its bare load), and reported as not predicted
        self.assertEqual(
            str(cm.exception),
            "default: cannot predict this load here (torch.load of the library's "
            "canary raised LookupError: simulated: the default cannot be decided); "
            "torch rejected it:\nsimulated: the default cannot be decided",
        )
        self.assertEqual((explicit.unknown, explicit.weights_only, explicit.loads), (None, False, True))
        # nothing of the failure is remembered: torch itself again answers as before
        self.assertEqual(torch_default_weights_only()[0], DEFAULT_WEIGHTS_ONLY)

    def test_a_generated_test_whose_default_cannot_be_asked_fails_saying_so(self):
        generic = make_generic(devices=("cpu",), load_modes=("default", "weights_only_false"))
        (cls,) = instantiate_round_trip_tests(generic, {})
        with bare_load_default(LookupError("simulated")):
            result, out = run([cls])
        failed = {t.id().rsplit(".", 1)[1]: text for t, text in result.failures + result.errors}
        self.assertEqual(sorted(failed), ["test_rt_default_cpu"], out)
        self.assertIn(
            "UnexpectedLoadOutcome: default: cannot predict this load here (torch.load of the library's "
            "canary raised LookupError: simulated); torch rejected it:\nsimulated\n",
            failed["test_rt_default_cpu"],
        )
        self.assertIn("test_rt_weights_only_false_cpu", out)
        self.assertEqual(result.testsRun, 4)


class TestFutureTorchWithoutQuantization(unittest.TestCase):
    def test_engine_tests_skip_with_reason_rest_keeps_working(self):
        generic = make_generic(qengines=("fbgemm", "qnnpack"), devices=("cpu",), load_modes=("weights_only_false",))
        (cls,) = instantiate_round_trip_tests(generic, {})
        # A build without quantized engines: torch reports none (torch.backends.quantized reads this).
        with mock.patch.object(torch._C, "_supported_qengines", lambda: []):
            self.assertEqual(torch.backends.quantized.supported_engines, [])
            result, out = run([cls])
            self.assertTrue(load_modes.round_trip(TinyNet(), "weights_only_false").loaded)
        self.assertTrue(result.wasSuccessful(), out)
        total = unittest.defaultTestLoader.loadTestsFromTestCase(cls).countTestCases()
        self.assertGreater(total, 0)
        self.assertEqual(len(result.skipped), total)  # every one of them skipped
        # skipped while running (the engine is gone since instantiation): counted on every Python
        self.assertEqual(result.testsRun, expected_tests_run(total, decorator_skipped(cls)))
        self.assertIn("not supported by this torch build", result.skipped[0][1])
        self.assertIn("supported: none", result.skipped[0][1])

    def test_flagship_file_skips_when_sparse_quantization_is_gone(self):
        # A torch without torch.ao.nn.sparse: the flagship still imports, and its tests skip with the reason.
        here = os.path.dirname(os.path.abspath(__file__))
        code = textwrap.dedent("""
            import sys, unittest
            import torch  # torch itself imports torch.ao.nn.sparse; forget it, then block re-imports
            for name in [m for m in sys.modules if m.startswith("torch.ao.nn.sparse")]:
                del sys.modules[name]
            class _Gone:
                def find_spec(self, name, path=None, target=None):
                    if name.startswith("torch.ao.nn.sparse"):
                        raise ImportError("simulated: torch.ao.nn.sparse was removed")
            sys.meta_path.insert(0, _Gone())
            import test_qlinear_packed_params as m
            suite = unittest.defaultTestLoader.loadTestsFromModule(m)
            result = unittest.TextTestRunner(verbosity=0).run(suite)
            reasons = sorted({r for _, r in result.skipped})
            print("RESULT", suite.countTestCases(), len(result.skipped), len(result.errors) + len(result.failures), reasons)
        """)
        proc = subprocess.run(
            [sys.executable, "-c", code],
            cwd=os.path.join(here, "ao", "sparsity"),
            capture_output=True,
            text=True,
            env=child_env(),
        )
        self.assertEqual(proc.returncode, 0, proc.stderr)
        # Our line, not what imports print (torch < 2.6's common_utils reports a missing hypothesis).
        (line,) = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
        total, skipped, bad, reasons = line[len("RESULT ") :].split(" ", 3)  # every test skipped
        self.assertEqual(total, skipped)
        self.assertGreater(int(total), 0)
        self.assertEqual(bad, "0")
        self.assertIn("torch.ao.nn.sparse", reasons)


# What pytest (8) writes with --junitxml for a unittest pass, failure and two skips, and a pytest skip.
JUNIT = """<?xml version="1.0" encoding="utf-8"?><testsuites name="pytest tests"><testsuite name="pytest" errors="0"\
 failures="1" skipped="3" tests="5" time="0.046" timestamp="2026-12-02T13:41:02.007692+00:00" hostname="vm">\
<testcase classname="test_x.T" name="test_fail" time="0.001"><failure message="AssertionError: 1 != 2">self = \
&lt;test_x.T testMethod=test_fail&gt;

E   AssertionError: 1 != 2</failure></testcase><testcase classname="test_x.T" name="test_ok" time="0.001" />\
<testcase classname="test_x.T" name="test_skip" time="0.001"><skipped type="pytest.skip" message="torch 2.4.1 lacks \
safe_globals">/tmp/jx/test_x.py:4: torch 2.4.1 lacks safe_globals</skipped></testcase>\
<testcase classname="test_x.T" name="test_skip2" time="0.001"><skipped type="pytest.skip" message="torch 2.4.1 lacks \
safe_globals">/tmp/jx/test_x.py:4: torch 2.4.1 lacks safe_globals</skipped></testcase>\
<testcase classname="test_x" name="test_pskip" time="0.000"><skipped type="pytest.skip" message="needs two devices">\
/tmp/jx/test_x.py:6: needs two devices</skipped></testcase></testsuite></testsuites>"""


class TestCompatTable(unittest.TestCase):
    """``tools/compat_table.py``: the compat sessions' JUnit XML, stamped, summarised into the docs' CSV."""

    def setUp(self):
        from tools import compat_table

        self.table = compat_table
        tmp = tempfile.TemporaryDirectory()
        self.addCleanup(tmp.cleanup)
        self.xml = os.path.join(tmp.name, "compat-3.11-torch-2.4.1.xml")

    def write(self, failing=True):
        text = JUNIT if failing else re.sub(r"<failure .*?</failure>", "", JUNIT, flags=re.S)
        with open(self.xml, "w", encoding="utf-8") as fh:
            fh.write(text)

    def test_a_run_becomes_its_row_with_failures_first_then_skips_grouped_by_reason(self):
        self.write()
        self.table.stamp(self.xml, 1, "2.4.1+cu121", "3.11.7")
        row = self.table.summarise(self.xml)
        notes = "test_x.T.test_fail; torch lacks safe_globals (x2); needs two devices (x1)"
        self.assertEqual(row, ("2.4.1+cu121", "3.11.7", 1, 3, 1, notes))
        self.assertFalse(row.ok)
        # pytest's own counts are left as they were; the stamp goes first in the suite, once
        self.table.stamp(self.xml, 0, "2.4.1+cu121", "3.11.7")
        suite = self.table.ET.parse(self.xml).getroot().find("testsuite")
        self.assertEqual((suite[0].tag, suite.get("tests")), ("properties", "5"))
        self.assertEqual(len(suite.findall("properties/property")), 3)

    def test_a_failed_run_without_failing_tests_is_a_failure(self):
        # pytest exited non-zero (files left in the temporary directory, a crash): never a green row
        self.write(failing=False)
        self.table.stamp(self.xml, 3, "2.13.0+cpu", "3.11.7")
        row = self.table.summarise(self.xml)
        self.assertEqual(row[2:5], (2, 3, 1))
        self.assertTrue(row.notes.startswith("pytest exited 3; torch lacks safe_globals (x2)"), row.notes)
        os.remove(self.xml)  # pytest wrote nothing at all
        self.table.stamp(self.xml, 4, "2.13.0+cpu", "3.11.7")
        self.assertEqual(
            self.table.summarise(self.xml), ("2.13.0+cpu", "3.11.7", 0, 0, 1, "pytest exited 4 without results")
        )

    def test_the_command_writes_the_csv_and_exits_by_the_rows(self):
        out = self.xml + ".csv"
        for failing, status in ((False, 0), (True, 1)):
            self.write(failing)
            self.table.stamp(self.xml, int(failing), "2.4.1+cu121", "3.11.7")
            with contextlib.redirect_stdout(io.StringIO()) as printed:
                self.assertEqual(self.table.main(["--csv", out, self.xml]), status)
            with open(out, encoding="utf-8", newline="") as fh:
                self.assertEqual(fh.read(), printed.getvalue())
        self.write(failing=False)
        with contextlib.redirect_stdout(io.StringIO()):
            self.table.main(["--csv", out, self.xml])  # not stamped: pytest's XML alone
        with open(out, encoding="utf-8", newline="") as fh:
            rows = list(csv.reader(fh))
        self.assertEqual(rows[0], list(self.table.CSV_HEADER))
        self.assertEqual(rows[1], ["?", "?", "2", "3", "0", "torch lacks safe_globals (x2); needs two devices (x1)"])


class TestSourceDistribution(unittest.TestCase):
    def test_manifest_ships_what_the_tests_and_readme_need(self):
        # What `pytest test` in an unpacked sdist needs (support modules, test/ao/, README, docs),
        # and what README documents (tools/, bench/, LICENSE), must be matched by MANIFEST.in.
        # `nox -s sdist` does the real thing: check-manifest, build, install, run the suite from the sdist.
        try:
            from setuptools.command.egg_info import FileList
        except ImportError:
            self.skipTest("setuptools is not installed: cannot evaluate MANIFEST.in")
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        needed = {
            "LICENSE",
            "README.rst",
            "CHANGELOG.rst",
            "setup.cfg",
            "setup.py",
            "MANIFEST.in",
            ".ci/run",
            "noxfile.py",
        }
        needed |= {"pytest.ini", "ruff.toml"}  # the suite's and the linters' configuration
        # every file of these folders, whatever its kind (the test backend's C++ source was once
        # left out because only *.py was asked for); caches and hidden folders are not sources
        for folder in ("test", "tools", "bench", "docs"):
            for dirpath, dirnames, filenames in os.walk(os.path.join(root, folder)):
                dirnames[:] = [d for d in dirnames if d not in ("__pycache__", "_build") and not d.startswith(".")]
                needed |= {
                    os.path.relpath(os.path.join(dirpath, f), root)
                    for f in filenames
                    if not f.endswith((".pyc", ".pyo")) and not f.startswith(".")
                }
        self.assertIn("test/ao/sparsity/test_qlinear_packed_params.py", needed)
        self.assertIn("test/helpers/subprocess_env.py", needed)
        self.assertIn("test/npu_backend/npu_backend.cpp", needed)
        cwd = os.getcwd()
        os.chdir(root)  # FileList works on paths relative to the project root
        try:
            files = FileList()
            files.findall(".")
            with open("MANIFEST.in", encoding="utf-8") as fh:
                for line in fh:
                    if line.strip() and not line.lstrip().startswith("#"):
                        files.process_template_line(line.strip())
        finally:
            os.chdir(cwd)
        shipped = {os.path.normpath(f) for f in files.files}
        self.assertEqual(sorted(needed - shipped), [])
        self.assertFalse([f for f in shipped if "__pycache__" in f or f.endswith(".pyc")])


if __name__ == "__main__":
    unittest.main()
