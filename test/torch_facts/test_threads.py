"""Threads: predict() under the registry lock, and warnings that stay in their own thread.

What the library guarantees to threads, and only that: ``registry_lock`` is held around each
prediction and the load it predicts (a ``safe_globals`` context of one thread's load is never seen by
another thread's prediction, and the registry is as before once the loads are done), and a load
observes and consumes torch's FORCE_NO warning in its own thread only.  Switching quantized engines or
the mobile allocator is not serialised (no lock, as pytorch's ``override_quantized_engine``): nothing
here asserts it.

Each race is made deterministic with ``Gate``: its ``__setstate__`` runs while
torch loads it, i.e. while the round trip is inside its ``safe_globals`` context
and its warning observation, and lets another thread act exactly then.
"""

from __future__ import annotations

import sys
import threading
import unittest
import warnings
from typing import Any

import torch

from torch_serial_testing import Checkpoint, loading
from torch_serial_testing.prediction import predict
from torch_serial_testing.registry import snapshot_registry

from test.helpers.isolation_fixtures import (
    import_registering_modules,
    GATE_SAFE_GLOBALS,
    READS_FORCE_NO,
    TORCH_DEFAULT_WO,
    Gate,
    clean_env,
    hook,
    process_state,
    proxy_installed,
)

NO_WO = "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD"
#: How long the loading thread gives the other thread to act while it is inside the load.  Only
#: bounds a wait (nothing is timed or asserted on it): a correct library makes the other thread
#: wait for the lock, so the loading thread waits this long once and goes on.
GRACE = 1.0


class TestPredictTakesTheLock(unittest.TestCase):
    def test_predict_during_a_safe_globals_round_trip_in_another_thread(self) -> None:
        ckpt = Checkpoint.save(Gate())
        with clean_env():
            expected = predict("default", ckpt)
        self.assertEqual(expected.loads, not TORCH_DEFAULT_WO)
        inside = threading.Event()
        predicted = threading.Event()
        answers: list[bool] = []

        def predictor() -> None:
            inside.wait(60)
            answers.append(predict("default", ckpt).loads)
            predicted.set()

        def in_load() -> None:
            inside.set()
            predicted.wait(GRACE)  # without the lock the predictor answers now, mid-context

        thread = threading.Thread(target=predictor)
        with clean_env(), hook(in_load):
            thread.start()
            result = loading.load(ckpt, "safe_globals", GATE_SAFE_GLOBALS)
            thread.join()
        self.assertTrue(result.loaded)
        # Gate is registered only inside the other thread's context: a bare load here rejects it.
        self.assertEqual(answers, [expected.loads])

    def test_concurrent_predictions_never_see_a_round_trips_context(self) -> None:
        ckpt = Checkpoint.save(Gate())
        with clean_env():
            expected = predict("default", ckpt).loads
            stop = threading.Event()
            wrong: list[int] = []
            count = [0]

            def predictor() -> None:
                while not stop.is_set():
                    count[0] += 1
                    if predict("default", ckpt).loads != expected:
                        wrong.append(count[0])

            thread = threading.Thread(target=predictor)
            thread.start()
            try:
                for _ in range(40):
                    self.assertTrue(loading.round_trip(Gate(), "safe_globals", GATE_SAFE_GLOBALS).loaded)
            finally:
                stop.set()
                thread.join()
        self.assertGreater(count[0], 0)
        self.assertEqual(wrong, [])


class TestWarningsStayInTheirThread(unittest.TestCase):
    def setUp(self) -> None:
        if not READS_FORCE_NO:
            self.skipTest(f"torch {torch.__version__} does not read {NO_WO} (torch < 2.6): it never warns")
        # Modules that register safe globals when imported are imported before the snapshot: a test
        # below imports them, and the file must pass when it runs alone.
        import_registering_modules()
        self.before = process_state()

    def tearDown(self) -> None:
        self.assertEqual(process_state(), self.before)

    def test_error_filter_applies_to_another_thread_during_a_round_trip(self) -> None:
        """Under -W error: the other thread's warn raises; the round trip neither records nor raises it."""
        go = threading.Event()
        done = threading.Event()
        other: list[str] = []

        def warner() -> None:
            go.wait(60)
            try:
                warnings.warn("from the other thread", UserWarning)
                other.append("returned silently")
            except UserWarning:
                other.append("raised")
            done.set()

        def in_load() -> None:
            go.set()
            done.wait(60)  # the other thread warns while this load observes torch's warning

        thread = threading.Thread(target=warner)
        with clean_env(**{NO_WO: "1"}), warnings.catch_warnings():
            warnings.simplefilter("error")
            thread.start()
            with hook(in_load):
                result = loading.round_trip(Gate(), "default")
            thread.join()
        self.assertEqual(other, ["raised"])
        self.assertTrue(result.loaded)
        self.assertTrue(result.expectation.warns)  # torch's own warning was observed, and consumed

    def test_round_trip_under_record_gets_only_its_own_warnings(self) -> None:
        go = threading.Event()
        done = threading.Event()

        def warner() -> None:
            go.wait(60)
            warnings.warn("from the other thread", UserWarning)
            done.set()

        def in_load() -> None:
            warnings.warn("from this thread's load", UserWarning)
            go.set()
            done.wait(60)

        thread = threading.Thread(target=warner)
        with clean_env(**{NO_WO: "1"}), warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            thread.start()
            with hook(in_load):
                result = loading.round_trip(Gate(), "default")
            thread.join()
        self.assertTrue(result.loaded)
        # Both reach the caller's record exactly once (nothing swallowed, nothing re-emitted twice),
        # and torch's FORCE_NO warning is consumed by the library, which asserts it.
        self.assertEqual(sorted(str(w.message) for w in caught), ["from the other thread", "from this thread's load"])

    def test_a_warning_through_the_proxy_keeps_its_location(self) -> None:
        # While the load observes, torch.serialization's ``warnings`` is the proxy: anything but
        # torch's FORCE_NO warning goes on to the real warnings.warn from where it was raised.
        import torch.serialization as ser

        where: list[tuple[bool, int]] = []

        def in_load() -> None:
            where.append((proxy_installed(), sys._getframe().f_lineno + 1))  # the next line warns
            ser.warnings.warn("through the proxy", UserWarning)

        with clean_env(**{NO_WO: "1"}), warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with hook(in_load):
                result = loading.round_trip(Gate(), "default")
        self.assertTrue(result.loaded)
        self.assertTrue(result.expectation.warns)  # torch's own warning: observed and consumed
        self.assertEqual(
            [(w.category, str(w.message), w.filename, w.lineno) for w in caught],
            [(UserWarning, "through the proxy", __file__, where[0][1])],
        )
        self.assertEqual(where[0][0], True)  # it did pass through the proxy
        self.assertFalse(proxy_installed())

    def test_own_warning_under_error_raises_as_is(self) -> None:
        with clean_env(**{NO_WO: "1"}), warnings.catch_warnings():
            warnings.simplefilter("error")
            with hook(lambda: warnings.warn("raised inside the load", UserWarning)):
                with self.assertRaisesRegex(UserWarning, "raised inside the load"):
                    loading.round_trip(Gate(), "default")

    def test_stress_many_round_trips_against_a_warning_thread(self) -> None:
        stop = threading.Event()
        silent: list[int] = []
        raised = [0]

        def warner() -> None:
            while not stop.is_set():
                try:
                    warnings.warn("from the other thread", UserWarning)
                    silent.append(1)
                except UserWarning:
                    raised[0] += 1

        with clean_env(**{NO_WO: "1"}), warnings.catch_warnings():
            warnings.simplefilter("error")
            thread = threading.Thread(target=warner)
            thread.start()
            failures: list[str] = []
            try:
                for i in range(60):
                    obj: Any = Gate() if i % 2 else Gate().state_dict()
                    try:
                        result = loading.round_trip(obj, "default")
                        if not (result.loaded and result.expectation.warns):
                            failures.append(f"#{i}: {result.summary}")
                    except BaseException as e:  # noqa: BLE001 - listed below
                        failures.append(f"#{i}: {type(e).__name__}: {e}")
            finally:
                stop.set()
                thread.join()
        self.assertEqual(failures, [])
        self.assertEqual(silent, [])
        self.assertGreater(raised[0], 0)

    def test_threads_in_every_mode_leave_registry_and_filters_alone(self) -> None:
        import_registering_modules()
        registry = snapshot_registry()
        errors: list[str] = []

        def worker(mode: str) -> None:
            for _ in range(10):
                try:
                    loading.round_trip(Gate(), mode, GATE_SAFE_GLOBALS)
                except BaseException as e:  # noqa: BLE001 - listed below
                    errors.append(f"{mode}: {type(e).__name__}: {e}")

        with clean_env(**{NO_WO: "1"}):
            threads = [
                threading.Thread(target=worker, args=(m,)) for m in ("weights_only_false", "safe_globals", "default")
            ]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        self.assertEqual(errors, [])
        # The registry is a set to torch (_get_user_allowed_globals): same entries, same count.
        self.assertCountEqual(snapshot_registry(), registry)


if __name__ == "__main__":
    unittest.main()
