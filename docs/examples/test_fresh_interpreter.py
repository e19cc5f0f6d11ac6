"""Load as a user would: in a fresh interpreter that imports only what a user's does.

A jagged nested tensor loads weights-only only where ``torch._dynamo`` was imported (it registers what the
tensor needs).  Making one imports it in the test's process, so an in-process round trip always loads.

    python test_fresh_interpreter.py -v
"""

import unittest

import torch

from torch_serial_testing import SerializationRoundTripTestCase, instantiate_round_trip_tests, round_trip_dims
from torch_serial_testing.paths.fresh import FreshImportError, FreshInterpreterLoads


def jagged():
    return torch.nested.nested_tensor([torch.randn(2, 3), torch.randn(4, 3)], layout=torch.jagged)


class TestJaggedCheckpoint(FreshInterpreterLoads, SerializationRoundTripTestCase, unittest.TestCase):
    devices = ("cpu",)
    fresh_imports = ("torch", "torch._dynamo")  # what a user's interpreter imports before torch.load

    def test_loads_as_a_user_would(self, device):
        nt = jagged()
        loaded = self.round_trip_fresh(nt)  # in this test's load mode, in a fresh interpreter
        for expected, actual in zip(nt.unbind(), loaded.unbind()):
            self.assertRoundTripEqual(expected, actual)

    @round_trip_dims(load_modes=())  # one test: the mode is given below
    def test_import_torch_alone_is_not_enough(self, device):
        with self.assertRaisesRegex(FreshImportError, r"import torch\._dynamo before torch\.load"):
            self.round_trip_fresh(jagged(), imports=("torch",), mode="safe_globals")


instantiate_round_trip_tests(TestJaggedCheckpoint, globals())

if __name__ == "__main__":
    unittest.main()
