"""pytorch's own ``override_cpu_allocator_for_qnnpack`` inside a generated qnnpack test.

The body of a generated engine test runs as under pytorch's ``override_quantized_engine``: the engine
set, the CPU allocator as found.  So pytorch's allocator helper (which refuses to nest: "Already within
the scope of another non-default cpu allocator") works inside it, and the library's own loads still
run under the mobile allocator in a qnnpack test, installed for the load when nobody has.
"""

from __future__ import annotations

import io
import unittest
from typing import Any, ClassVar

import torch

from torch_serial_testing import SerializationRoundTripTestCase, instantiate_round_trip_tests, round_trip_dims
from torch_serial_testing import dimensions


class AllocatorProbe(torch.nn.Module):
    """Records, when unpickled, whether the mobile CPU allocator was installed."""

    seen: ClassVar[list[Any]] = []

    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(2, 2)

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        AllocatorProbe.seen.append(dimensions.allocator_installed())


def _generated() -> dict[str, Any]:
    from torch.testing._internal.common_quantized import override_cpu_allocator_for_qnnpack

    class TestPytorchHelper(SerializationRoundTripTestCase, unittest.TestCase):
        qengines = ("qnnpack", "fbgemm")
        devices = ("cpu",)
        safe_globals = (torch.ao.nn.quantized.modules.linear.LinearPackedParams,)
        allow_unneeded_safe_globals = True

        def test_helper_inside(self, device: str) -> None:
            with override_cpu_allocator_for_qnnpack(self.qengine == "qnnpack"):
                self.assertIs(dimensions.allocator_installed(), self.qengine == "qnnpack")
                lin = torch.ao.nn.quantized.Linear(4, 3)
                loaded = self.round_trip(lin.state_dict(), safe_globals=())
                fresh = torch.ao.nn.quantized.Linear(4, 3)
                fresh.load_state_dict(loaded)
                x = torch.quantize_per_tensor(torch.ones(2, 4), 0.1, 0, torch.quint8)
                self.assertTrue(torch.equal(fresh(x).int_repr(), lin(x).int_repr()))
            self.assertIs(dimensions.allocator_installed(), False)

        @round_trip_dims(load_modes=("weights_only_false",))
        def test_library_load_under_the_allocator(self, device: str) -> None:
            AllocatorProbe.seen.clear()
            self.assertIs(dimensions.allocator_installed(), False)  # the body: as found
            self.round_trip(AllocatorProbe())
            self.assertEqual(AllocatorProbe.seen, [self.qengine == "qnnpack"])  # the load: as pytorch's tests
            self.assertIs(dimensions.allocator_installed(), False)

    TestPytorchHelper.__module__ = __name__
    scope: dict[str, Any] = {"__name__": __name__}
    instantiate_round_trip_tests(TestPytorchHelper, scope)
    return scope


class TestQnnpackAllocatorComposition(unittest.TestCase):
    def setUp(self) -> None:
        missing = {"fbgemm", "qnnpack"} - set(dimensions.supported_qengines())
        if missing:
            self.skipTest(f"needs the fbgemm and qnnpack engines; this build lacks {sorted(missing)}")
        if dimensions.allocator_installed() is None:
            self.skipTest("this torch has no mobile CPU allocator API")

    def test_pytorch_helper_inside_generated_qnnpack_tests(self) -> None:
        cls = _generated()["TestPytorchHelperCPU"]
        suite = unittest.defaultTestLoader.loadTestsFromTestCase(cls)
        names = sorted(t.id().rsplit(".", 1)[-1] for t in suite)
        self.assertIn("test_helper_inside_qnnpack_default_cpu", names)
        self.assertIn("test_library_load_under_the_allocator_qnnpack_weights_only_false_cpu", names)
        stream = io.StringIO()
        result = unittest.TextTestRunner(stream=stream, verbosity=2).run(suite)
        self.assertEqual(result.testsRun, len(names))
        self.assertTrue(result.wasSuccessful(), stream.getvalue())
        self.assertNotIn("Already within the scope", stream.getvalue())
        self.assertIs(dimensions.allocator_installed(), False)


if __name__ == "__main__":
    unittest.main()
