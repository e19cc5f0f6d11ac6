"""A three-test file on the library: the smallest real use (issue 37's "3-test file" benchmark).

One module, one test, three load modes: ``test_round_trip_{weights_only_false,safe_globals,default}_cpu``.
Its plain-torch twin is :mod:`three_tests_plain`; ``bench/run.py --only small_file`` compares the two
as whole processes (``python -m unittest three_tests`` from ``bench/``).
"""

import unittest

import torch

from torch_serial_testing import SerializationRoundTripTestCase, instantiate_round_trip_tests


class TinyNet(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(2, 3))


class TestTiny(SerializationRoundTripTestCase, unittest.TestCase):
    safe_globals = (TinyNet, set)  # set: on torch's own allowlist only since 2.6
    devices = ("cpu",)

    def test_round_trip(self, device: str) -> None:
        original = TinyNet()
        loaded = self.round_trip(original)
        self.assertRoundTripEqual(original, loaded)


instantiate_round_trip_tests(TestTiny, globals())


if __name__ == "__main__":
    unittest.main()
