"""One rule for switching the quantized engine (or the qnnpack allocator) inside a test.

A test may switch engines and allocators temporarily.  Whatever it leaves behind
at the end of its body -- compared with what it got (the engine the library set
for an engine-parameterized test, the process's state otherwise) -- is leaked
state: the test fails with ``LeakedGlobalStateError`` naming it (a warning with
``fail_on_leaked_state = False``) and the state is restored either way.  Before,
an engine test's leak was silently undone while the same switch elsewhere failed.
"""

from __future__ import annotations

import unittest
import warnings

import torch

from torch_serial_testing import SerializationRoundTripTestCase, cross_engine, instantiate_round_trip_tests

from torch_serial_testing import dimensions

from test.helpers.isolation_fixtures import process_state, run_tests


def _classes(fail: bool = True) -> dict[str, type]:
    class Plain(SerializationRoundTripTestCase, unittest.TestCase):
        fail_on_leaked_state = fail

        def test_switch(self) -> None:
            torch.backends.quantized.engine = "qnnpack"

        def test_switch_and_restore(self) -> None:
            previous = torch.backends.quantized.engine
            torch.backends.quantized.engine = "qnnpack"
            torch.backends.quantized.engine = previous

    class Generic(SerializationRoundTripTestCase, unittest.TestCase):
        fail_on_leaked_state = fail
        qengines = ("fbgemm", "qnnpack")
        devices = ("cpu",)
        load_modes = ("default",)

        def test_switch(self, device: str) -> None:
            torch.backends.quantized.engine = "qnnpack" if self.qengine == "fbgemm" else "fbgemm"

        def test_allocator(self, device: str) -> None:
            # The body finds no allocator installed, qnnpack included (as under pytorch's
            # override_quantized_engine); installing one and leaving it is the leak.
            torch._C._set_default_mobile_cpu_allocator()

        def test_switch_and_restore(self, device: str) -> None:
            with dimensions.override_qengine("qnnpack" if self.qengine == "fbgemm" else "fbgemm"):
                pass

        @cross_engine
        def test_cross(self, device: str) -> None:
            with self.loading_engine():
                self.assertEqual(torch.backends.quantized.engine, self.load_qengine)

    (generated,) = instantiate_round_trip_tests(Generic, {"__name__": __name__})
    return {"plain": Plain, "generated": generated}


class TestEngineRule(unittest.TestCase):
    def setUp(self) -> None:
        missing = {"fbgemm", "qnnpack"} - set(dimensions.supported_qengines())
        if missing:
            self.skipTest(f"needs the fbgemm and qnnpack engines; this build lacks {sorted(missing)}")
        if torch.backends.quantized.engine == "qnnpack":
            self.skipTest("the process already runs qnnpack: a switch to it would not be a change")
        self.before = process_state()

    def tearDown(self) -> None:
        self.assertEqual(process_state(), self.before)

    def failures(self, cls: type, *names: str) -> dict[str, str]:
        result = run_tests(*(cls(n) for n in names))
        self.assertEqual(result.errors, [])
        return {t.id().rsplit(".", 1)[-1]: tb.strip().splitlines()[-1] for t, tb in result.failures}

    def test_switch_without_engine_dimension_is_a_leak(self) -> None:
        got = self.failures(_classes()["plain"], "test_switch", "test_switch_and_restore")
        self.assertEqual(list(got), ["test_switch"])
        self.assertRegex(
            got["test_switch"],
            r"LeakedGlobalStateError: .*test_switch leaked global state \(now restored\): "
            r"quantized engine 'qnnpack' \(was '\w+'\)$",
        )

    def test_switch_inside_an_engine_test_is_the_same_leak(self) -> None:
        cls = _classes()["generated"]
        got = self.failures(
            cls,
            "test_switch_fbgemm_default_cpu",
            "test_switch_qnnpack_default_cpu",
            "test_switch_and_restore_fbgemm_default_cpu",
            "test_switch_and_restore_qnnpack_default_cpu",
        )
        self.assertEqual(sorted(got), ["test_switch_fbgemm_default_cpu", "test_switch_qnnpack_default_cpu"])
        self.assertRegex(
            got["test_switch_fbgemm_default_cpu"],
            r"leaked global state \(now restored\): quantized engine 'qnnpack' \(was 'fbgemm'\), set for this fbgemm test$",
        )
        self.assertRegex(
            got["test_switch_qnnpack_default_cpu"],
            r"leaked global state \(now restored\): quantized engine 'fbgemm' \(was 'qnnpack'\), set for this qnnpack test$",
        )

    def test_allocator_change_inside_an_engine_test_is_a_leak(self) -> None:
        got = self.failures(
            _classes()["generated"], "test_allocator_qnnpack_default_cpu", "test_allocator_fbgemm_default_cpu"
        )
        self.assertRegex(
            got["test_allocator_qnnpack_default_cpu"],
            r"the qnnpack mobile CPU allocator is still installed, set for this qnnpack test$",
        )
        self.assertRegex(
            got["test_allocator_fbgemm_default_cpu"],
            r"the qnnpack mobile CPU allocator is still installed, set for this fbgemm test$",
        )

    def test_cross_engine_loading_engine_is_not_a_leak(self) -> None:
        got = self.failures(
            _classes()["generated"],
            "test_cross_fbgemm_to_qnnpack_default_cpu",
            "test_cross_qnnpack_to_fbgemm_default_cpu",
        )
        self.assertEqual(got, {})

    def test_warn_instead_of_fail_applies_to_both(self) -> None:
        classes = _classes(fail=False)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            result = run_tests(classes["plain"]("test_switch"), classes["generated"]("test_switch_fbgemm_default_cpu"))
        self.assertTrue(result.wasSuccessful(), result.failures + result.errors)
        leaks = [str(w.message) for w in caught if "leaked global state" in str(w.message)]
        self.assertEqual(len(leaks), 2, leaks)
        self.assertRegex(leaks[0], r"test_switch leaked .*quantized engine 'qnnpack'")
        self.assertRegex(leaks[1], r"test_switch_fbgemm_default_cpu leaked .*set for this fbgemm test")


if __name__ == "__main__":
    unittest.main()
