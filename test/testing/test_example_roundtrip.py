"""The library's own example: a float module round-tripped in every mode on every device.

Also the fixture the instantiation tests run in subprocesses (discovery, -k, xdist).
"""

import unittest

import torch

from test.helpers.roundtrip_fixtures import TinyNet
from torch_serial_testing import SerializationRoundTripTestCase, instantiate_round_trip_tests


class TestTinyNetSerialization(SerializationRoundTripTestCase, unittest.TestCase):
    # set: every module checkpoint names builtins.set, which torch allowlists only since 2.6;
    # declaring it anyway is not over-trust, so this one declaration holds before and after.
    safe_globals = (TinyNet, set)
    qengines = ("fbgemm", "qnnpack")

    def make_module(self):
        return TinyNet()

    def test_round_trip(self, device):
        original = self.make_module().to(device)
        loaded = self.round_trip(original)
        self.assertIsInstance(loaded, TinyNet)
        self.assertRoundTripEqual(original, loaded)
        x = torch.ones(1, 3, device=loaded.weight.device)
        self.assertRoundTripEqual(original(x.to(device)).cpu(), loaded(x).cpu())

    def test_state_dict(self, device):
        original = self.make_module().to(device)
        loaded = self.round_trip_state_dict(original)
        self.assertRoundTripEqual(original.cpu().state_dict(), loaded.cpu().state_dict())


instantiate_round_trip_tests(TestTinyNetSerialization, globals())

if __name__ == "__main__":
    unittest.main()
