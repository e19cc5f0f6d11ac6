"""assert_round_trip_equal: exact, and it says where the first difference is."""

import unittest

import torch

from roundtrip_fixtures import TinyNet, tiny_qlinear
from torch_serial_testing import RoundTripMismatch, assert_round_trip_equal


class TestComparison(unittest.TestCase):
    def assertMismatch(self, expected, actual, path, detail):
        with self.assertRaises(RoundTripMismatch) as cm:
            assert_round_trip_equal(expected, actual)
        self.assertEqual(cm.exception.path, path)
        self.assertIn(detail, str(cm.exception))

    def test_equal_nested(self):
        value = {"a": [1, 2.5, (torch.ones(2), None)], "b": "x", "nan": float("nan")}
        assert_round_trip_equal(value, {"a": [1, 2.5, (torch.ones(2), None)], "b": "x", "nan": float("nan")})

    def test_paths(self):
        self.assertMismatch([0, [1, 2]], [0, [1, 3]], "[1][1]", "3 != expected 2")
        self.assertMismatch({"weight": torch.zeros(2)}, {"weight": torch.ones(2)}, "['weight']", "tensor values differ")
        self.assertMismatch({"a": 1}, {"b": 1}, "", "missing ['a'], unexpected ['b']")
        self.assertMismatch((1, 2), (1, 2, 3), "", "length 3 != expected 2")
        self.assertMismatch((1,), [1], "", "type list != expected tuple")
        self.assertMismatch([1], [1.0], "[0]", "type float != expected int")

    def test_tensor_metadata(self):
        self.assertMismatch(torch.ones(2), torch.ones(2, dtype=torch.float64), "", "dtype torch.float64")
        self.assertMismatch(torch.ones(2), torch.ones(1, 2), "", "shape")
        self.assertMismatch(torch.nn.Parameter(torch.ones(2)), torch.ones(2), "", "tensor class Tensor != expected Parameter")
        assert_round_trip_equal(torch.tensor([float("nan")]), torch.tensor([float("nan")]))

    def test_tolerance_is_opt_in(self):
        a, b = torch.tensor([1.0]), torch.tensor([1.0 + 1e-6])
        self.assertMismatch(a, b, "", "tensor values differ")
        assert_round_trip_equal(a, b, rtol=1e-5, atol=0)
        with self.assertRaisesRegex(ValueError, "together"):
            assert_round_trip_equal(a, b, rtol=1e-5)

    def test_quantized_compared_by_representation_not_dequantized_value(self):
        x = torch.tensor([0.0, 2.0, 4.0])
        q1 = torch.quantize_per_tensor(x, 2.0, 0, torch.qint8)
        q2 = torch.quantize_per_tensor(x, 1.0, 0, torch.qint8)  # same dequantized values
        self.assertTrue(torch.equal(q1.dequantize(), q2.dequantize()))
        self.assertMismatch(q1, q2, "", "q_scale 1.0 != expected 2.0")
        q3 = torch.quantize_per_tensor(x, 2.0, 1, torch.qint8)
        self.assertMismatch(q1, q3, "", "q_zero_point")
        pc = torch.quantize_per_channel(torch.ones(2, 2), torch.tensor([1.0, 2.0]), torch.tensor([0, 0]), 0, torch.qint8)
        pc2 = torch.quantize_per_channel(torch.ones(2, 2), torch.tensor([1.0, 0.5]), torch.tensor([0, 0]), 0, torch.qint8)
        self.assertMismatch(pc, pc2, ".q_per_channel_scales()", "tensor values differ")
        self.assertMismatch(q1, pc, "", "shape")
        assert_round_trip_equal(pc, pc.clone())

    def test_modules_and_script_objects(self):
        a, b = TinyNet(), TinyNet()
        assert_round_trip_equal(a, b)
        with torch.no_grad():
            b.weight[1, 2] = 0
        self.assertMismatch(a, b, ".state_dict()['weight']", "tensor values differ")
        lin = tiny_qlinear()
        packed = lin._packed_params._packed_params
        self.assertIsInstance(packed, torch.ScriptObject)
        assert_round_trip_equal(packed, packed)
        other = tiny_qlinear(bias=0.0)
        with self.assertRaises(RoundTripMismatch) as cm:
            assert_round_trip_equal(lin, other)
        self.assertEqual(cm.exception.path, ".state_dict()['_packed_params._packed_params'][1]")
        with self.assertRaises(RoundTripMismatch) as cm:
            assert_round_trip_equal(packed, other._packed_params._packed_params)
        self.assertEqual(cm.exception.path, ".__getstate__()[0][1]")


if __name__ == "__main__":
    unittest.main()
