"""A small, representative round-trip test file, run in subprocesses by other tests.

Not named ``test_*`` so runners do not collect it directly.  ``EnvCheckNet``
holds its parameters directly, so its full-module checkpoint needs one global
of its own outside torch's allowlist (``envcheck_roundtrip.EnvCheckNet``) plus,
on a torch whose allowlist lacks it (before torch 2.6), ``builtins.set``
(``nn.Module._non_persistent_buffers_set``); its state_dict needs none.
``safe_globals`` declares ``set`` too: the mixin does not count a declared global
the checkpoint uses and torch already allows as over-trust, so one declaration
is right on every torch.

Run as a script it is also a tiny driver: it runs the given test ids in the
given order, once per state (a state may set the environment and its own
order of ids), and prints one JSON object per state
mapping each test id to its outcome ("pass", "fail", "error", "skip") and,
for failures and errors, the exception message::

    python envcheck_roundtrip.py --spec '{"ids": [...], "states": [{"env": {...}, "ids": [...]}]}'
"""

from __future__ import annotations

import json
import os
import sys
import unittest

import torch

from torch_serial_testing import SerializationRoundTripTestCase, instantiate_round_trip_tests


class EnvCheckNet(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.weight = torch.nn.Parameter(torch.randn(3, 4, generator=g))
        self.bias = torch.nn.Parameter(torch.randn(3, generator=g))
        self.register_buffer("scale", torch.tensor(2.0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x @ self.weight.t() + self.bias) * self.scale


class EnvCheckRoundTrip(SerializationRoundTripTestCase, unittest.TestCase):
    safe_globals = (EnvCheckNet, set)  # set: portable across the torch 2.6 allowlist change (see above)

    def make_module(self) -> EnvCheckNet:
        return EnvCheckNet()

    def test_full_module(self, device: str) -> None:
        module = self.build_module()
        loaded = self.round_trip(module)
        self.assertIsInstance(loaded, EnvCheckNet)
        self.assertRoundTripEqual(module, loaded)
        x = torch.ones(2, 4)
        self.assertEqual(module(x).tolist(), loaded(x).tolist())

    def test_state_dict(self, device: str) -> None:
        module = self.build_module()
        fresh = self.round_trip_state_dict(module)
        self.assertRoundTripEqual(module.state_dict(), fresh.state_dict())


instantiate_round_trip_tests(EnvCheckRoundTrip, globals())


# -- driver ---------------------------------------------------------------------------------

WATCHED = ("TORCH_FORCE_WEIGHTS_ONLY_LOAD", "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "TORCH_SERIAL_TESTING_REPORT")


class _Recorder(unittest.TestResult):
    def __init__(self) -> None:
        super().__init__()
        self.outcomes: dict[str, dict[str, str]] = {}

    def _set(self, test: unittest.TestCase, outcome: str, message: str = "") -> None:
        self.outcomes.setdefault(test.id(), {"outcome": outcome, "message": message})
        if outcome != "pass":  # a failure anywhere in the test wins over "pass"
            self.outcomes[test.id()] = {"outcome": outcome, "message": message}

    def addSuccess(self, test: unittest.TestCase) -> None:  # noqa: N802
        self._set(test, "pass")

    def addFailure(self, test, err) -> None:  # noqa: N802, ANN001
        self._set(test, "fail", str(err[1]))

    def addError(self, test, err) -> None:  # noqa: N802, ANN001
        self._set(test, "error", f"{err[0].__name__}: {err[1]}")

    def addSkip(self, test, reason) -> None:  # noqa: N802, ANN001
        self._set(test, "skip", reason)

    def addSubTest(self, test, subtest, err) -> None:  # noqa: N802, ANN001
        if err is not None:
            kind = "fail" if issubclass(err[0], test.failureException) else "error"
            self._set(test, kind, str(err[1]))


def run_ids(ids: list[str]) -> dict[str, dict[str, str]]:
    """Run test ids in exactly this order in one suite; outcome per id."""
    suite = unittest.TestSuite(unittest.defaultTestLoader.loadTestsFromName(i) for i in ids)
    result = _Recorder()
    suite.run(result)
    return result.outcomes


def main(argv: list[str]) -> int:
    spec = json.loads(argv[argv.index("--spec") + 1])
    for state in spec.get("states", [{"env": None}]):
        env = state.get("env")
        if env is not None:
            for key in WATCHED:
                os.environ.pop(key, None)
            os.environ.update(env)
        print(json.dumps(run_ids(state.get("ids") or spec["ids"])), flush=True)
    return 0


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    # Import under its module name so test ids and the pickled global are 'envcheck_roundtrip.*'.
    import envcheck_roundtrip

    sys.exit(envcheck_roundtrip.main(sys.argv))
