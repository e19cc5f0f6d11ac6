"""TorchScript and torch.export round trips, per quantized engine and load mode.

    python test_torchscript_export.py -v
"""

import torch
import torch.ao.nn.quantized as nnq
from torch.testing._internal.common_utils import TestCase, run_tests

from torch_serial_testing import SerializationRoundTripTestCase, instantiate_round_trip_tests, round_trip_dims
from torch_serial_testing.paths.export import ExportRoundTrips
from torch_serial_testing.paths.script import TorchScriptRoundTrips


def quantized_linear():
    qlinear = nnq.Linear(16, 8)
    qlinear.set_weight_bias(torch.quantize_per_tensor(torch.rand(8, 16), 0.1, 4, torch.qint8), torch.rand(8))
    return qlinear, [(torch.quantize_per_tensor(torch.rand(5, 16), 0.2, 10, torch.quint8),)]


class TestQLinearScript(TorchScriptRoundTrips, SerializationRoundTripTestCase, TestCase):
    qengines = ("fbgemm", "qnnpack")      # one test per engine, as for any round trip
    devices = ("cpu",)
    ignore_warnings = (r"`torch\.jit\.\w+` is deprecated", r".*quantized tensor creation functions.*",
                       r".*dispatching to 'torch\.jit\.load'.*")

    @round_trip_dims(load_modes=())       # torch.jit.load has no load mode: one test per engine
    def test_save_load(self, device):
        qlinear, calib_data = quantized_linear()
        for module in (torch.jit.script(qlinear), torch.jit.trace(qlinear, calib_data[0])):
            self.round_trip_jit(module, calib_data)

    def test_torch_load(self, device):    # one test per engine and load mode
        qlinear, calib_data = quantized_linear()
        self.round_trip_jit_torch_load(torch.jit.script(qlinear), calib_data)


class TestProgram(ExportRoundTrips, SerializationRoundTripTestCase, TestCase):
    devices = ("cpu",)

    @round_trip_dims(load_modes=())
    def test_save_load(self, device):
        program = torch.export.export(torch.nn.Linear(3, 2), (torch.randn(4, 3),))
        self.round_trip_export(program)   # runs it on the inputs it was exported with

    def test_torch_load(self, device):
        program = torch.export.export(torch.nn.Linear(3, 2), (torch.randn(4, 3),))
        self.round_trip_export_torch_load(program)


instantiate_round_trip_tests(TestQLinearScript, globals())
instantiate_round_trip_tests(TestProgram, globals())

if __name__ == "__main__":
    run_tests()
