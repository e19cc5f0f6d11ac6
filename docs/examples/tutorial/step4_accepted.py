# test_mynet.py
import unittest

import torch

from torch_serial_testing import (
    SerializationRoundTripTestCase,
    instantiate_round_trip_tests,
    no_round_trip_dims,
)


class MyNet(torch.nn.Module):  # a class that is saved must live at module level
    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(2, 3))


class TestMyNet(SerializationRoundTripTestCase, unittest.TestCase):
    safe_globals = (MyNet,)  # what loading needs beyond torch's own allowlist
    devices = ("cpu",)  # the default is every device type available here

    def make_module(self):
        return MyNet()

    def test_round_trip(self, device):
        original = self.make_module().to(device)
        loaded = self.round_trip(original)  # save, then load in this test's load mode
        self.assertRoundTripEqual(original, loaded)  # exact: type, dtype, values, ...

    @no_round_trip_dims  # loads nothing: one test, not one per load mode
    def test_required_globals(self):
        self.assertRequiredGlobalsExpectedInline(self.make_module(), """\
test_mynet.MyNet
""")


instantiate_round_trip_tests(TestMyNet, globals())  # one test per load mode

if __name__ == "__main__":
    unittest.main()
