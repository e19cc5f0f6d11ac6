# test_linear_devices.py -- every load mode on cpu and on the registered backend (npu)
import unittest

import torch

from torch_serial_testing import SerializationRoundTripTestCase, instantiate_round_trip_tests


class TestLinearDevices(SerializationRoundTripTestCase, unittest.TestCase):
    safe_globals = (torch.nn.Linear, set)
    devices = ("cpu", "privateuse1")   # the out-of-tree backend, whatever it is named

    def test_linear(self, device):
        original = torch.nn.Linear(3, 2).to(device)
        loaded = self.round_trip(original)                      # on self.load_device
        self.assertRoundTripEqual(original.to(self.load_device), loaded)


instantiate_round_trip_tests(TestLinearDevices, globals())


if __name__ == "__main__":
    unittest.main()
