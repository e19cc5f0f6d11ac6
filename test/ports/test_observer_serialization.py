# Owner(s): ["oncall: quantization"]
"""Port of pytorch's ``test/quantization/core/test_workflow_module.py`` serialization tests: observers'
``state_dict`` saved and loaded back (``test_state_dict``, with a calibrated ``HistogramObserver`` as the
expensive case) and ``FakeQuantize`` (``test_fq_serializable_per_tensor`` / ``_per_channel``), per
quantized engine.  An observer is calibrated once per engine and loaded in every mode
(``round_trip_each_mode``); the fake-quant test checks its whole-module round trip and, independently
of how that one ends, its state_dict."""

import torch
from torch.ao.quantization import (
    FakeQuantize,
    HistogramObserver,
    MinMaxObserver,
    MovingAverageMinMaxObserver,
    MovingAveragePerChannelMinMaxObserver,
)
from torch.testing._internal.common_quantization import skipIfNoFBGEMM
from torch.testing._internal.common_utils import TestCase, parametrize, run_tests

from test.helpers.roundtrip_fixtures import RUNNABLE_MODES
from test.ports._instantiate import instantiate
from torch_serial_testing import SerializationRoundTripTestCase, round_trip_dims

OBSERVERS = {
    "minmax": lambda: MinMaxObserver(dtype=torch.quint8),
    "moving_average": lambda: MovingAverageMinMaxObserver(averaging_constant=0.5, dtype=torch.quint8),
    "histogram": lambda: HistogramObserver(bins=512),
}
FAKE_QUANT = {
    False: (FakeQuantize, MovingAverageMinMaxObserver, {}),
    True: (
        FakeQuantize,
        MovingAveragePerChannelMinMaxObserver,
        {"quant_min": -128, "quant_max": 127, "dtype": torch.qint8, "qscheme": torch.per_channel_symmetric},
    ),
}


def calibrated(kind, batches):
    torch.manual_seed(0)
    observer = OBSERVERS[kind]()
    for _ in range(batches):
        observer(torch.randn(2000) * 3 + 1)
    return observer


class TestObserverSerialization(SerializationRoundTripTestCase, TestCase):
    qengines = ("fbgemm", "qnnpack")

    def setUp(self):
        super().setUp()
        self.batches = 30  # the histogram's calibration is this test's expensive setup

    @skipIfNoFBGEMM
    @parametrize("kind", list(OBSERVERS))
    @round_trip_dims(load_modes=())  # built once per engine; round_trip_each_mode loads it in every mode
    def test_observer_state_dict(self, device, kind):
        observer = calibrated(kind, self.batches)
        state = observer.state_dict()
        expected = observer.calculate_qparams()

        def check(loaded, mode):
            self.assertEqual(sorted(state), sorted(loaded))
            for key in state:
                self.assertEqual(state[key], loaded[key])
            fresh = OBSERVERS[kind]()
            fresh.load_state_dict(loaded)
            self.assertEqual(expected, fresh.calculate_qparams())

        loaded = self.round_trip_each_mode(state, check, safe_globals=())
        self.assertEqual(len(loaded), len(RUNNABLE_MODES))  # a plain state_dict loads in every mode run here

    @parametrize("per_channel", [False, True])
    def test_fq_serializable(self, device, per_channel):
        fq_cls, observer, kwargs = FAKE_QUANT[per_channel]
        fq = fq_cls(observer=observer, **kwargs)
        x = torch.randn(5, 5, dtype=torch.float32) * 10
        fq(x)
        with self.subTest("whole module"):  # an expected rejection ends only this subtest
            loaded = self.round_trip(fq, safe_globals=(fq_cls, observer))
            self.assertEqual(fq.scale, loaded.scale)
            self.assertEqual(fq(x), loaded(x))
        # independent of how the whole-module round trip ended: the state_dict, in the same mode
        state = self.round_trip(fq.state_dict(), safe_globals=())
        fresh = fq_cls(observer=observer, **kwargs)
        fresh.load_state_dict(state)
        self.assertEqual(fq.scale, fresh.scale)
        self.assertEqual(fq.zero_point, fresh.zero_point)
        self.assertEqual(fq(x), fresh(x))


instantiate(TestObserverSerialization, globals())

if __name__ == "__main__":
    run_tests()
