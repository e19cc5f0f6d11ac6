# test_tinynet.py -- run with: python test_tinynet.py -v   (or python -m unittest test_tinynet -v, or pytest)
import unittest

import torch

from torch_serial_testing import (
    SerializationRoundTripTestCase,
    instantiate_round_trip_tests,
    no_round_trip_dims,
)


class TinyNet(torch.nn.Module):      # checkpointed classes live at module level
    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(2, 3))


class TestTinyNet(SerializationRoundTripTestCase, unittest.TestCase):
    safe_globals = (TinyNet, set)        # what a full-module checkpoint legitimately needs
                                         # (set: allowlisted by torch itself only since 2.6)
    qengines = ("fbgemm", "qnnpack")     # optional: one test per quantized engine
    devices = ("cpu",)                   # default: every available device type

    def make_module(self):
        return TinyNet()

    def test_round_trip(self, device):
        original = self.make_module().to(device)
        loaded = self.round_trip(original)          # in this test's load mode
        self.assertRoundTripEqual(original, loaded)  # exact; names the path of a difference

    def test_state_dict(self, device):
        original = self.make_module()
        fresh, state = self.round_trip_state_dict(original, return_state=True)
        self.assertRoundTripEqual(original.state_dict(), state)  # every key, as loaded
        self.assertRoundTripEqual(original.state_dict(), fresh.state_dict())

    @no_round_trip_dims                  # never loads: one test, not one per mode and engine
    def test_required_globals(self):
        self.assertRequiredGlobalsExpectedInline(self.make_module(), """\
test_tinynet.TinyNet
""")


instantiate_round_trip_tests(TestTinyNet, globals())


if __name__ == "__main__":
    unittest.main()
