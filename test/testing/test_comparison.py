"""assert_round_trip_equal: exact, and it says where the first difference is."""

import collections
import io
import unittest
import warnings

import torch

from test.helpers.roundtrip_fixtures import TinyNet, tiny_qlinear
from torch_serial_testing import (
    RoundTripMismatch,
    assert_round_trip_equal,
    override_qengine,
    round_trip,
    supported_qengines,
)


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
        self.assertMismatch(
            torch.nn.Parameter(torch.ones(2)), torch.ones(2), "", "tensor class Tensor != expected Parameter"
        )
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
        pc = torch.quantize_per_channel(
            torch.ones(2, 2), torch.tensor([1.0, 2.0]), torch.tensor([0, 0]), 0, torch.qint8
        )
        pc2 = torch.quantize_per_channel(
            torch.ones(2, 2), torch.tensor([1.0, 0.5]), torch.tensor([0, 0]), 0, torch.qint8
        )
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


class TestComparisonKnobs(unittest.TestCase):
    """assert_close-like knobs: each relaxes exactly one property; the default stays exact."""

    def mismatch(self, expected, actual, detail, **knobs):
        with self.assertRaises(RoundTripMismatch) as cm:
            assert_round_trip_equal(expected, actual, **knobs)
        self.assertIn(detail, str(cm.exception))

    def test_allow_subclasses(self):
        param, plain = torch.nn.Parameter(torch.ones(2)), torch.ones(2, requires_grad=True)
        self.mismatch(param, plain, "tensor class Tensor != expected Parameter (allow_subclasses=True accepts")
        assert_round_trip_equal(param, plain, allow_subclasses=True)
        assert_round_trip_equal(plain, param, allow_subclasses=True)
        # related containers too; unrelated types still differ
        assert_round_trip_equal(collections.OrderedDict(a=1), {"a": 1}, allow_subclasses=True)
        self.mismatch(collections.OrderedDict(a=1), {"a": 1}, "type dict != expected OrderedDict")
        self.mismatch((1,), [1], "type list != expected tuple", allow_subclasses=True)
        # values are still compared
        self.mismatch(param, torch.zeros(2, requires_grad=True), "tensor values differ", allow_subclasses=True)

    def test_requires_grad(self):
        a, b = torch.ones(2, requires_grad=True), torch.ones(2)
        self.mismatch(a, b, "requires_grad False != expected True (check_requires_grad=False ignores it)")
        assert_round_trip_equal(a, b, check_requires_grad=False)
        self.mismatch(a, torch.zeros(2), "tensor values differ", check_requires_grad=False)

    def test_parameter_bias_that_comes_back_a_tensor(self):
        # what qnnpack's dynamic Linear hands back: a Parameter before saving, a plain Tensor after
        before = {"bias": torch.nn.Parameter(torch.ones(3))}
        after = {"bias": torch.ones(3)}
        self.mismatch(before, after, "tensor class Tensor != expected Parameter")
        self.mismatch(before, after, "requires_grad False != expected True", allow_subclasses=True)
        assert_round_trip_equal(before, after, allow_subclasses=True, check_requires_grad=False)

    def test_dtype(self):
        a, b = torch.tensor([1.0, 2.0]), torch.tensor([1.0, 2.0], dtype=torch.float64)
        self.mismatch(a, b, "dtype torch.float64 != expected torch.float32 (check_dtype=False ignores it)")
        assert_round_trip_equal(a, b, check_dtype=False)
        self.mismatch(a, torch.tensor([1.0, 2.5], dtype=torch.float64), "tensor values differ", check_dtype=False)
        assert_round_trip_equal(torch.tensor([1, 2]), torch.tensor([1.0, 2.0]), check_dtype=False)

    def test_layout(self):
        dense = torch.tensor([[0.0, 1.0], [2.0, 0.0]])
        sparse = dense.to_sparse()
        self.mismatch(dense, sparse, "layout torch.sparse_coo != expected torch.strided (check_layout=False")
        assert_round_trip_equal(dense, sparse, check_layout=False)
        self.mismatch(dense, (dense + 1).to_sparse(), "tensor values differ", check_layout=False)

    def test_device(self):
        others = [
            d for d in ("cuda", "xpu", "mps") if getattr(getattr(torch, d, None), "is_available", lambda: False)()
        ]
        if not others:
            self.skipTest("no second device type here to compare a cpu tensor with")
        a = torch.ones(2)
        b = a.to(others[0])
        self.mismatch(
            a,
            b,
            "device",
        )
        assert_round_trip_equal(a, b, check_device=False)

    def test_shape_and_quantization_always_compared(self):
        everything_off = dict(
            allow_subclasses=True, check_requires_grad=False, check_dtype=False, check_device=False, check_layout=False
        )
        self.mismatch(torch.ones(2), torch.ones(1, 2), "shape", **everything_off)
        x = torch.tensor([0.0, 2.0])
        q1 = torch.quantize_per_tensor(x, 2.0, 0, torch.qint8)
        q2 = torch.quantize_per_tensor(x, 1.0, 0, torch.qint8)
        self.mismatch(q1, q2, "q_scale", **everything_off)
        self.mismatch(q1, x, "quantized False != expected True", **everything_off)

    def test_mixin_forwards_the_knobs(self):
        from torch_serial_testing import SerializationRoundTripTestCase

        class Inner(SerializationRoundTripTestCase, unittest.TestCase):
            def test_knobs(self):
                self.assertRoundTripEqual(
                    torch.nn.Parameter(torch.ones(2)), torch.ones(2), allow_subclasses=True, check_requires_grad=False
                )
                with self.assertRaises(RoundTripMismatch):
                    self.assertRoundTripEqual(torch.nn.Parameter(torch.ones(2)), torch.ones(2))

        result = unittest.TextTestRunner(stream=io.StringIO()).run(
            unittest.defaultTestLoader.loadTestsFromTestCase(Inner)
        )
        self.assertTrue(result.wasSuccessful(), result.failures + result.errors)


@unittest.skipUnless("qnnpack" in supported_qengines(), "qnnpack is not supported by this torch build")
class TestQnnpackDynamicBias(unittest.TestCase):
    """The real case: qnnpack's dynamic Linear gives its bias back as a Parameter before saving."""

    def test_round_tripped_dynamic_linear(self):
        from torch.ao.nn.quantized.dynamic import Linear as DynamicLinear

        with override_qengine("qnnpack"):
            float_linear = torch.nn.Linear(4, 3)
            float_linear.qconfig = torch.ao.quantization.default_dynamic_qconfig
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                original = DynamicLinear.from_float(float_linear)
            loaded = round_trip(original, "weights_only_false").value
            self.assertIsInstance(original._weight_bias()[1], torch.nn.Parameter)
            self.assertNotIsInstance(loaded._weight_bias()[1], torch.nn.Parameter)
            with self.assertRaisesRegex(RoundTripMismatch, "tensor class Tensor != expected Parameter"):
                assert_round_trip_equal(original, loaded)
            assert_round_trip_equal(original, loaded, allow_subclasses=True, check_requires_grad=False)


if __name__ == "__main__":
    unittest.main()
