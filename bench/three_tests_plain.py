""":mod:`three_tests` written with plain torch: the same three tests, the same saves and loads.

A hand-written test knows its torch: from 2.6 the bare ``torch.load`` is weights-only and rejects the
full module (its class is not allowlisted).  It checks that the library was never imported.
"""

import io
import pickle
import sys
import unittest

import torch

DEFAULT_REJECTS = tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2]) >= (2, 6)


class TinyNet(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(2, 3))


def saved(obj: object) -> io.BytesIO:
    buf = io.BytesIO()
    torch.save(obj, buf)
    buf.seek(0)
    return buf


class TestTinyPlain(unittest.TestCase):
    def check(self, original: TinyNet, loaded: TinyNet) -> None:
        self.assertIs(type(loaded), TinyNet)
        for (k, a), (j, b) in zip(original.state_dict().items(), loaded.state_dict().items()):
            self.assertEqual(k, j)
            self.assertTrue(torch.equal(a, b))

    def test_round_trip_weights_only_false_cpu(self) -> None:
        original = TinyNet()
        self.check(original, torch.load(saved(original), weights_only=False))

    def test_round_trip_safe_globals_cpu(self) -> None:
        original = TinyNet()
        with torch.serialization.safe_globals([TinyNet, set]):
            self.check(original, torch.load(saved(original), weights_only=True))

    def test_round_trip_default_cpu(self) -> None:
        original = TinyNet()
        if DEFAULT_REJECTS:
            with self.assertRaises(pickle.UnpicklingError):
                torch.load(saved(original))
        else:
            self.check(original, torch.load(saved(original)))

    @classmethod
    def tearDownClass(cls) -> None:
        if "torch_serial_testing" in sys.modules:
            raise AssertionError("the plain twin imported torch_serial_testing: it would not measure plain torch")


if __name__ == "__main__":
    unittest.main()
