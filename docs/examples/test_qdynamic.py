# test_qdynamic.py -- a quantized module whose bias changes class in the round trip
import unittest

import torch
from torch.ao.nn.quantized.dynamic import Linear as DynamicLinear
from torch.ao.nn.quantized.modules.linear import LinearPackedParams
from torch.testing._internal.common_quantized import override_cpu_allocator_for_qnnpack

from torch_serial_testing import SerializationRoundTripTestCase, instantiate_round_trip_tests


class TestDynamicLinear(SerializationRoundTripTestCase, unittest.TestCase):
    safe_globals = (DynamicLinear, LinearPackedParams, torch.ScriptObject, set)
    qengines = ("fbgemm", "qnnpack")
    devices = ("cpu",)
    # torch 2.13 deprecates creating quantized tensors; these tests do it on purpose
    ignore_warnings = (r".*quantized tensor creation functions.*",)

    def make_module(self):
        # built as pytorch's qnnpack tests build it: under the mobile CPU allocator
        with override_cpu_allocator_for_qnnpack(self.qengine == "qnnpack"):
            float_linear = torch.nn.Linear(4, 3)
            float_linear.qconfig = torch.ao.quantization.default_dynamic_qconfig
            return DynamicLinear.from_float(float_linear)

    def test_round_trip(self, device):
        original = self.make_module()
        loaded = self.round_trip(original)
        # qnnpack: bias Parameter before, Tensor after; everything else stays exact
        self.assertRoundTripEqual(original, loaded, allow_subclasses=True)


instantiate_round_trip_tests(TestDynamicLinear, globals())


if __name__ == "__main__":
    unittest.main()
