"""Load as a user would: in a fresh interpreter that imports only what a user's does.

On torch 2.6 to 2.14 a jagged nested tensor loads weights-only only where ``torch._dynamo`` was imported (it
registers what the tensor needs).  Making one imports it in the test's process, so an in-process round trip
always loads.
The tensor's own two globals are declared: torch 2.6 to 2.14 register them themselves (the declaration changes
nothing there), torch 2.15 does not, and its bare default load refuses them (a pass: rejected as predicted).
torch 2.4 pickles the tensor without ``_rebuild_njt`` (only its class is declared there) and its bare load is a
full load; the tensor's pickle also names ``builtins.set``, which torch allowlists itself from 2.6 (declared too).
torch 2.15's jagged tensors no longer name torch._dynamo's ``_DimRange``, nor do torch 2.4's: there the second
test skips, saying so.

    python test_fresh_interpreter.py -v
"""

import unittest

import torch
from torch.nested._internal.nested_tensor import NestedTensor

from torch_serial_testing import SerializationRoundTripTestCase, instantiate_round_trip_tests, round_trip_dims
from torch_serial_testing.paths.fresh import FreshImportError, FreshInterpreterLoads

try:
    from torch.nested._internal.nested_tensor import _rebuild_njt
except ImportError:  # torch 2.4 has no rebuild function of its own for the tensor
    _rebuild_njt = None


def jagged():
    return torch.nested.nested_tensor([torch.randn(2, 3), torch.randn(4, 3)], layout=torch.jagged)


class TestJaggedCheckpoint(FreshInterpreterLoads, SerializationRoundTripTestCase, unittest.TestCase):
    devices = ("cpu",)
    fresh_imports = ("torch", "torch._dynamo")  # what a user's interpreter imports before torch.load
    # the tensor's own globals, and builtins.set (its pickle names it; torch allowlists it itself from 2.6)
    safe_globals = (NestedTensor, _rebuild_njt, set) if _rebuild_njt else (NestedTensor, set)

    def test_loads_as_a_user_would(self, device):
        nt = jagged()
        loaded = self.round_trip_fresh(nt)  # in this test's load mode, in a fresh interpreter
        for expected, actual in zip(nt.unbind(), loaded.unbind()):
            self.assertRoundTripEqual(expected, actual)

    @round_trip_dims(load_modes=())  # one test: the mode is given below
    def test_import_torch_alone_is_not_enough(self, device):
        checkpoint = self.save_checkpoint(jagged())
        if not any(name.startswith("torch._dynamo.") for name in checkpoint.info.globals):
            self.skipTest("this torch's jagged tensors name nothing of torch._dynamo (torch 2.4, torch 2.15)")
        with self.assertRaisesRegex(FreshImportError, r"import torch\._dynamo before torch\.load"):
            self.load_checkpoint_fresh(checkpoint, imports=("torch",), mode="safe_globals")


instantiate_round_trip_tests(TestJaggedCheckpoint, globals())

if __name__ == "__main__":
    unittest.main()
