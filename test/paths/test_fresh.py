"""The fresh-interpreter loads (:mod:`torch_serial_testing.paths.fresh`): what the fresh process imported, that each
load sees it unchanged, the switches it reads, its bounds in time and memory, the owned-bytes rule, the server's end."""

import os
import signal
import subprocess
import sys
import textwrap
import time
import unittest
from unittest import mock

import torch

from test.helpers.roundtrip_fixtures import WEIGHTS_ONLY_BARE_ENV
from test.helpers.subprocess_env import child_env
from test.paths.aolike import ScaledTensor
from test.test_flagship_environments import effective_weights_only
from torch_serial_testing import SerializationRoundTripTestCase
from torch_serial_testing.checkpoint import Checkpoint
from torch_serial_testing.errors import AllowlistError, RoundTripConfigError, UnexpectedLoadOutcome, UnsafeLoadRefused
from torch_serial_testing.outcomes import ExpectedRejection, records
from torch_serial_testing.paths import fresh
from torch_serial_testing.paths.fresh import FreshImportError, FreshInterpreterLoads, fresh_load
from torch_serial_testing.registry import restore_registry, snapshot_registry

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
WO = "TORCH_FORCE_WEIGHTS_ONLY_LOAD"
NO_SWITCHES = {WO: None, "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD": None}
# A test of what a weights-only load in the "default" mode does sets WEIGHTS_ONLY_BARE_ENV: nothing from torch 2.6
# (a bare load is weights-only), the force-on switch before (torch 2.4 reads it; its bare load is a full load)


class Plain:
    """Registered by a test's own add_safe_globals below: no import registers it."""


class Sleeps:
    def __reduce__(self):
        return (time.sleep, (30,))


class Big:
    def __reduce__(self):  # a GiB past the bound, zero pages: touching none of it, unbounded it would just work
        return (bytearray, ((fresh.MEMORY_MIB + 1024) * 2**20,))


class Allocates:
    def __reduce__(self):
        return (len, (Big(),))  # a small object back, whatever happens


def env(**values):
    """os.environ with the switches as given (None: unset), restored after."""
    merged = {**NO_SWITCHES, **values}
    patch = mock.patch.dict(os.environ)
    patch.start()
    for name, value in merged.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    return patch


@unittest.skipIf(fresh.fork_unavailable(), fresh.fork_unavailable() or "")
class TestFreshLoads(unittest.TestCase):
    def setUp(self):
        self.addCleanup(env().stop)
        self.addCleanup(restore_registry, snapshot_registry())

    def test_loads_in_each_mode_and_sends_the_object_back(self):
        obj = {"w": torch.arange(6.0).reshape(2, 3)}
        for mode in ("weights_only_false", "safe_globals", "default"):
            with self.subTest(mode=mode):
                result = fresh_load(Checkpoint.save(obj), mode, ("torch",))
                self.assertTrue(result.loaded)
                self.assertTrue(result.summary.startswith(f"{mode}: loaded as expected ("), result.summary)
                self.assertTrue(result.summary.endswith(" in a fresh interpreter importing torch"), result.summary)
                self.assertTrue(torch.equal(result.value["w"], obj["w"]))

    def test_the_server_imported_only_torch_and_the_library_from_an_isolated_path(self):
        hello = fresh.server(("torch",), fresh.__name__).hello
        self.assertNotIn("test.paths.test_fresh", hello["modules"])
        self.assertNotIn("test.paths.aolike", hello["modules"])
        self.assertNotIn("torch._dynamo", hello["modules"])  # the test process has it (nested tensors)
        self.assertNotIn("", hello["path"])
        self.assertNotEqual(hello["path"][0], os.getcwd())
        self.assertNotEqual(hello["pid"], os.getpid())

    def test_each_load_sees_the_server_unchanged(self):
        t = ScaledTensor.of(torch.ones(2), 2.0)
        # a full load imports test.paths.aolike, which registers ScaledTensor -- in that child only
        self.assertTrue(fresh_load(Checkpoint.save(t), "weights_only_false", ("torch",)).loaded)
        os.environ.update(WEIGHTS_ONLY_BARE_ENV)  # after: the force-on switch would make that load weights-only too
        with self.assertRaisesRegex(FreshImportError, r"because it imported test\.paths\.aolike, which registers it"):
            fresh_load(Checkpoint.save(t), "default", ("torch",))

    def test_the_switches_are_this_process_s_at_the_load(self):
        t = ScaledTensor.of(torch.ones(2), 2.0)
        self.assertTrue(fresh_load(Checkpoint.save(t), "weights_only_false", ("torch",)).loaded)
        os.environ[WO] = "1"
        with self.assertRaisesRegex(FreshImportError, r"weights_only_false: .*forced by TORCH_FORCE_WEIGHTS_ONLY_LOAD"):
            fresh_load(Checkpoint.save(t), "weights_only_false", ("torch",))

    def test_a_global_the_test_registered_is_named_as_no_import_s(self):
        os.environ.update(WEIGHTS_ONLY_BARE_ENV)
        torch.serialization.add_safe_globals([Plain])
        with self.assertRaisesRegex(FreshImportError, r"test_fresh\.Plain is allowed in this process, but no module"):
            fresh_load(Checkpoint.save(Plain()), "default", ("torch",))

    def test_a_rejection_both_make_is_a_rejection_not_a_failure(self):
        os.environ.update(WEIGHTS_ONLY_BARE_ENV)
        result = fresh_load(Checkpoint.save(Plain()), "default", ("torch",))
        self.assertFalse(result.loaded)
        self.assertIn("test.paths.test_fresh.Plain not allowlisted", result.summary)

    def test_a_declared_global_is_imported_there_as_a_user_declaring_it_would(self):
        for declared in ([Plain], [(Plain, "test.paths.test_fresh.Plain")], ["test.paths.test_fresh.Plain"]):
            with self.subTest(declared=declared):
                result = fresh_load(Checkpoint.save(Plain()), "safe_globals", ("torch",), safe_globals=declared)
                self.assertTrue(result.loaded, result.summary)
                self.assertIs(type(result.value), Plain)

    def test_forced_weights_only_a_declared_global_still_comes_back(self):
        # the switch decides the load there (weights-only, under the declaration); the object's way back, bytes the
        # test's own process tree just made, is not a torch.load of the test's and is never refused by it
        os.environ[WO] = "1"
        for mode in ("safe_globals", "weights_only_false"):
            with self.subTest(mode=mode):
                result = fresh_load(Checkpoint.save(Plain()), mode, ("torch",), safe_globals=[Plain])
                if mode == "weights_only_false":  # forced weights-only, and the declaration is the safe_globals mode's
                    self.assertFalse(result.loaded, result.summary)
                    self.assertIn("forced by TORCH_FORCE_WEIGHTS_ONLY_LOAD", result.summary)
                    continue
                self.assertTrue(result.loaded, result.summary)
                self.assertIs(type(result.value), Plain)
                self.assertEqual(os.environ.get(WO), "1")  # the switch as the test set it

    def test_foreign_bytes_send_back_no_object(self):
        os.environ.update(WEIGHTS_ONLY_BARE_ENV)  # a full load of them is refused (the next test)
        foreign = Checkpoint.from_bytes(Checkpoint.save(torch.ones(1)).rewound().read())
        result = fresh_load(foreign, "default", ("torch",))
        self.assertTrue(result.loaded)
        self.assertIsNone(result.value)

    def test_a_late_load_is_killed_naming_the_imports_and_the_load(self):
        with self.assertRaisesRegex(
            UnexpectedLoadOutcome, r"weights_only_false in a fresh interpreter importing torch: timed out after 2 s"
        ):
            fresh_load(Checkpoint.save(Sleeps()), "weights_only_false", ("torch",), timeout=2)
        self.assertTrue(fresh_load(Checkpoint.save(torch.ones(1)), "default", ("torch",)).loaded)  # server lives on

    @unittest.skipUnless(sys.platform.startswith("linux"), "RLIMIT_AS is enforced on Linux")
    def test_memory_is_bounded(self):
        with self.assertRaisesRegex(UnexpectedLoadOutcome, "MemoryError"):
            fresh_load(Checkpoint.save(Allocates()), "weights_only_false", ("torch",))

    def test_foreign_bytes_are_never_fully_loaded_there(self):
        foreign = Checkpoint.from_bytes(Checkpoint.save(torch.ones(1)).rewound().read())
        # weights_only_false, and the default mode where this torch's bare load is a full load (before torch 2.6)
        for mode in (m for m in ("weights_only_false", "default") if not effective_weights_only(m, {})):
            with self.subTest(mode=mode), self.assertRaisesRegex(UnsafeLoadRefused, "only Checkpoint.save"):
                fresh_load(foreign, mode, ("torch",))

    def test_bad_imports_say_how_to_write_them(self):
        cp = Checkpoint.save(torch.ones(1))
        for imports, message in (
            ("torch", "a tuple of module names"),
            (("numpy",), "must start with 'torch'"),
            (("torch", "no_such_module_h7"), "no module named 'no_such_module_h7'"),
        ):
            with self.subTest(imports=imports), self.assertRaisesRegex(RoundTripConfigError, message):
                fresh_load(cp, "default", imports)

    def test_without_fork_a_skip_says_why(self):
        with mock.patch.object(sys, "platform", "win32"), self.assertRaisesRegex(unittest.SkipTest, "os.fork"):
            fresh_load(Checkpoint.save(torch.ones(1)), "default", ("torch",))


class _Case(FreshInterpreterLoads, SerializationRoundTripTestCase, unittest.TestCase):
    def runTest(self):  # noqa: N802 - unittest's
        pass


@unittest.skipIf(fresh.fork_unavailable(), fresh.fork_unavailable() or "")
class TestTheMixin(unittest.TestCase):
    def case(self):
        case = _Case()
        case.setUp()
        self.addCleanup(case.doCleanups)
        return case

    def test_a_shared_rejection_ends_the_test_as_a_pass_and_is_recorded(self):
        self.addCleanup(env(**WEIGHTS_ONLY_BARE_ENV).stop)
        case = self.case()
        with self.assertRaises(ExpectedRejection):
            case.round_trip_fresh(Plain(), mode="default")
        (record,) = records(case)
        self.assertEqual(record.kind, "torch.load in a fresh interpreter (torch)")
        self.assertFalse(record.loaded)
        self.assertIn("Plain not allowlisted) in a fresh interpreter importing torch", record.summary)

    def test_a_declaration_missing_a_global_fails_as_in_process(self):
        with self.assertRaisesRegex(AllowlistError, r"misses 1 global\(s\) the checkpoint needs: .*test_fresh\.Plain"):
            self.case().round_trip_fresh(Plain(), mode="safe_globals", safe_globals=())

    def test_it_loads_and_returns_the_object(self):
        loaded = self.case().round_trip_fresh({"t": torch.ones(3)}, mode="safe_globals", safe_globals=())
        self.assertTrue(torch.equal(loaded["t"], torch.ones(3)))


@unittest.skipIf(fresh.fork_unavailable(), fresh.fork_unavailable() or "")
class TestTheServerEndsWithItsTestProcess(unittest.TestCase):
    def test_no_orphan_when_the_test_process_dies(self):
        code = textwrap.dedent(
            """
            import os, torch
            from torch_serial_testing.checkpoint import Checkpoint
            from torch_serial_testing.paths import fresh
            fresh.fresh_load(Checkpoint.save(torch.ones(1)), "default", ("torch",))
            print(fresh.server(("torch",), fresh.__name__).proc.pid, flush=True)
            os._exit(0)  # no atexit: only the closed pipe tells the server
            """
        )
        proc = subprocess.run(
            [sys.executable, "-c", code], cwd=ROOT, env=child_env(), capture_output=True, text=True, timeout=600
        )
        self.assertEqual(proc.returncode, 0, proc.stderr[-3000:])
        pid = int(proc.stdout.split()[-1])
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.1)
        os.kill(pid, signal.SIGKILL)  # the server this test started: never left behind
        self.fail(f"the server {pid} outlived its test process")


if __name__ == "__main__":
    unittest.main()
