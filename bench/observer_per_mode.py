"""The observer port's ``test_observer_state_dict`` generated per load mode (the body, calibration
included, run once per mode): what ``round_trip_each_mode`` saves.  A fixture of ``bench/each_mode.py``."""

from torch.testing._internal.common_utils import TestCase, run_tests

from test.ports.test_observer_serialization import OBSERVERS, calibrated
from torch_serial_testing import SerializationRoundTripTestCase, instantiate_round_trip_tests


class TestObserverPerMode(SerializationRoundTripTestCase, TestCase):
    qengines = ("fbgemm", "qnnpack")
    devices = ("cpu",)

    def _check(self, kind):
        observer = calibrated(kind, 30)
        state = observer.state_dict()
        loaded = self.round_trip(state, safe_globals=())
        for key in state:
            self.assertEqual(state[key], loaded[key])
        fresh = OBSERVERS[kind]()
        fresh.load_state_dict(loaded)
        self.assertEqual(observer.calculate_qparams(), fresh.calculate_qparams())

    def test_observer_state_dict_histogram(self, device):
        self._check("histogram")


instantiate_round_trip_tests(TestObserverPerMode, globals())

if __name__ == "__main__":
    run_tests()
