"""Tensor subclasses and numpy values round-tripped and compared exactly.

pytorch's ``TwoTensor`` is declared as it is imported; a numpy array needs the numpy recipe: the
classes, and numpy's array reconstructor (a function: declared explicitly, as torch allows it).

    python test_subclasses.py -v
"""

import unittest

import numpy as np
import torch
from torch.testing._internal.two_tensor import TwoTensor

try:
    from numpy._core.multiarray import _reconstruct  # numpy 2
except ImportError:
    from numpy.core.multiarray import _reconstruct  # numpy 1

from torch_serial_testing import SerializationRoundTripTestCase, UnsafeCallable, instantiate_round_trip_tests


class TestSubclasses(SerializationRoundTripTestCase, unittest.TestCase):
    devices = ("cpu",)

    def test_two_tensor(self, device):
        t = TwoTensor(torch.randn(2, 3), torch.randn(2, 3))
        self.assertRoundTripEqual(t, self.round_trip(t, safe_globals=(TwoTensor,)))

    def test_numpy_state(self, device):
        state = {"weight": torch.ones(2), "stats": np.arange(3.0)}
        recipe = (
            UnsafeCallable(_reconstruct, reason="numpy arrays"),
            np.ndarray,
            np.dtype,
            type(np.dtype("float64")),
        )
        self.assertRoundTripEqual(state, self.round_trip(state, safe_globals=recipe))


instantiate_round_trip_tests(TestSubclasses, globals())

if __name__ == "__main__":
    unittest.main()
