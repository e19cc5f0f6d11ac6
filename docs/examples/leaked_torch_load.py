"""A test that replaces torch.load and leaves it replaced fails as a leak; the next test gets torch's own."""

import io
import unittest

import torch

from torch_serial_testing import SerializationRoundTripTestCase

_real_load = torch.load


def force_full_load(*args, **kwargs):  # the common "fix" for torch 2.6's default: never do this
    kwargs["weights_only"] = False
    return _real_load(*args, **kwargs)


class TestShim(SerializationRoundTripTestCase, unittest.TestCase):
    def test_a_installs_a_shim(self):
        torch.load = force_full_load  # never undone

    def test_b_runs_next(self):
        assert torch.load is torch.serialization.load


if __name__ == "__main__":
    stream = io.StringIO()
    result = unittest.TextTestRunner(stream=stream, verbosity=0).run(
        unittest.defaultTestLoader.loadTestsFromTestCase(TestShim)
    )
    ((failed, report),) = result.failures + result.errors
    assert failed.id().endswith("test_a_installs_a_shim"), failed.id()
    assert "leaked global state (now restored): torch.load is __main__.force_full_load" in report, report
    assert result.testsRun == 2 and torch.load is torch.serialization.load
    print(report.strip().splitlines()[-1][:200])
