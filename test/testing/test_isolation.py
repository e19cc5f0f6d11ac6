"""Isolation: leaks fail the leaking test, the next test starts clean, pre-registered globals survive.

Leaking test classes are built inside factory functions (never at module level)
and run through an inner ``unittest`` runner, so no runner collects them directly.
Also: concurrent round trips from several threads, and the outcome of every test
id is the same in shuffled orders and under ``pytest -n 2``.
"""

from __future__ import annotations

import importlib.util
import io
import json
import os
import random
import subprocess
import sys
import tempfile
import textwrap
import threading
import unittest
import warnings
import xml.etree.ElementTree as ET
from typing import Any

import torch

from torch_serial_testing import LeakedGlobalStateError, SerializationRoundTripTestCase
from torch_serial_testing.errors import qualified_name
from torch_serial_testing import loading
from torch_serial_testing.declarations import normalize_safe_globals
from torch_serial_testing import dimensions
from torch_serial_testing.modes import torch_default_weights_only
from torch_serial_testing.registry import snapshot_registry

from test.helpers.roundtrip_fixtures import MODE_SKIPS, SAFE_GLOBALS_SKIP, assert_mode_skips_here
from test.helpers.subprocess_env import child_env
from test.helpers.isolation_fixtures import import_registering_modules

TEST_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROOT = os.path.dirname(TEST_DIR)
WO = "TORCH_FORCE_WEIGHTS_ONLY_LOAD"
# torch.utils.serialization.config (torch >= 2.6) is watched only where torch has it.
HAS_SERIALIZATION_CONFIG = importlib.util.find_spec("torch.utils.serialization") is not None
# A bare torch.load is weights-only since torch 2.6; before, the `default` mode is a full load.
TORCH_DEFAULT_WO = torch_default_weights_only()[0]


class PreRegistered:
    """Stands in for a class a backend registers at import time."""


class LeakedGlobal:
    """What a leaking test registers."""


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.arange(6.0).reshape(2, 3))


def _state() -> dict[str, Any]:
    state = {
        "qengine": torch.backends.quantized.engine,
        "allocator": dimensions.allocator_installed(),
        "registry": sorted(qualified_name(g) for g in torch.serialization.get_safe_globals()),
        "env": os.environ.get(WO),
    }
    if HAS_SERIALIZATION_CONFIG:
        from torch.utils.serialization import config

        state["mmap"] = config.load.mmap
    return state


def _other_engine() -> str:
    supported = [e for e in dimensions.supported_qengines() if e != torch.backends.quantized.engine]
    if not supported:
        raise unittest.SkipTest("needs two quantized engines")
    return supported[0]


def _run(*tests: unittest.TestCase) -> unittest.TestResult:
    """Run *tests* in this order through an inner TextTestRunner (output discarded)."""
    runner = unittest.TextTestRunner(stream=io.StringIO(), verbosity=2, warnings=None)
    return runner.run(unittest.TestSuite(tests))


def _leaky_classes(seen: list[dict[str, Any]], fail: bool = True) -> type:
    class Leaky(SerializationRoundTripTestCase, unittest.TestCase):
        fail_on_leaked_state = fail

        def test_probe(self) -> None:
            seen.append(_state())

        def test_leak_engine(self) -> None:
            torch.backends.quantized.engine = _other_engine()

        def test_leak_allocator(self) -> None:
            torch._C._set_default_mobile_cpu_allocator()

        def test_leak_registry(self) -> None:
            torch.serialization.add_safe_globals([LeakedGlobal])

        def test_leak_env(self) -> None:
            os.environ[WO] = "1"

        def test_leak_config(self) -> None:
            from torch.utils.serialization import config

            config.load.mmap = not config.load.mmap

        def test_leak_everything(self) -> None:
            self.test_leak_engine()
            self.test_leak_allocator()
            self.test_leak_registry()
            self.test_leak_env()
            if HAS_SERIALIZATION_CONFIG:
                self.test_leak_config()

    return Leaky


LEAK_MESSAGES = {
    "engine": r"quantized engine '\w+' \(was '\w+'\)",
    "allocator": r"the qnnpack mobile CPU allocator is still installed",
    "registry": r"safe-globals registry changed \(added \['test_isolation\.LeakedGlobal'\], removed \[\]\)".replace(
        "test_isolation", r"[\w.]*"
    ),
    "env": rf"environment {WO}='1' \(was None\)",
}
if HAS_SERIALIZATION_CONFIG:  # a torch without the config (< 2.6) has nothing there to leak
    LEAK_MESSAGES["config"] = r"torch\.utils\.serialization\.config changed: load\.mmap"


class TestLeakDetection(unittest.TestCase):
    def setUp(self) -> None:
        self.before = _state()
        if self.before["allocator"] is None:
            self.skipTest("this torch has no mobile CPU allocator API")
        self.assertFalse(self.before["allocator"])
        self.assertIsNone(self.before["env"])

    def tearDown(self) -> None:
        self.assertEqual(_state(), self.before, "state was not restored")

    def test_each_leak_fails_its_test_and_the_next_starts_clean(self) -> None:
        seen: list[dict[str, Any]] = []
        Leaky = _leaky_classes(seen)
        for kind, pattern in LEAK_MESSAGES.items():
            with self.subTest(kind):
                seen.clear()
                result = _run(Leaky("test_probe"), Leaky(f"test_leak_{kind}"), Leaky("test_probe"))
                self.assertEqual(result.testsRun, 3)
                self.assertEqual(result.errors, [])
                self.assertEqual(len(result.failures), 1, result.failures)
                test, traceback = result.failures[0]
                self.assertEqual(test.id().rsplit(".", 1)[-1], f"test_leak_{kind}")
                self.assertIn(LeakedGlobalStateError.__name__, traceback)
                self.assertRegex(traceback, r"test_leak_%s leaked global state \(now restored\): " % kind + pattern)
                self.assertEqual(seen, [self.before, self.before])
                self.assertEqual(_state(), self.before)

    def test_all_leaks_named_in_one_failure(self) -> None:
        seen: list[dict[str, Any]] = []
        Leaky = _leaky_classes(seen)
        result = _run(Leaky("test_leak_everything"), Leaky("test_probe"))
        self.assertEqual(len(result.failures), 1)
        traceback = result.failures[0][1]
        for pattern in LEAK_MESSAGES.values():
            self.assertRegex(traceback, pattern)
        self.assertEqual(seen, [self.before])

    def test_fail_on_leaked_state_false_warns_and_restores(self) -> None:
        seen: list[dict[str, Any]] = []
        Leaky = _leaky_classes(seen, fail=False)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            result = _run(Leaky("test_leak_everything"), Leaky("test_probe"))
        self.assertTrue(result.wasSuccessful(), result.failures + result.errors)
        leak_warnings = [
            w for w in caught if issubclass(w.category, RuntimeWarning) and "leaked global state" in str(w.message)
        ]
        self.assertEqual(len(leak_warnings), 1, [str(w.message) for w in caught])
        for pattern in LEAK_MESSAGES.values():
            self.assertRegex(str(leak_warnings[0].message), pattern)
        self.assertEqual(seen, [self.before])

    def test_clean_tests_do_not_warn_or_fail(self) -> None:
        seen: list[dict[str, Any]] = []
        Leaky = _leaky_classes(seen)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            result = _run(Leaky("test_probe"), Leaky("test_probe"))
        self.assertTrue(result.wasSuccessful())
        self.assertEqual([w for w in caught if "leaked" in str(w.message)], [])


class TestPreRegisteredGlobalsSurvive(unittest.TestCase):
    """A backend's import-time add_safe_globals survives every test, safe_globals mode included."""

    def setUp(self) -> None:
        self.registry = snapshot_registry()
        torch.serialization.add_safe_globals([PreRegistered])
        self.addCleanup(self._unregister)

    def _unregister(self) -> None:
        torch.serialization.clear_safe_globals()
        torch.serialization.add_safe_globals(self.registry)

    def test_torch_context_exit_drops_pre_registered_entries(self) -> None:
        """The torch behaviour the library works around (pytorch PR 197380)."""
        if SAFE_GLOBALS_SKIP:  # torch < 2.5 has no such context: there is nothing to exercise
            self.skipTest(SAFE_GLOBALS_SKIP)
        with torch.serialization.safe_globals([PreRegistered]):
            pass
        if PreRegistered in torch.serialization.get_safe_globals():
            self.skipTest("this torch keeps pre-registered globals across safe_globals(...)")
        torch.serialization.add_safe_globals([PreRegistered])

    def test_survives_every_mode(self) -> None:
        observed: list[bool] = []
        outcomes: list[str] = []

        class Uses(SerializationRoundTripTestCase, unittest.TestCase):
            # set: needed where torch's allowlist lacks it (< 2.6); used and allowed, so not over-trust, on >= 2.6
            safe_globals = (Net, PreRegistered, set)

            def check(self, mode: str) -> None:
                observed.append(PreRegistered in torch.serialization.get_safe_globals())
                try:
                    self.round_trip({"net": Net(), "marker": PreRegistered()}, mode=mode)
                finally:
                    observed.append(PreRegistered in torch.serialization.get_safe_globals())
                    outcomes.extend(self.round_trip_outcomes)

            def test_safe_globals(self) -> None:
                self.check("safe_globals")

            def test_default(self) -> None:
                self.check("default")

            def test_weights_only_false(self) -> None:
                self.check("weights_only_false")

            def test_direct_context(self) -> None:
                # torch's own context, used directly: its exit drops the pre-registered entry.
                # The library restores it and reports the removal (the test did change it).
                if SAFE_GLOBALS_SKIP:  # torch < 2.5 has no such context
                    self.skipTest(SAFE_GLOBALS_SKIP)
                with torch.serialization.safe_globals([PreRegistered]):
                    pass

        names = [
            "test_safe_globals",
            "test_direct_context",
            "test_default",
            "test_weights_only_false",
            "test_safe_globals",
        ]
        result = _run(*(Uses(n) for n in names))
        self.assertEqual(result.errors, [])
        if SAFE_GLOBALS_SKIP:
            # No safe_globals context here (torch < 2.5): those tests skip with the reason, nothing leaks.
            self.assertEqual(result.failures, [])
            self.assertEqual(
                [(t.id().rsplit(".", 1)[-1], reason) for t, reason in result.skipped],
                [(n, SAFE_GLOBALS_SKIP) for n in ("test_safe_globals", "test_direct_context", "test_safe_globals")],
            )
        else:
            self.assertEqual(result.skipped, [])
            self.assertEqual([t.id().rsplit(".", 1)[-1] for t, _ in result.failures], ["test_direct_context"])
            self.assertRegex(
                result.failures[0][1],
                r"LeakedGlobalStateError: .*test_direct_context leaked global state \(now restored\): "
                r"safe-globals registry changed \(added \[\], removed \['[\w.]*PreRegistered'\]\)",
            )
        self.assertEqual(observed, [True] * 8)
        self.assertIn(PreRegistered, torch.serialization.get_safe_globals())
        expected = [
            "safe_globals: loaded as expected",
            # Net is not allowlisted: a bare load rejects it where that is weights-only (>= 2.6).
            f"default: {'rejected' if TORCH_DEFAULT_WO else 'loaded'} as expected",
            "weights_only_false: loaded as expected",
            "safe_globals: loaded as expected",
        ]
        self.assertEqual(
            [o.split(" (")[0] for o in outcomes],
            [o for o in expected if o.split(":")[0] not in MODE_SKIPS],  # a skipped mode reports nothing
        )

    def test_import_time_registration_during_a_test_is_not_a_leak(self) -> None:
        tmp = tempfile.mkdtemp(prefix="tst-backend-")
        self.addCleanup(__import__("shutil").rmtree, tmp, True)
        name = "tst_fake_backend_%d" % os.getpid()
        with open(os.path.join(tmp, name + ".py"), "w") as fh:
            fh.write(
                textwrap.dedent(
                    """
                import torch
                class BackendTensorMeta:
                    pass
                torch.serialization.add_safe_globals([BackendTensorMeta])
                """
                )
            )
        sys.path.insert(0, tmp)
        self.addCleanup(sys.path.remove, tmp)
        self.addCleanup(sys.modules.pop, name, None)

        class ImportsBackend(SerializationRoundTripTestCase, unittest.TestCase):
            def test_import(self) -> None:
                __import__(name)

        stream = io.StringIO()
        result = unittest.TextTestRunner(stream=stream, verbosity=2).run(ImportsBackend("test_import"))
        self.assertTrue(result.wasSuccessful(), result.failures + result.errors)
        # kept, and named once in verbose output (torch's own modules' registrations would be kept silently)
        self.assertIn(
            f"... kept safe globals registered at import time: {name}.BackendTensorMeta ... ok\n", stream.getvalue()
        )
        registered = {qualified_name(g) for g in torch.serialization.get_safe_globals()}
        self.assertIn(f"{name}.BackendTensorMeta", registered)
        self.assertIn(PreRegistered, torch.serialization.get_safe_globals())


class TestConcurrentRoundTrips(unittest.TestCase):
    def test_threads_in_different_modes(self) -> None:
        declared = normalize_safe_globals([Net, set])  # set: needed where torch's allowlist lacks it (< 2.6)
        # Warm up: torch's first load may import modules that register globals at import time.
        import_registering_modules()
        if assert_mode_skips_here(self, "safe_globals", lambda: loading.round_trip(Net(), "safe_globals", declared)):
            # torch < 2.5: the safe_globals mode skips (asserted above); the threads use the other modes.
            loading.round_trip(Net(), "weights_only_false")
            modes = ("weights_only_false", "default", "weights_only_false", "default")
        else:
            loading.round_trip(Net(), "safe_globals", declared)
            modes = ("weights_only_false", "safe_globals", "default", "safe_globals")
        before = snapshot_registry()
        # The module loads in `default` only where a bare torch.load is a full load (< 2.6).
        expected = {"weights_only_false": True, "safe_globals": True, "default": not TORCH_DEFAULT_WO}
        errors: list[str] = []
        outcomes: list[tuple[str, bool]] = []
        barrier = threading.Barrier(len(modes))

        def worker(mode: str) -> None:
            barrier.wait()
            for i in range(10):
                try:
                    obj: Any = Net() if i % 2 == 0 else Net().state_dict()
                    result = loading.round_trip(obj, mode, declared)
                    want = expected[mode] or i % 2 == 1  # a state_dict loads in every mode
                    outcomes.append((mode, result.loaded))
                    if result.loaded != want:
                        errors.append(f"{mode}#{i}: {result.summary}")
                    elif result.loaded:
                        # torch.equal, not torch.testing.assert_close: the latter imports
                        # torch.distributed.tensor, which registers globals at import time.
                        weight = (result.value.state_dict() if i % 2 == 0 else result.value)["weight"]
                        if not torch.equal(weight, torch.arange(6.0).reshape(2, 3)):
                            errors.append(f"{mode}#{i}: wrong weight {weight}")
                except BaseException as e:  # noqa: BLE001 - reported below
                    errors.append(f"{mode}#{i}: {type(e).__name__}: {e}")

        threads = [threading.Thread(target=worker, args=(m,)) for m in modes]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self.assertEqual(errors, [])
        self.assertEqual(len(outcomes), 40)
        # The registry is a set to torch (_get_user_allowed_globals): same entries, same count.
        self.assertCountEqual(snapshot_registry(), before)


# -- order independence ---------------------------------------------------------------------------

ORDER_MODULES = {
    "envcheck_roundtrip": None,  # every class
    "test_safety": ("TestStaticScan", "TestMixinPaths"),
}
#: The folder of each of ORDER_MODULES under test/ (each is collected under its plain module name from there).
ORDER_FOLDERS = {"envcheck_roundtrip": "helpers", "test_safety": "policy"}


def _gather_ids() -> list[str]:
    loader = unittest.TestLoader()
    ids: list[str] = []

    def walk(suite: Any) -> None:
        for item in suite:
            if isinstance(item, unittest.TestSuite):
                walk(item)
            else:
                ids.append(item.id())

    for module, classes in ORDER_MODULES.items():
        folder = os.path.join(TEST_DIR, ORDER_FOLDERS[module])
        suite = loader.discover(folder, pattern=f"{module}.py", top_level_dir=folder)
        walk(suite)
    if loader.errors:  # a module that does not import: say so, not a KeyError on 'unittest'
        raise AssertionError("could not collect the order-independence tests:\n" + "\n".join(loader.errors))
    wanted = [
        i for i in ids if ORDER_MODULES[i.split(".")[0]] is None or i.split(".")[1] in ORDER_MODULES[i.split(".")[0]]
    ]
    return wanted


def _generated_mode_skip(key: str) -> str | None:
    """The library's skip reason for ``Class.test`` generated by instantiate_round_trip_tests in one
    of ORDER_MODULES (``..._<mode>_cpu``) when this torch cannot run its load mode, else None."""
    cls, name = key.split(".")
    if cls != "EnvCheckRoundTripCPU":
        return None
    reasons = [r for mode, r in MODE_SKIPS.items() if name.endswith(f"_{mode}_cpu")]
    return reasons[0] if reasons else None


def _key(classname: str, name: str) -> str:
    return f"{classname.rsplit('.', 1)[-1]}.{name}"


class TestOrderIndependence(unittest.TestCase):
    def test_shuffled_and_parallel_runs_agree(self) -> None:
        ids = _gather_ids()
        self.assertGreaterEqual(len(ids), 10)
        # The driver imports ORDER_MODULES by their plain names (test_safety from its folder) and
        # they import test.helpers (from the project root).
        env = child_env(path_first=(os.path.join(TEST_DIR, ORDER_FOLDERS["test_safety"]), ROOT))
        # One driver process runs two shuffled orders back to back (the second inherits whatever
        # the first left behind); pytest runs another shuffled order split over two workers.
        orders = []
        for seed in (1, 2):
            order = ids[:]
            random.Random(seed).shuffle(order)
            orders.append(order)
        spec = json.dumps({"ids": ids, "states": [{"env": None, "ids": o} for o in orders]})
        driver = subprocess.Popen(
            [
                sys.executable,
                os.path.join(TEST_DIR, ORDER_FOLDERS["envcheck_roundtrip"], "envcheck_roundtrip.py"),
                "--spec",
                spec,
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=TEST_DIR,
            env=env,
        )
        tmp = tempfile.mkdtemp(prefix="tst-order-")
        self.addCleanup(__import__("shutil").rmtree, tmp, True)
        node_ids = [
            f"{ORDER_FOLDERS[i.split('.')[0]]}/{i.split('.')[0]}.py::{i.split('.')[1]}::{i.split('.')[2]}" for i in ids
        ]
        random.Random(3).shuffle(node_ids)
        xml = os.path.join(tmp, "parallel.xml")
        parallel = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "pytest",
                "-q",
                "-p",
                "no:cacheprovider",
                "-o",
                "addopts=",
                "--rootdir",
                TEST_DIR,
                "-n",
                "2",
                f"--junitxml={xml}",
                *node_ids,
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=TEST_DIR,
            env=env,
        )
        outcomes: dict[str, dict[str, str]] = {}
        out, err = driver.communicate(timeout=300)
        self.assertEqual(driver.returncode, 0, err[-3000:])
        lines = [json.loads(l) for l in out.splitlines() if l.startswith("{")]
        self.assertEqual(len(lines), 2, out + err[-3000:])
        for seed, raw in zip((1, 2), lines):
            outcomes[f"unittest seed {seed}"] = {".".join(k.split(".")[-2:]): v["outcome"] for k, v in raw.items()}
        out, err = parallel.communicate(timeout=300)
        self.assertIn(parallel.returncode, (0, 1), out[-3000:] + err[-3000:])
        outcomes["pytest -n 2, shuffled"] = _junit_outcomes(xml)
        expected_keys = {".".join(i.split(".")[-2:]) for i in ids}
        # Every test passes, except a generated round-trip test whose load mode this torch cannot run
        # (safe_globals before torch 2.5): that one skips, in every order and runner.
        baseline = {k: "skip" if _generated_mode_skip(k) else "pass" for k in expected_keys}
        for label, got in outcomes.items():
            with self.subTest(label):
                self.assertEqual(got, baseline)
        for seed, raw in zip((1, 2), lines):
            with self.subTest(f"unittest seed {seed}: skip reasons"):
                reasons = {".".join(k.split(".")[-2:]): v["message"] for k, v in raw.items() if v["outcome"] == "skip"}
                self.assertEqual(reasons, {k: _generated_mode_skip(k) for k in baseline if baseline[k] == "skip"})


def _junit_outcomes(path: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        tags = {child.tag for child in case}
        outcome = (
            "fail" if "failure" in tags else "error" if "error" in tags else "skip" if "skipped" in tags else "pass"
        )
        out[_key(case.get("classname", ""), case.get("name", ""))] = outcome
    return out


if __name__ == "__main__":
    unittest.main()
