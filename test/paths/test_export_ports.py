# Owner(s): ["oncall: export"]
"""Port of pytorch's ``test/export/test_serialize.py`` ``TestSaveLoad.test_save_constants`` to
:mod:`torch_serial_testing.paths.export`: a program with a tensor attribute and lifted constants, saved with
``torch.export.save`` into memory and loaded with ``torch.export.load``.  Upstream compared the outputs with
``allclose``; ``round_trip_export`` compares them exactly, with the state dict, the constants and the graph code.
New: what ``torch.load`` does with that archive in every load mode -- refuses it, it is not a ``torch.save``
checkpoint -- predicted and asserted.

``test_script_environments`` runs this file under unittest and pytest in each environment state."""

import torch
from torch.testing._internal.common_utils import TestCase, run_tests

from torch_serial_testing import SerializationRoundTripTestCase, instantiate_round_trip_tests, no_round_trip_dims
from torch_serial_testing.paths.export import ExportRoundTrips, export_skip_reason


class Foo(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.tensor(3)

    def forward(self, x):
        list_tensor = [torch.tensor(3), torch.tensor(4)]
        return x + self.a + list_tensor[0] + list_tensor[1]


def exported():
    if reason := export_skip_reason():
        raise __import__("unittest").SkipTest(reason)
    return torch.export.export(Foo(), (torch.tensor(1),))


class TestSaveLoad(ExportRoundTrips, SerializationRoundTripTestCase, TestCase):
    devices = ("cpu",)

    @no_round_trip_dims  # torch.export.load has no load mode: one test
    def test_save_constants(self):
        ep = exported()
        loaded = self.round_trip_export(ep, [(torch.tensor(1),), (torch.tensor(-7),)])
        self.assertIsInstance(loaded, torch.export.ExportedProgram)

    def test_save_constants_torch_load(self, device):
        self.round_trip_export_torch_load(exported())  # refused in every mode: ends the test as a pass


instantiate_round_trip_tests(TestSaveLoad, globals())

if __name__ == "__main__":
    run_tests()
