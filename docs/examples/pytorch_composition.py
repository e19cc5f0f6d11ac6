"""A pytorch-style test class: super().setUp(), a nested helper module, @parametrize, @swap, and
the library's load-mode and engine dimensions, under pytorch's instantiate_device_type_tests or the
library's instantiate_round_trip_tests (the same test ids either way).

    python pytorch_composition.py             # pytorch's instantiation
    python pytorch_composition.py --library   # the library's
"""

import sys

import torch
from torch.testing._internal.common_device_type import instantiate_device_type_tests
from torch.testing._internal.common_utils import TestCase, parametrize, swap

from torch_serial_testing import SerializationRoundTripTestCase, instantiate_round_trip_tests


class TestSchedulerNet(SerializationRoundTripTestCase, TestCase):
    class Net(torch.nn.Module):  # nested, as pytorch's TestLRScheduler.SchedulerTestNet
        def __init__(self, width=2):
            super().__init__()
            self.lin = torch.nn.Linear(width, width)

        def forward(self, x):
            return self.lin(x)

    qengines = ("fbgemm", "qnnpack")  # one test per engine, as well as per load mode

    def setUp(self):
        super().setUp()  # the generated TestSchedulerNetCPU is a subclass of this class
        torch.manual_seed(0)

    @parametrize("width", [2, 4])
    @swap([True, False])
    def test_state_dict(self, device, width):
        net = TestSchedulerNet.Net(width).to(device)
        state = self.round_trip(net.state_dict(), safe_globals=())  # in this test's load mode
        fresh = TestSchedulerNet.Net(width).to(device)
        fresh.load_state_dict(state)  # swapped in under @swap(True)
        x = torch.randn(3, width, device=device)
        self.assertEqual(net(x), fresh(x))


if "--library" in sys.argv:
    sys.argv.remove("--library")
    instantiate_round_trip_tests(TestSchedulerNet, globals())
else:
    instantiate_device_type_tests(TestSchedulerNet, globals(), only_for="cpu")

if __name__ == "__main__":
    import unittest

    # 2 widths x 2 swap values x 2 engines x 3 load modes = 24 tests, e.g.
    # TestSchedulerNetCPU.test_state_dict_width_2_swap_True_fbgemm_safe_globals_cpu
    result = unittest.main(exit=False, verbosity=1).result
    sys.exit(0 if result.wasSuccessful() and result.testsRun == 24 else 1)
