"""Build a case once and load it in every mode (round_trip_each_mode), and keep two independent
round trips of one test apart with a subTest.

    python test_build_once.py -v
"""

import unittest

import torch
from torch.ao.quantization import FakeQuantize, HistogramObserver, MovingAverageMinMaxObserver

from torch_serial_testing import SerializationRoundTripTestCase, instantiate_round_trip_tests, round_trip_dims


def calibrated_histogram_observer():
    observer = HistogramObserver(bins=64)
    torch.manual_seed(0)
    for _ in range(4):  # the expensive part: build it once, not once per load mode
        observer(torch.randn(8, 16))
    return observer


class TestObservers(SerializationRoundTripTestCase, unittest.TestCase):
    devices = ("cpu",)

    @round_trip_dims(load_modes=())  # one test per device, not per mode: the modes are subtests below
    def test_observer_state_dict(self, device):
        observer = calibrated_histogram_observer()  # built once
        state = observer.state_dict()

        def check(loaded, mode):  # run for each mode that loaded
            fresh = HistogramObserver(bins=64)
            fresh.load_state_dict(loaded)
            self.assertEqual(observer.calculate_qparams(), fresh.calculate_qparams())

        loaded = self.round_trip_each_mode(state, check, safe_globals=())
        # a plain state_dict loads in every mode that runs (before torch 2.5 the safe_globals mode skips)
        self.assertEqual(len(loaded), 3 if hasattr(torch.serialization, "safe_globals") else 2)

    def test_fake_quant(self, device):
        fq = FakeQuantize(observer=MovingAverageMinMaxObserver)
        fq(torch.randn(5, 5) * 10)
        with self.subTest("whole module"):  # an expected rejection ends only this subtest
            loaded = self.round_trip(fq, safe_globals=(FakeQuantize, MovingAverageMinMaxObserver))
            self.assertEqual(fq.scale, loaded.scale)
        state = self.round_trip(fq.state_dict(), safe_globals=())  # runs in every mode
        fresh = FakeQuantize(observer=MovingAverageMinMaxObserver)
        fresh.load_state_dict(state)
        self.assertEqual(fq.scale, fresh.scale)


instantiate_round_trip_tests(TestObservers, globals())


if __name__ == "__main__":
    unittest.main()
