"""Interrupts: a KeyboardInterrupt anywhere in a test or in a restore leaves the process restored.

unittest re-raises KeyboardInterrupt without running cleanups, so the mixin also
restores in a ``finally`` around the run.  These tests interrupt (1) from inside
``torch.load`` (a class's ``__setstate__``) in every mode, in tests with and
without an engine dimension, under unittest and under pytest; (2) at each step
of each restore, before and after the step did its work; (3) with real SIGINTs
at every bytecode of the restore code (``interrupt_campaign.py``, a subprocess).
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import unittest
from typing import Any, Callable
from unittest import mock

import torch

from torch_serial_testing import GlobalState, SerializationRoundTripTestCase, instantiate_round_trip_tests
from torch_serial_testing import isolation
from torch_serial_testing import engines, serialization as loader, registry

from test.helpers.isolation_fixtures import (
    Gate,
    LeakedGlobal,
    READS_FORCE_NO,
    clean_env,
    hook,
    other_engine,
    process_state,
    run_tests,
)
from test.helpers.roundtrip_fixtures import MODE_SKIPS

TEST_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROOT = os.path.dirname(TEST_DIR)
WO = "TORCH_FORCE_WEIGHTS_ONLY_LOAD"
NO_WO = "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD"


def _interrupt() -> None:
    raise KeyboardInterrupt("from __setstate__")


_real_load = torch.serialization.load


def _change_everything(test: Any) -> None:
    """What a test may change before it is interrupted (nothing that alters the load's outcome)."""
    torch.backends.quantized.engine = other_engine()
    if engines.allocator_installed() is False:
        torch._C._set_default_mobile_cpu_allocator()
    torch.serialization.add_safe_globals([LeakedGlobal])
    torch.load = functools.wraps(torch.load)(lambda *a, **k: _real_load(*a, **k))  # passes everything on
    torch._weights_only_unpickler._get_allowed_globals()["tst.Unused"] = LeakedGlobal  # names nothing loaded
    os.environ[WO] = "0"  # watched, falsy: torch reads it as unset
    try:
        from torch.utils.serialization import config

        # (load.mmap would break buffer loads; save.compute_crc32=False checkpoints the scanner rejects)
        config.save.use_pinned_memory_for_d2h = not config.save.use_pinned_memory_for_d2h
    except ImportError:
        pass


def _interrupted_class() -> type:
    class Interrupted(SerializationRoundTripTestCase, unittest.TestCase):
        safe_globals = (Gate, set)
        allow_unneeded_safe_globals = True  # set is on torch's allowlist since 2.6

        def check(self, mode: str) -> None:
            _change_everything(self)
            if mode == "default":
                os.environ[NO_WO] = "1"  # a bare load is then a full load: __setstate__ runs
            with hook(_interrupt):
                self.round_trip(Gate(), mode=mode)

        def test_weights_only_false(self) -> None:
            self.check("weights_only_false")

        def test_safe_globals(self) -> None:
            self.check("safe_globals")

        def test_default(self) -> None:
            self.check("default")

        def test_leak_everything(self) -> None:
            _change_everything(self)

        def test_change_then_round_trip(self) -> None:
            _change_everything(self)
            self.round_trip(Gate(), mode="safe_globals")

    return Interrupted


class StateCase(unittest.TestCase):
    def setUp(self) -> None:
        self.before = process_state()
        if self.before["allocator"] is None:
            self.skipTest("this torch has no mobile CPU allocator API")
        self.assertFalse(self.before["allocator"])

    def assertRestored(self) -> None:  # noqa: N802
        self.assertEqual(process_state(), self.before)


class TestInterruptInsideALoad(StateCase):
    def test_every_mode_without_engine_dimension(self) -> None:
        cls = _interrupted_class()
        for name in ("test_weights_only_false", "test_safe_globals", "test_default"):
            if name == "test_default" and not READS_FORCE_NO:
                continue  # torch < 2.6: a bare load is a full load without any switch; covered above
            with self.subTest(name), clean_env():
                skip = MODE_SKIPS.get(name[len("test_") :])
                if skip is not None:  # a mode this torch lacks (safe_globals before 2.5): skipped before any load
                    result = run_tests(cls(name))
                    self.assertEqual([(t.id(), r) for t, r in result.skipped], [(cls(name).id(), skip)])
                    # what check() changed before the skip is still reported as leaked, and restored
                    self.assertEqual(result.errors, [])
                    self.assertEqual(len(result.failures), 1, result.failures)
                    self.assertIn("LeakedGlobalStateError", result.failures[0][1])
                    self.assertIn("leaked global state (now restored)", result.failures[0][1])
                else:
                    with self.assertRaisesRegex(KeyboardInterrupt, "from __setstate__"):
                        run_tests(cls(name))
                self.assertRestored()

    def test_generated_engine_tests(self) -> None:
        class Generic(SerializationRoundTripTestCase, unittest.TestCase):
            safe_globals = (Gate, set)
            allow_unneeded_safe_globals = True
            qengines = ("fbgemm", "qnnpack")
            devices = ("cpu",)
            load_modes = ("weights_only_false",)

            def test_interrupted(self, device: str) -> None:
                torch.serialization.add_safe_globals([LeakedGlobal])
                with hook(_interrupt):
                    self.round_trip(Gate())

        scope: dict[str, Any] = {"__name__": __name__}
        (cls,) = instantiate_round_trip_tests(Generic, scope)
        for engine in ("qnnpack", "fbgemm"):
            if engine not in engines.supported_qengines():
                continue
            with self.subTest(engine), clean_env():
                with self.assertRaisesRegex(KeyboardInterrupt, "from __setstate__"):
                    run_tests(cls(f"test_interrupted_{engine}_weights_only_false_cpu"))
                self.assertRestored()

    def test_under_pytest_state_at_session_end(self) -> None:
        tmp = tempfile.mkdtemp(prefix="tst-interrupt-")
        self.addCleanup(__import__("shutil").rmtree, tmp, True)
        out = os.path.join(tmp, "state.json")
        with open(os.path.join(tmp, "conftest.py"), "w") as fh:
            fh.write(
                textwrap.dedent(f"""
                import json, sys
                sys.path.insert(0, {ROOT!r})

                def _state():
                    from test.helpers.isolation_fixtures import process_state
                    state = process_state()
                    del state["filters"]  # pytest's own warning capture changes them between the two hooks
                    state["config"] = sorted(state.get("config", {{}}).items())
                    return state

                def pytest_sessionstart(session):
                    session.config._tst_start = _state()

                def pytest_sessionfinish(session, exitstatus):
                    with open({out!r}, "w") as fh:
                        json.dump({{"exitstatus": int(exitstatus), "start": session.config._tst_start,
                                   "state": _state()}}, fh, default=str)
            """)
            )
        with open(os.path.join(tmp, "test_interrupted_under_pytest.py"), "w") as fh:
            fh.write(
                textwrap.dedent("""
                import unittest
                from test.testing.test_interrupts import _interrupted_class
                from torch_serial_testing import instantiate_round_trip_tests

                Interrupted = _interrupted_class()
            """)
            )
        env = {k: v for k, v in os.environ.items() if not k.startswith("TORCH_FORCE_")}
        env["PYTHONPATH"] = os.pathsep.join([ROOT, env.get("PYTHONPATH", "")])
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "pytest",
                "-q",
                "-p",
                "no:cacheprovider",
                "-o",
                "addopts=",
                "-p",
                "no:randomly",
                "--rootdir",
                tmp,
                os.path.join(tmp, "test_interrupted_under_pytest.py") + "::Interrupted::test_weights_only_false",
            ],
            cwd=tmp,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        self.assertIn("KeyboardInterrupt", proc.stdout + proc.stderr)
        with open(out) as fh:
            report = json.load(fh)
        self.assertEqual(report["exitstatus"], 2, proc.stdout[-2000:])  # pytest: interrupted
        state = report["state"]
        self.assertEqual(state, report["start"])  # engine, allocator, registry, env, config, hooks
        self.assertNotIn("test.helpers.isolation_fixtures.LeakedGlobal", state["registry"])
        self.assertEqual(state["env"], {})
        self.assertIs(state["allocator"], False)
        self.assertIs(state["recorder_installed"], False)
        self.assertIs(state["warnings_proxy_installed"], False)


def _once(original: Callable[..., Any], when: str) -> Callable[..., Any]:
    """*original*, but the first call raises KeyboardInterrupt before or after doing its work."""
    fired: list[bool] = []

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if not fired and when == "before":
            fired.append(True)
            raise KeyboardInterrupt(f"injected before {original.__name__}")
        value = original(*args, **kwargs)
        if not fired:
            fired.append(True)
            raise KeyboardInterrupt(f"injected after {original.__name__}")
        return value

    wrapper.__name__ = original.__name__
    return wrapper


RESTORE_STEPS = [
    "_restore_recording",
    "_restore_serialization",
    "_restore_engine",
    "_restore_allocator",
    "_restore_registry",
    "_restore_env",
    "_restore_config",
]


class TestInterruptInEachRestoreStep(StateCase):
    def test_global_state_steps(self) -> None:
        cls = _interrupted_class()
        for step in RESTORE_STEPS:
            for when in ("before", "after"):
                with self.subTest(step=step, when=when), clean_env():
                    patched = _once(getattr(GlobalState, step), when)
                    with mock.patch.object(GlobalState, step, patched):
                        with self.assertRaisesRegex(KeyboardInterrupt, f"injected {when} {step}"):
                            run_tests(cls("test_leak_everything"))
                    self.assertRestored()

    def test_registry_restore(self) -> None:
        # The registry itself is replaced in one step: never empty or half restored.
        cls = _interrupted_class()
        for when in ("before", "after"):
            with self.subTest(when=when), clean_env():
                patched = _once(registry.restore_registry, when)
                # where the test's restore calls it (isolation imported it from torch_facts.registry)
                with mock.patch.object(isolation, "restore_registry", patched):
                    with self.assertRaises(KeyboardInterrupt):
                        run_tests(cls("test_leak_everything"))
                self.assertRestored()

    def test_engine_restore_of_a_generated_test(self) -> None:
        if "qnnpack" not in engines.supported_qengines():
            self.skipTest("needs the qnnpack engine")

        class Generic(SerializationRoundTripTestCase, unittest.TestCase):
            qengines = ("qnnpack",)
            devices = ("cpu",)
            load_modes = ("weights_only_false",)

            def test_engine(self, device: str) -> None:
                self.assertIs(engines.allocator_installed(), True)

        (cls,) = instantiate_round_trip_tests(Generic, {"__name__": __name__})
        for target in ("restore_engine_state", "set_allocator"):
            for when in ("before", "after"):
                with self.subTest(target=target, when=when), clean_env():
                    with mock.patch.object(engines, target, _once(getattr(engines, target), when)):
                        with self.assertRaises(KeyboardInterrupt):
                            run_tests(cls("test_engine_qnnpack_weights_only_false_cpu"))
                    self.assertRestored()

    def test_override_qengine_outside_tests(self) -> None:
        if "qnnpack" not in engines.supported_qengines():
            self.skipTest("needs the qnnpack engine")
        for when in ("before", "after"):
            with self.subTest(when=when):
                with mock.patch.object(engines, "restore_engine_state", _once(engines.restore_engine_state, when)):
                    with self.assertRaises(KeyboardInterrupt):
                        with engines.override_qengine("qnnpack"):
                            self.assertIs(engines.allocator_installed(), True)
                self.assertRestored()
                with engines.override_qengine("qnnpack"):  # and the next switch works
                    pass
                self.assertRestored()

    def test_warning_observation_restore(self) -> None:
        if not READS_FORCE_NO:
            self.skipTest(f"torch {torch.__version__} does not read {NO_WO} (torch < 2.6)")
        from torch_serial_testing import load as loading

        for when in ("before", "after"):
            with self.subTest(when=when), clean_env(**{NO_WO: "1"}):
                with mock.patch.object(loader, "_uninstall", _once(loader._uninstall, when)):
                    with self.assertRaises(KeyboardInterrupt):
                        loading.round_trip(Gate(), "default")
                self.assertFalse(loader.proxy_installed())
                self.assertTrue(loading.round_trip(Gate(), "default").expectation.warns)
            self.assertRestored()


class TestSignalCampaign(unittest.TestCase):
    def test_real_sigint_at_every_bytecode_of_the_restore_code(self) -> None:
        # The campaign process inherits SIGINT ignored, as from a background job of a
        # non-interactive shell or nohup (where pytest itself may run): the library must leave
        # it ignored, and the campaign must still get its signals (it installs Python's handler).
        env = {k: v for k, v in os.environ.items() if not k.startswith("TORCH_FORCE_")}
        launcher = (
            "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_IGN); "
            "os.execv(sys.executable, [sys.executable, sys.argv[1]])"
        )
        proc = subprocess.run(
            [sys.executable, "-c", launcher, os.path.join(TEST_DIR, "helpers", "interrupt_campaign.py")],
            cwd=os.path.join(TEST_DIR, "helpers"),
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        self.assertEqual(proc.returncode, 0, proc.stdout[-3000:] + proc.stderr[-3000:])
        report = json.loads(proc.stdout.strip().splitlines()[-1])
        self.assertEqual(report["startup"], {"sigint_at_start": "SIG_IGN", "restored": True, "kept": True})
        scenarios = report["scenarios"]
        self.assertLessEqual({"cleanup", "body"}, set(scenarios))
        for scenario, result in scenarios.items():
            with self.subTest(scenario):
                self.assertGreater(result["points"], 20)  # the campaign did reach the restore code
                self.assertEqual(result["inconsistent"], [])
                self.assertEqual(result["not_interrupted"], [])


if __name__ == "__main__":
    unittest.main()
