"""Tensor subclasses of torch's own, round-tripped in every load mode with only what torch itself needs.

* A jagged nested tensor (``torch.nested.nested_tensor(..., layout=torch.jagged)``): torch registers
  ``NestedTensor`` and ``_rebuild_njt`` (and ``torch._dynamo``'s ``_DimRange``) process-wide itself.
  Nothing is declared, and every mode loads it, ``safe_globals`` included: torch allows them there, and
  so does the mixin (issue 37, point 1).
* ``TwoTensor`` (``torch.testing._internal.two_tensor``), pytorch's own test subclass, declared
  ``safe_globals = (TwoTensor,)`` as upstream serialization tests allowlist it: accepted at class
  creation, used by the ``safe_globals`` mode, never judged in the modes that do not use it (point 2).
* The first jagged nested tensor of a process imports ``torch._dynamo`` and ``torch.distributed.tensor``,
  whose imports register their classes: the test that happens to do it passes like any later one, and
  nothing is said (point 3).  Checked in a fresh interpreter, where that test really is the first.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import unittest
from typing import Any
from unittest import mock

import torch

from torch_serial_testing import SerializationRoundTripTestCase, instantiate_round_trip_tests
from torch_serial_testing.errors import torch_key

from test.helpers.roundtrip_fixtures import DEFAULT_REASON, DEFAULT_WEIGHTS_ONLY, MODE_SKIPS
from test.helpers.subprocess_env import child_env

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODES = ("weights_only_false", "safe_globals", "default")
TWO_TENSOR = "torch.testing._internal.two_tensor.TwoTensor"


def jagged() -> Any:
    return torch.nested.nested_tensor([torch.arange(3.0), torch.arange(5.0) * 2], layout=torch.jagged)


def generated() -> tuple[type, type]:
    """The generated classes (jagged nested tensor, TwoTensor), each with a ``seen`` dict: test id ->
    the round-trip outcomes it reported."""

    class TestJagged(SerializationRoundTripTestCase, unittest.TestCase):
        devices = ("cpu",)  # nothing declared: torch registers what the checkpoint names

        def setUp(self) -> None:
            SerializationRoundTripTestCase.setUp(self)  # not super(): generated classes copy the generic one
            self.addCleanup(lambda: self.seen.__setitem__(self.id(), list(self.round_trip_outcomes)))

        def test_round_trip(self, device: str) -> None:
            original = jagged()
            loaded = self.round_trip(original)
            self.assertIs(type(loaded), type(original))
            self.assertIs(loaded.layout, torch.jagged)
            # element by element: a loaded jagged tensor has a ragged dimension of its own (j2, not j1)
            self.assertEqual(len(loaded.unbind()), 2)
            for x, y in zip(original.unbind(), loaded.unbind()):
                self.assertRoundTripEqual(x, y)
            self.assertRoundTripEqual(original.offsets(), loaded.offsets())

    from torch.testing._internal.two_tensor import TwoTensor

    class TestTwoTensor(SerializationRoundTripTestCase, unittest.TestCase):
        safe_globals = (TwoTensor,)
        devices = ("cpu",)

        def setUp(self) -> None:
            SerializationRoundTripTestCase.setUp(self)
            self.addCleanup(lambda: self.seen.__setitem__(self.id(), list(self.round_trip_outcomes)))

        def test_round_trip(self, device: str) -> None:
            a = torch.arange(4.0)
            loaded = self.round_trip(TwoTensor(a, a * 2))
            self.assertIs(type(loaded), TwoTensor)
            # its parts, each: comparing the wrapper compares only what its dispatch returns
            self.assertRoundTripEqual(loaded.a, a)
            self.assertRoundTripEqual(loaded.b, a * 2)

        def test_plain_tensor(self, device: str) -> None:
            # The declaration is judged only where the mode uses it: here it is over-trust.
            self.round_trip(torch.arange(3.0))

    scope: dict[str, Any] = {"__name__": __name__}
    classes = []
    for generic in (TestJagged, TestTwoTensor):
        generic.seen = {}  # type: ignore[attr-defined]
        generic.__module__ = __name__
        (cls,) = instantiate_round_trip_tests(generic, scope)
        classes.append(cls)
    return classes[0], classes[1]


def run(cls: type, prefix: str) -> tuple[unittest.TestResult, str]:
    tests = [t for t in unittest.defaultTestLoader.loadTestsFromTestCase(cls) if t._testMethodName.startswith(prefix)]
    stream = io.StringIO()
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCH_FORCE_")}
    with mock.patch.dict(os.environ, env, clear=True):
        result = unittest.TextTestRunner(stream=stream, verbosity=2).run(unittest.TestSuite(tests))
    return result, stream.getvalue()


def outcomes(cls: type, test: str) -> dict[str, list[str]]:
    """Mode -> the outcomes ``<cls>.<test>_<mode>_cpu`` reported (a mode that skips here: none)."""
    return {mode: cls.seen.get(f"{__name__}.{cls.__name__}.{test}_{mode}_cpu", []) for mode in MODES}


def loaded(mode: str, reason: str) -> list[str]:
    return [] if mode in MODE_SKIPS else [f"{mode}: loaded as expected ({reason})"]


def registered_names() -> set[str]:
    return {torch_key(g) or repr(g) for g in torch.serialization.get_safe_globals()}


def jagged_outcomes() -> dict[str, list[str]]:
    """What the jagged tensor tests report here: loaded in every mode that runs."""
    return {
        "weights_only_false": loaded("weights_only_false", "weights_only=False explicit"),
        "safe_globals": loaded("safe_globals", "weights_only=True explicit"),
        "default": loaded("default", DEFAULT_REASON),
    }


class TestJaggedNestedTensor(unittest.TestCase):
    def test_every_mode_loads_with_nothing_declared(self) -> None:
        jagged()  # imports what registers torch's classes, as the first jagged tensor of a test would
        registered = registered_names()
        needed = {
            "torch.nested._internal.nested_tensor.NestedTensor",
            "torch.nested._internal.nested_tensor._rebuild_njt",
        }
        if not needed <= registered:
            self.skipTest(f"this torch does not register {sorted(needed - registered)} itself")
        cls, _ = generated()
        result, out = run(cls, "test_round_trip")
        self.assertTrue(result.wasSuccessful(), out)
        self.assertEqual([reason for _, reason in result.skipped], list(MODE_SKIPS.values()), out)
        self.assertEqual(outcomes(cls, "test_round_trip"), jagged_outcomes())
        self.assertNotIn("kept safe globals", out)


class TestTwoTensor(unittest.TestCase):
    def test_declared_it_loads_in_every_mode_torch_allows(self) -> None:
        _, cls = generated()
        self.assertEqual([sg.name for sg in cls._tst_safe_globals], [TWO_TENSOR])
        result, out = run(cls, "test_round_trip")
        self.assertTrue(result.wasSuccessful(), out)
        self.assertEqual([reason for _, reason in result.skipped], list(MODE_SKIPS.values()), out)
        # a bare load never sees the declaration: weights-only (torch >= 2.6), it rejects TwoTensor
        default = (
            [f"default: rejected as expected ({DEFAULT_REASON}; {TWO_TENSOR} not allowlisted)"]
            if DEFAULT_WEIGHTS_ONLY
            else loaded("default", DEFAULT_REASON)
        )
        self.assertEqual(
            outcomes(cls, "test_round_trip"),
            {
                "weights_only_false": loaded("weights_only_false", "weights_only=False explicit"),
                "safe_globals": loaded("safe_globals", "weights_only=True explicit"),
                "default": default,
            },
        )

    def test_the_declaration_is_judged_only_where_it_is_used(self) -> None:
        _, cls = generated()
        result, out = run(cls, "test_plain_tensor")
        self.assertEqual(result.errors, [], out)
        failed = [t.id().rsplit(".", 1)[-1] for t, _ in result.failures]
        if "safe_globals" in MODE_SKIPS:
            self.assertEqual(failed, [], out)
            return
        self.assertEqual(failed, ["test_plain_tensor_safe_globals_cpu"], out)
        self.assertIn(
            f"AllowlistError: TestTwoTensor.safe_globals over-trusts: the checkpoint does not need {TWO_TENSOR}.\n",
            result.failures[0][1],
        )
        self.assertEqual(
            outcomes(cls, "test_plain_tensor")["weights_only_false"],
            loaded("weights_only_false", "weights_only=False explicit"),
        )
        self.assertEqual(outcomes(cls, "test_plain_tensor")["default"], loaded("default", DEFAULT_REASON))


#: In a fresh interpreter: the jagged tensor tests in every mode, the first of them creating the process's
#: first jagged tensor (imports torch._dynamo and torch.distributed.tensor, which register classes).
FRESH = """
import json, sys
from test.testing import test_torch_tensor_subclasses as here

cls, _ = here.generated()
fresh = [m for m in ("torch._dynamo", "torch.distributed.tensor") if m in sys.modules]
before = here.registered_names()
result, out = here.run(cls, "test_round_trip")
print(json.dumps({
    "imported_before": fresh,
    "ok": result.wasSuccessful(),
    "out": out,
    "ran": result.testsRun,
    "skipped": len(result.skipped),
    "outcomes": here.outcomes(cls, "test_round_trip"),
    "added": sorted(here.registered_names() - before),
    "registered": sorted(here.registered_names()),
}))
"""


class TestFirstJaggedTensorOfAProcess(unittest.TestCase):
    def test_the_test_that_imports_torchs_modules_passes(self) -> None:
        proc = subprocess.run(
            [sys.executable, "-c", FRESH],
            capture_output=True,
            text=True,
            cwd=ROOT,
            env=child_env(path_first=(ROOT,), drop=("TORCH_FORCE_",)),
            stdin=subprocess.DEVNULL,
            timeout=600,
        )
        self.assertEqual(proc.returncode, 0, proc.stderr[-3000:])
        report = json.loads(proc.stdout.strip().splitlines()[-1])
        self.assertEqual(report["imported_before"], [], "not a fresh interpreter: nothing to show")
        needed = {
            "torch.nested._internal.nested_tensor.NestedTensor",
            "torch.nested._internal.nested_tensor._rebuild_njt",
        }
        if not needed <= set(report["registered"]):  # (torch 2.15 registers them nowhere: the mixin asks for them)
            self.skipTest(f"this torch does not register {sorted(needed - set(report['registered']))} itself")
        self.assertTrue(report["ok"], report["out"])
        self.assertEqual((report["ran"], report["skipped"]), (3, len(MODE_SKIPS)))
        # every mode loaded, the first test run (default) included: it made the first jagged tensor
        self.assertEqual(report["outcomes"], jagged_outcomes())
        self.assertNotIn("kept safe globals", report["out"])  # torch's own registrations: kept silently
        self.assertIn("torch._dynamo.decorators._DimRange", report["added"])
        if torch.distributed.is_available():
            self.assertIn("torch.distributed.tensor.DTensor", report["added"])
        self.assertEqual([n for n in report["added"] if not n.startswith("torch.")], [])


if __name__ == "__main__":
    unittest.main()
