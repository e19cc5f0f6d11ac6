"""assert_round_trip_equal on tensor subclasses and layouts: each difference found, at its path."""

import unittest

import torch
from torch.testing._internal.two_tensor import TwoTensor

from torch_serial_testing.comparison import RoundTripMismatch, assert_round_trip_equal


def jagged(*parts):
    return torch.nested.nested_tensor(list(parts), layout=torch.jagged)


class TestSubclassComparison(unittest.TestCase):
    def mismatch(self, expected, actual, pattern, **checks):
        with self.assertRaisesRegex(RoundTripMismatch, pattern):
            assert_round_trip_equal(expected, actual, **checks)

    def test_wrapper_subclass_by_inner_tensor_name(self):
        a = torch.arange(3.0)
        assert_round_trip_equal(TwoTensor(a, a * 2), TwoTensor(a.clone(), a * 2))
        self.mismatch(TwoTensor(a, a * 2), TwoTensor(a, a * 3), r"at \.b: tensor values differ")
        self.mismatch(TwoTensor(a, a), a, "tensor class Tensor != expected TwoTensor")
        assert_round_trip_equal(TwoTensor(a, a), TwoTensor(a, a), allow_subclasses=True)

    def test_jagged_by_its_parts(self):
        assert_round_trip_equal(
            jagged(torch.arange(3.0), torch.arange(5.0)), jagged(torch.arange(3.0), torch.arange(5.0))
        )
        self.mismatch(
            jagged(torch.arange(3.0), torch.arange(5.0)),
            jagged(torch.arange(5.0), torch.arange(3.0)),  # the same lengths (the cached seqlens agree), in turn
            r"at \._(values|offsets): tensor values differ",
        )

    def test_strided_nested_by_component(self):
        nt = torch.nested.nested_tensor([torch.arange(3.0), torch.arange(5.0)])
        other = torch.nested.nested_tensor([torch.arange(3.0), torch.arange(5.0) + 1])
        self.mismatch(nt, other, r"at \.unbind\(\)\[1\]: tensor values differ")

    def test_sparse_layouts_by_indices_and_values(self):
        x = torch.eye(3)
        for to in (torch.Tensor.to_sparse, torch.Tensor.to_sparse_csr, torch.Tensor.to_sparse_csc):  # BSR/BSC: the port
            with self.subTest(layout=to.__name__):
                assert_round_trip_equal(to(x), to(x.clone()))
                self.mismatch(to(x), to(x * 2), r"Sparse (COO|CSR|CSC) values are not equal")
                self.mismatch(
                    to(x), to(x.flip(0)), r"Sparse (COO|CSR|CSC) (indices|col_indices|row_indices) are not equal"
                )
                assert_round_trip_equal(to(x), x, check_layout=False)
        uncoalesced = torch.sparse_coo_tensor(torch.tensor([[0, 0], [1, 1]]), torch.tensor([1.0, 2.0]), (3, 3))
        self.mismatch(uncoalesced, uncoalesced.coalesce(), r"is_coalesced\(\) True != expected False")
        assert_round_trip_equal(uncoalesced, uncoalesced.clone())

    def test_state_of_a_plain_subclass(self):
        class Sub(torch.Tensor):
            pass

        x, y = torch.ones(2).as_subclass(Sub), torch.ones(2).as_subclass(Sub)
        x.note = "kept"
        self.mismatch(x, y, r"at \.__getstate__\(\): keys differ: missing \['note'\]")
        y.note = "kept"
        assert_round_trip_equal(x, y)


if __name__ == "__main__":
    unittest.main()
