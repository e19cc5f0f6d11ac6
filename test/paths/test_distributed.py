"""The world-size dimension (:mod:`torch_serial_testing.paths.distributed`): its test ids, what the parent test
reports of its ranks (a failure with its rank and traceback, a hang, a leak, a skip, the loads), that nothing
outlives a test (no rank process, no file), that gloo stays on 127.0.0.1, how unittest, a script, pytest and
pytest-xdist run a multi-rank file, and what DCP's ``.metadata`` is on this torch."""

import os
import pickle
import re
import subprocess
import sys
import tempfile
import time
import unittest
from unittest import mock

import torch

from test.helpers.subprocess_env import child_env
from test.paths import distributed_fixtures as fixtures
from test.paths.test_distributed_ports import NO_DTENSOR
from torch_serial_testing import SerializationRoundTripTestCase, instantiate_round_trip_tests
from torch_serial_testing.errors import RoundTripConfigError
from torch_serial_testing.outcomes import records
from torch_serial_testing.paths import distributed
from torch_serial_testing.paths.distributed import MultiRankRoundTrips, at_world_sizes

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MISSING = distributed.unavailable()


class TestWorldSizeIds(unittest.TestCase):
    def test_each_test_once_per_world_size_before_the_cores_dimensions(self):
        class TestX(MultiRankRoundTrips, SerializationRoundTripTestCase, unittest.TestCase):
            world_sizes = (1, 3)
            devices = ("cpu",)
            load_modes = ("default", "safe_globals")

            def test_a(self, device):
                pass

            @at_world_sizes(2)
            def test_b(self, device):
                pass

        self.assertEqual(
            sorted(n for n in vars(TestX) if n.startswith("test")),
            ["test_a_world_size_1", "test_a_world_size_3", "test_b_world_size_2"],
        )
        scope = {"__name__": __name__}
        (cpu,) = instantiate_round_trip_tests(TestX, scope)
        self.assertEqual(
            sorted(n for n in vars(cpu) if n.startswith("test")),
            [
                "test_a_world_size_1_default_cpu",
                "test_a_world_size_1_safe_globals_cpu",
                "test_a_world_size_3_default_cpu",
                "test_a_world_size_3_safe_globals_cpu",
                "test_b_world_size_2_default_cpu",
                "test_b_world_size_2_safe_globals_cpu",
            ],
        )

    def test_bad_world_sizes_fail_at_class_creation(self):
        for bad in ((0,), (2.0,), 2, ()):
            with self.subTest(bad=bad), self.assertRaisesRegex(RoundTripConfigError, "world_sizes"):
                type("TestBad", (MultiRankRoundTrips, SerializationRoundTripTestCase, unittest.TestCase),
                     {"world_sizes": bad, "test_a": lambda self: None})  # fmt: skip
        with self.assertRaisesRegex(RoundTripConfigError, "world sizes are positive ints"):
            at_world_sizes(-1)

    def test_outside_a_rank_there_is_no_shared_folder(self):
        test = fixtures.Ranks("test_rank_one_fails_world_size_2")
        self.assertEqual((test.rank, test.world_size), (0, 1))
        with self.assertRaisesRegex(RoundTripConfigError, "shared_dir exists only while"):
            print(test.shared_dir)


def run_fixture(name):
    """Run ``fixtures.Ranks.<name>_world_size_2`` here; (result, the test, its failure text or '')."""
    test = fixtures.Ranks(f"{name}_world_size_2")
    result = unittest.TestResult()
    with tempfile.TemporaryDirectory() as private, mock.patch.object(tempfile, "tempdir", private):
        test.run(result)  # the library's folder for the ranks is made in `private`
        if left := os.listdir(private):
            raise AssertionError(f"left behind: {left}")
    text = "\n".join(tb for _t, tb in result.failures + result.errors)
    return result, test, text


def alive(pid):
    """Whether *pid* runs (a zombie, exited but not yet reaped by whoever adopted it, does not)."""
    try:
        with open(f"/proc/{pid}/status") as fh:
            return "\nState:\tZ" not in fh.read()
    except FileNotFoundError:
        return False
    except OSError:  # no /proc: ask the kernel
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True


def assert_gone(case, pid_dir):
    for name in os.listdir(pid_dir):
        pid = int(open(os.path.join(pid_dir, name)).read())
        with case.subTest(rank_file=name), case.assertRaises(ProcessLookupError):
            os.kill(pid, 0)


@unittest.skipIf(MISSING, MISSING or "")
class TestWhatTheParentReports(unittest.TestCase):
    def test_a_failing_rank_with_its_rank_and_traceback(self):
        result, _test, text = run_fixture("test_rank_one_fails")
        self.assertEqual((len(result.failures), len(result.errors)), (1, 0), text)
        self.assertIn("rank 1 of 2: FAIL in test_rank_one_fails_world_size_2", text)
        self.assertIn('self.assertEqual(self.rank, 0, "only rank 0 passes")', text)  # the rank's own frame
        self.assertIn("AssertionError: 1 != 0 : only rank 0 passes", text)
        self.assertNotIn("rank 0 of 2", text)

    def test_a_hung_rank_is_killed_at_the_timeout(self):
        with tempfile.TemporaryDirectory() as pids, mock.patch.dict(os.environ, {fixtures.PID_DIR_ENV: pids}):
            result, _test, text = run_fixture("test_rank_one_hangs")
            self.assertEqual(len(result.failures), 1, text)
            self.assertIn("rank 1 of 2 did not finish within the test's rank_timeout of 8 s", text)
            self.assertNotIn("rank 0 of 2", text)
            self.assertEqual(sorted(os.listdir(pids)), ["rank0.pid", "rank1.pid"])
            assert_gone(self, pids)

    def test_the_ranks_end_when_the_test_process_is_killed(self):
        test_id = "test.paths.distributed_fixtures.Ranks.test_rank_one_hangs_world_size_2"
        with tempfile.TemporaryDirectory() as pids, tempfile.TemporaryDirectory() as tmp:
            env = child_env({fixtures.PID_DIR_ENV: pids, "TMPDIR": tmp}, path_first=(ROOT,))
            proc = subprocess.Popen([sys.executable, "-m", "unittest", test_id], cwd=ROOT, env=env,
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
            try:
                deadline = time.monotonic() + 300
                while not os.path.exists(os.path.join(pids, "rank1.pid")) and time.monotonic() < deadline:
                    time.sleep(0.1)
                time.sleep(0.2)  # the pid written in full
            finally:
                proc.kill()  # SIGKILL: no cleanup of its own runs
                proc.wait()
            rank1 = int(open(os.path.join(pids, "rank1.pid")).read())
            deadline = time.monotonic() + 30
            while alive(rank1) and time.monotonic() < deadline:
                time.sleep(0.1)
            self.assertFalse(alive(rank1), "the hung rank outlived its test process")

    def test_the_others_are_killed_soon_after_a_rank_failed(self):
        with tempfile.TemporaryDirectory() as pids, mock.patch.dict(os.environ, {fixtures.PID_DIR_ENV: pids}):
            with mock.patch.object(distributed, "GRACE", 1.0):
                result, _test, text = run_fixture("test_rank_zero_fails_rank_one_waits")
            self.assertIn("rank 0 of 2: ERROR in", text)
            self.assertIn("ValueError: rank 0 broke", text)
            self.assertIn("rank 1 of 2 was still running 1 s after rank 0 failed", text)
            self.assertNotIn("rank_timeout", text)  # not the 8 s timeout: the grace
            assert_gone(self, pids)

    def test_a_leak_in_a_rank_fails_as_in_process(self):
        _result, _test, text = run_fixture("test_leaks_a_safe_global")
        for rank in (0, 1):
            self.assertRegex(text, rf"rank {rank} of 2: FAIL in (.|\n)*leaked global state \(now restored\): "
                             r"safe-globals registry changed \(added \['time.sleep'\]")  # fmt: skip

    def test_skipped_in_every_rank_is_a_skip(self):
        result, _test, text = run_fixture("test_skips_everywhere")
        self.assertEqual([why for _t, why in result.skipped], ["skipped in every rank: nothing to do here"], text)

    def test_skipped_in_one_rank_only_fails(self):
        _result, _test, text = run_fixture("test_skips_in_rank_one")
        self.assertIn("rank 1 skipped (rank 1 has no GPU) while other ranks ran it", text)

    def test_every_ranks_loads_are_the_tests_records_and_gloo_is_on_loopback(self):
        result, test, text = run_fixture("test_loads_and_sockets")
        self.assertTrue(result.wasSuccessful(), text)
        recs = records(test)
        self.assertEqual(sorted(r.summary.split(":")[0] for r in recs), ["rank 0", "rank 1"])
        self.assertTrue(all(r.loaded and r.mode == "default" and r.kind == "torch.load" for r in recs), recs)


SCRIPT = "test/paths/distributed_script.py"
PASSED = "TestScriptCPU.test_passes_world_size_2_default_cpu"
FAILED = "TestScriptCPU.test_fails_in_rank_one_world_size_2_default_cpu"


@unittest.skipIf(MISSING, MISSING or "")
class TestRunners(unittest.TestCase):
    def run_child(self, *args):
        proc = subprocess.run(
            [sys.executable, *args], cwd=ROOT, env=child_env({"PYTHONDONTWRITEBYTECODE": "1"}, path_first=(ROOT,)),
            capture_output=True, text=True, timeout=900,
        )  # fmt: skip
        return proc.returncode, proc.stdout + proc.stderr

    def check(self, code, out, passed, failed):
        self.assertEqual(code, 1, out)
        self.assertRegex(out, passed, out)
        self.assertRegex(out, failed, out)
        self.assertIn("rank 1 of 2: FAIL in test_fails_in_rank_one_world_size_2_default_cpu", out)
        self.assertIn("AssertionError: 1 == 1 : rank one says no", out)

    def test_unittest_module(self):
        code, out = self.run_child("-m", "unittest", "-v", "test.paths.distributed_script")
        self.check(code, out, re.escape(PASSED) + r"\) \.\.\. .*ok", re.escape(FAILED) + r"\) \.\.\. FAIL")

    def test_script(self):
        code, out = self.run_child(SCRIPT, "-v")
        self.check(code, out, re.escape(PASSED) + r"\) \.\.\. .*ok", re.escape(FAILED) + r"\) \.\.\. FAIL")

    def test_pytest_xdist(self):
        code, out = self.run_child("-m", "pytest", "-p", "no:cacheprovider", "-n", "2", "-rA", SCRIPT)
        self.check(code, out, "PASSED " + re.escape(SCRIPT + "::" + PASSED.replace(".", "::")),
                   "FAILED " + re.escape(SCRIPT + "::" + FAILED.replace(".", "::")))  # fmt: skip
        self.assertIn("1 failed, 1 passed", out)


@unittest.skipIf(MISSING, MISSING or "")
class TestTheHowToFile(unittest.TestCase):
    """docs/howto-distributed.rst: its complete test file runs green, making exactly the tests it lists."""

    def test_the_complete_file_runs_and_makes_the_tests_it_lists(self):
        text = open(os.path.join(ROOT, "docs", "howto-distributed.rst"), encoding="utf-8").read()
        section = text.split("A complete test file", 1)[1]
        self.assertIn(".. literalinclude:: examples/test_sharded_checkpoints.py\n", section)
        with open(os.path.join(ROOT, "docs", "examples", "test_sharded_checkpoints.py"), encoding="utf-8") as fh:
            code = fh.read()
        listed = re.findall(r"^   (TestShardedCheckpointsCPU\.\w+)$", section.split("makes these tests::", 1)[1], re.M)
        self.assertEqual(len(listed), 5)
        with tempfile.TemporaryDirectory() as folder:
            with open(os.path.join(folder, "test_sharded_checkpoints.py"), "w", encoding="utf-8") as fh:
                fh.write(code)
            proc = subprocess.run(
                [sys.executable, "-m", "unittest", "-v", "test_sharded_checkpoints"], cwd=folder,
                env=child_env({"PYTHONDONTWRITEBYTECODE": "1"}), capture_output=True, text=True, timeout=1800,
            )  # fmt: skip
        out = proc.stdout + proc.stderr
        self.assertEqual(proc.returncode, 0, out[-5000:])
        ran = re.findall(r"^\w+ \(test_sharded_checkpoints\.(\S+)\) \.\.\. .*ok$", out, re.M)
        skipped = re.findall(r"^\w+ \(test_sharded_checkpoints\.(\S+)\) \.\.\. skipped '(.*)'$", out, re.M)
        # every test needs a public DTensor: where this torch has none (the ports' probe), each skips saying so
        self.assertEqual(sorted(ran), [] if NO_DTENSOR else sorted(listed), out[-3000:])
        self.assertEqual(sorted(name for name, _why in skipped), sorted(listed) if NO_DTENSOR else [], out[-3000:])
        for _name, why in skipped:
            self.assertRegex(why, r"has no public DTensor \(torch\.distributed\.tensor\.DTensor\)")


CALLED = []


def record(what):
    CALLED.append(what)
    return {}


class Runs:
    def __reduce__(self):
        return record, ("the .metadata pickle ran code",)


@unittest.skipIf(MISSING, MISSING or "")
class TestDCPMetadataIsAPlainPickle(unittest.TestCase):
    """DCP's ``FileSystemReader`` reads ``.metadata`` with ``pickle.load``: no ``weights_only``, even forced on."""

    def test_read_metadata_runs_what_the_pickle_says_even_under_the_force_switch(self):
        import torch.distributed.checkpoint as dcp

        with tempfile.TemporaryDirectory() as folder:
            with open(os.path.join(folder, distributed.METADATA), "wb") as fh:
                pickle.dump(Runs(), fh)
            wo_names, full_names = distributed.scan_dcp_metadata(folder)
            CALLED.clear()
            with mock.patch.dict(os.environ, {"TORCH_FORCE_WEIGHTS_ONLY_LOAD": "1"}):
                with self.assertRaises(Exception):  # it ran, then the result is no Metadata
                    dcp.FileSystemReader(folder).read_metadata()
        self.assertEqual(CALLED, ["the .metadata pickle ran code"])
        self.assertEqual(full_names, (f"{__name__}.record",))  # the scan names it, nothing executed
        self.assertEqual(wo_names, (f"{__name__}.record",))

    def test_torch_load_refuses_the_same_pickle(self):
        CALLED.clear()
        with tempfile.TemporaryDirectory() as folder:
            path = os.path.join(folder, "x.pt")
            torch.save(Runs(), path)
            with self.assertRaisesRegex(pickle.UnpicklingError, "Weights only load failed"):
                torch.load(path, weights_only=True)
        self.assertEqual(CALLED, [])


if __name__ == "__main__":
    unittest.main()
