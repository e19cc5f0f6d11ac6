"""A multi-rank test file as a user writes one: run as a script, by ``python -m unittest`` and by pytest (with
xdist), by :mod:`test.paths.test_distributed`.  One test passes, one fails in rank 1."""

import unittest

import torch

from torch_serial_testing import SerializationRoundTripTestCase, instantiate_round_trip_tests
from torch_serial_testing.paths.distributed import MultiRankRoundTrips


class TestScript(MultiRankRoundTrips, SerializationRoundTripTestCase, unittest.TestCase):
    devices = ("cpu",)
    load_modes = ("default",)

    def test_passes(self, device):
        # each rank its own plain tensor: the runners are what is tested here, on any torch with gloo (the ports
        # round-trip DTensors)
        original = torch.arange(4.0) + 10 * self.rank
        self.assertRoundTripEqual(original, self.round_trip(original))

    def test_fails_in_rank_one(self, device):
        self.assertNotEqual(self.rank, 1, "rank one says no")


instantiate_round_trip_tests(TestScript, globals())

if __name__ == "__main__":
    unittest.main()
