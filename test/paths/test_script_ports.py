# Owner(s): ["oncall: quantization"]
"""Ports of pytorch's TorchScript save/load tests to :mod:`torch_serial_testing.paths.script`.

* ``checkScriptable(qlinear, [[X_q]], check_save_load=True)`` of the quantized ``Linear`` in
  ``test/quantization/core/test_quantized_module.py`` (``_test_linear_api_impl``), per quantized engine: the
  module scripted and traced, each equal to the eager module on the calibration data, then saved with
  ``torch.jit.save``, loaded with ``torch.jit.load`` and compared again -- here exactly (state, code, outputs) by
  ``round_trip_jit``.  New: the same archive read by ``torch.load`` in every load mode.
* ``test_serialization_zipfile_actually_jit`` (``test/test_serialization.py``): a scripted ``Linear`` saved with
  ``torch.jit.save`` and read by ``torch.load``.  Upstream pins ``weights_only=True`` refusing and
  ``weights_only=False`` loading; here each load mode asserts what torch does in this environment (both
  ``TORCH_FORCE_*`` switches included): handed to ``torch.jit.load``, or refused as a TorchScript archive -- never
  "a global is not allowlisted".  Upstream wrote to a named temporary file; the archive stays in memory here.

``test_script_environments`` runs this file under unittest and pytest in each environment state."""

import torch
import torch.ao.nn.quantized as nnq
from torch.testing._internal.common_utils import TestCase, parametrize, run_tests

from torch_serial_testing import SerializationRoundTripTestCase, instantiate_round_trip_tests, round_trip_dims
from torch_serial_testing.paths.script import TorchScriptRoundTrips

#: Warnings these tests provoke on purpose: torch 2.13 deprecates TorchScript and quantized tensor creation,
#: and torch.load says it hands a TorchScript archive to torch.jit.load.
WARNINGS = (
    r"`torch\.jit\.\w+` is deprecated",
    r".*quantized tensor creation functions.*",
    r".*looks like a TorchScript archive dispatching to 'torch\.jit\.load'.*",
)
BATCH, IN_FEATURES, OUT_FEATURES = 5, 16, 8


def quantized_linear(use_bias):
    """Upstream's ``qlinear_copy``: a quantized Linear with random quantized weights, and its calibration data."""
    weight = torch.quantize_per_tensor(torch.rand(OUT_FEATURES, IN_FEATURES), 0.1, 4, torch.qint8)
    bias = torch.rand(OUT_FEATURES) if use_bias else None
    qlinear = nnq.Linear(IN_FEATURES, OUT_FEATURES)
    qlinear.set_weight_bias(weight, bias)
    x_q = torch.quantize_per_tensor(torch.rand(BATCH, IN_FEATURES), 0.2, 10, torch.quint8)
    return qlinear, [(x_q,)]


class TestQuantizedLinearScriptable(TorchScriptRoundTrips, SerializationRoundTripTestCase, TestCase):
    qengines = ("fbgemm", "qnnpack")
    devices = ("cpu",)
    ignore_warnings = WARNINGS

    def check_scriptable(self, orig_mod, calib_data):
        """Upstream's ``checkScriptable(orig_mod, calib_data, check_save_load=True)``."""
        scripted = torch.jit.script(orig_mod)
        traced = torch.jit.trace(orig_mod, calib_data[0])
        for kind, script_mod in (("scripted", scripted), ("traced", traced)):
            with self.subTest(kind):
                for inputs in calib_data:  # upstream's _checkModuleCorrectnessAgainstOrig, exactly
                    self.assertRoundTripEqual(orig_mod(*inputs), script_mod(*inputs))
                self.round_trip_jit(script_mod, calib_data)  # saved, loaded, compared to script_mod

    @parametrize("use_bias", [True, False])
    @round_trip_dims(load_modes=())  # torch.jit.load has no load mode
    def test_linear_api_scriptable(self, device, use_bias):
        qlinear, calib_data = quantized_linear(use_bias)
        self.check_scriptable(qlinear, calib_data)

    def test_linear_torch_load(self, device):
        qlinear, calib_data = quantized_linear(use_bias=True)
        loaded = self.round_trip_jit_torch_load(torch.jit.script(qlinear), calib_data)  # a refusal ends it here
        self.assertIsInstance(loaded, torch.jit.ScriptModule)


class TestSerializationZipfileActuallyJit(TorchScriptRoundTrips, SerializationRoundTripTestCase, TestCase):
    devices = ("cpu",)
    ignore_warnings = WARNINGS

    def test_serialization_zipfile_actually_jit(self, device):
        linear = torch.nn.Linear(3, 4)
        loaded = self.round_trip_jit_torch_load(torch.jit.script(linear), [(torch.randn(2, 3),)])
        self.assertIsInstance(loaded, torch.jit.ScriptModule)


instantiate_round_trip_tests(TestQuantizedLinearScriptable, globals())
instantiate_round_trip_tests(TestSerializationZipfileActuallyJit, globals())

if __name__ == "__main__":
    run_tests()
