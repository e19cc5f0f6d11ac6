"""Round trips through a file path (mmap), through pickle, and pytorch's qnnpack allocator helper.

Run: ``python docs/examples/composition_kinds.py`` (exits 0 when every test passes).
"""

import sys
import unittest

import torch

from torch_serial_testing import SerializationRoundTripTestCase, instantiate_round_trip_tests, round_trip_dims


class TinyNet(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 2)


class TestTinyNet(SerializationRoundTripTestCase, unittest.TestCase):
    safe_globals = (TinyNet, torch.nn.Linear)
    devices = ("cpu",)

    def test_file(self, device):
        net = TinyNet()
        loaded = self.round_trip_file(net)  # torch.load(path) in this test's mode
        self.assertRoundTripEqual(net.state_dict(), loaded.state_dict())

    def test_mmap_state_dict(self, device):
        state = TinyNet().state_dict()
        loaded = self.round_trip_file(state, safe_globals=(), mmap=True)  # torch.load(path, mmap=True)
        self.assertRoundTripEqual(state, loaded)

    @round_trip_dims(load_modes=())  # pickle has no load mode: one test
    def test_pickle(self, device):
        net = TinyNet()
        loaded = self.round_trip_pickle(net)  # pickle.loads calls torch.load for each storage
        self.assertRoundTripEqual(net.state_dict(), loaded.state_dict())


class TestQuantized(SerializationRoundTripTestCase, unittest.TestCase):
    qengines = ("qnnpack", "fbgemm")
    devices = ("cpu",)
    load_modes = ("weights_only_false", "default")

    def test_with_pytorch_allocator_helper(self, device):
        from torch.testing._internal.common_quantized import override_cpu_allocator_for_qnnpack

        with override_cpu_allocator_for_qnnpack(self.qengine == "qnnpack"):  # pytorch's own helper
            lin = torch.ao.nn.quantized.dynamic.Linear(4, 3)
            fresh = torch.ao.nn.quantized.dynamic.Linear(4, 3)
            fresh.load_state_dict(self.round_trip(lin.state_dict(), safe_globals=()))
            x = torch.ones(2, 4)
            self.assertTrue(torch.equal(fresh(x), lin(x)))


instantiate_round_trip_tests(TestTinyNet, globals())
instantiate_round_trip_tests(TestQuantized, globals())

if __name__ == "__main__":
    result = unittest.main(exit=False, verbosity=2).result
    sys.exit(0 if result.wasSuccessful() else 1)
