"""Plain-torch twin of the observer port's ``test_observer_state_dict`` (test/ports): the same
observers, calibration, checks, engines and load calls, written by hand with pytorch's ``TestCase``.
A benchmark fixture, run by ``bench/each_mode.py``; not part of the suite."""

import io

import torch
from torch.testing._internal.common_quantization import override_quantized_engine, skipIfNoFBGEMM
from torch.testing._internal.common_utils import TestCase, parametrize, run_tests, instantiate_parametrized_tests

from test.ports.test_observer_serialization import OBSERVERS, calibrated


class TestObserverPlain(TestCase):
    @skipIfNoFBGEMM
    @parametrize("engine", ["fbgemm", "qnnpack"])
    @parametrize("kind", list(OBSERVERS))
    def test_observer_state_dict(self, kind, engine):
        with override_quantized_engine(engine):
            observer = calibrated(kind, 30)
            state = observer.state_dict()
            expected = observer.calculate_qparams()
            buf = io.BytesIO()
            torch.save(state, buf)
            data = buf.getvalue()
            for mode in ("weights_only_false", "safe_globals", "default"):
                with self.subTest(load_mode=mode):
                    f = io.BytesIO(data)
                    if mode == "weights_only_false":
                        loaded = torch.load(f, weights_only=False)
                    elif mode == "safe_globals":
                        with torch.serialization.safe_globals([]):
                            loaded = torch.load(f, weights_only=True)
                    else:
                        loaded = torch.load(f)
                    self.assertEqual(sorted(state), sorted(loaded))
                    for key in state:
                        self.assertEqual(state[key], loaded[key])
                    fresh = OBSERVERS[kind]()
                    fresh.load_state_dict(loaded)
                    self.assertEqual(expected, fresh.calculate_qparams())


instantiate_parametrized_tests(TestObserverPlain)

if __name__ == "__main__":
    run_tests()
