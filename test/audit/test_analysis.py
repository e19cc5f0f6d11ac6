"""The fix is verified on the same bytes, never by a full load of foreign bytes; the observer is transparent."""

from __future__ import annotations

import io
import json
import unittest
from typing import Any
from unittest import mock

import torch

from torch_serial_testing.registry import torch_allowlist
from torch_serial_testing.tools.audit import analysis, observe
from torch_serial_testing.tools.audit.analysis import digest, needs_of, verified_fix
from torch_serial_testing.tools.audit.summary import verdict

from .runs import BEFORE_THE_DEFAULT, observed_here


def saved(obj: Any) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


class RecordingTrials:
    """The audit's trial loads (always torch's own loader), remembering the weights_only of each."""

    def __init__(self) -> None:
        self.calls: list[Any] = []
        self._patch = mock.patch.object(analysis, "trial", side_effect=self._trial)

    def _trial(self, data: bytes, weights_only: bool, *args: Any, **kwargs: Any) -> bool:
        self.calls.append(weights_only)
        return TRIAL(data, weights_only, *args, **kwargs)

    def __enter__(self) -> RecordingTrials:
        self._patch.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._patch.stop()


TRIAL = analysis.trial


class TestVerifiedFix(unittest.TestCase):
    def test_safe_globals_verified_by_a_weights_only_trial(self) -> None:
        data = saved(torch.nn.Linear(2, 2))
        needs = needs_of(data)
        unlisted_set = [] if "builtins.set" in torch_allowlist() else ["builtins.set"]  # (torch < 2.5 lists no set)
        self.assertEqual(needs, [*unlisted_set, "torch.nn.modules.linear.Linear"])
        with RecordingTrials() as loader:
            fix = verified_fix(data, needs)
        self.assertEqual((fix["kind"], fix["verified"]), ("safe_globals", True))
        self.assertEqual(loader.calls, [True])
        self.assertNotIn(torch.nn.Linear, torch.serialization.get_safe_globals())  # the trial's allowlist is gone

    def test_a_fix_missing_a_global_is_not_verified(self) -> None:
        data = saved(torch.nn.Sequential(torch.nn.Linear(2, 2)))
        needs = needs_of(data) or []
        self.assertGreater(len(needs), 1, needs)
        fix = verified_fix(data, needs[:1])
        self.assertEqual((fix["kind"], fix["verified"]), ("safe_globals", False))

    def test_foreign_bytes_needing_a_callable_are_never_loaded_in_full(self) -> None:
        import numpy as np

        # an array is rebuilt by numpy's _reconstruct: a function torch names as no remedy (UnsafeCallable only)
        data = saved({"x": np.arange(3.0)})
        needs = needs_of(data) or []
        self.assertTrue(any(n.endswith("multiarray._reconstruct") for n in needs), needs)
        with RecordingTrials() as loader:
            foreign = verified_fix(data, needs)
            self.assertEqual((foreign["kind"], foreign["verified"]), ("none", False))
            self.assertTrue(foreign["snippet"].startswith("# no safe fix: "), foreign["snippet"])
            self.assertEqual(loader.calls, [])
            own = verified_fix(data, needs, own_digest=digest(data))
            self.assertEqual((own["kind"], own["verified"]), ("weights_only_false", True))
            self.assertEqual(loader.calls, [False])

    def test_numpy_scalars_get_the_remedy_torch_documents_verified(self) -> None:
        import numpy as np

        # numpy's scalar reconstructor, numpy.dtype and the dtype classes: the remedy torch's error names
        data = saved({"x": np.float64(1.0)})
        needs = needs_of(data) or []
        self.assertTrue(any(n.endswith("multiarray.scalar") for n in needs), needs)
        with RecordingTrials() as loader:
            fix = verified_fix(data, needs)
        self.assertEqual((fix["kind"], fix["verified"]), ("safe_globals", True))
        # (torch < 2.5: no safe_globals context, and _codecs.encode is not on torch's allowlist)
        form = "safe_globals" if hasattr(torch.serialization, "safe_globals") else "add_safe_globals"
        listed = ("encode, " if "_codecs.encode" in needs else "") + "scalar, dtype, Float64DType"
        self.assertIn(f"torch.serialization.{form}([{listed}])", fix["snippet"])
        self.assertEqual(loader.calls, [True])  # a weights-only trial, never a full load of foreign bytes

    def test_unreadable_bytes_get_no_fix(self) -> None:
        self.assertIsNone(needs_of(b"not a checkpoint"))
        self.assertEqual(verified_fix(b"x", None, digest(b"x")), {"kind": "none", "snippet": None, "verified": False})


class TestObserverInProcess(unittest.TestCase):
    def setUp(self) -> None:
        self.report = observed_here(self)
        observe._State.report = self.report
        observe.install_torch(torch)

    def records(self) -> list[dict[str, Any]]:
        with open(self.report, encoding="utf-8") as f:
            return [json.loads(line) for line in f]

    @unittest.skipIf(BEFORE_THE_DEFAULT, BEFORE_THE_DEFAULT)
    def test_results_and_errors_are_the_callers(self) -> None:
        data = saved({"w": torch.ones(2)})
        self.assertTrue(torch.equal(torch.load(io.BytesIO(data))["w"], torch.ones(2)))
        with self.assertRaises(Exception) as plain:
            torch.serialization.load(io.BytesIO(saved(torch.nn.Linear(1, 1))))  # not observed
        with self.assertRaises(type(plain.exception)) as audited:
            torch.load(io.BytesIO(saved(torch.nn.Linear(1, 1))))
        self.assertEqual(str(audited.exception), str(plain.exception))
        loads = [r for r in self.records() if r["event"] == "load"]
        self.assertEqual([r["loaded"] for r in loads], [True, False])
        self.assertEqual(
            [verdict(r) for r in loads], ["ok", "default" if loads[1]["effective_weights_only"] else "error"]
        )
        self.assertTrue(loads[0]["site"].endswith(f"test_analysis.py:{_line('torch.load(io.BytesIO(data))')}"))

    def test_the_librarys_saves_by_torchs_own_function_are_observed(self) -> None:
        from torch_serial_testing.checkpoint import Checkpoint
        from torch_serial_testing.tools.audit.analysis import digest

        checkpoint = Checkpoint.save({"w": torch.ones(2)})  # torch's genuine save: the torch.save wrapper never sees it
        data = checkpoint.rewound().read()
        saves = [r for r in self.records() if r["event"] == "save"]
        self.assertEqual([r["digest"] for r in saves], [digest(data)])
        self.assertIn(digest(data), observe._State.saved)
        torch.load(checkpoint.rewound())
        (load,) = [r for r in self.records() if r["event"] == "load"]
        self.assertEqual(load["provenance"]["kind"], "saved_in_process")

    def test_a_loader_installed_later_is_observed_and_assignment_round_trips(self) -> None:
        seen = []

        def replacement(f: Any, *args: Any, **kwargs: Any) -> Any:
            seen.append(kwargs.get("weights_only"))
            return torch.serialization.load(f, *args, **kwargs)

        before = torch.load
        self.assertIs(torch.load, before)  # one wrapper per stored function
        torch.load = replacement
        self.assertEqual(torch.load.__name__, "replacement")
        torch.load(io.BytesIO(saved(torch.ones(1))), weights_only=True)
        self.assertEqual(seen[0], True)
        torch.load = before  # restoring the wrapper read earlier restores the function
        self.assertIs(torch.__dict__["load"], torch.serialization.load)
        loads = [r for r in self.records() if r["event"] == "load"]
        self.assertEqual(len(loads), 1)
        self.assertIs(loads[0]["weights_only_arg"], True)

    def test_a_save_then_load_is_matched_by_digest(self) -> None:
        buf = io.BytesIO()
        torch.save(torch.nn.Linear(1, 1), buf)
        buf.seek(0)
        torch.load(buf, weights_only=False)
        save, load = self.records()
        self.assertEqual(save["event"], "save")
        self.assertEqual(load["provenance"]["kind"], "saved_in_process")
        self.assertEqual(load["provenance"]["site"], save["site"])
        self.assertEqual(verdict(load), "full_load")
        self.assertEqual((load["fix"]["kind"], load["fix"]["verified"]), ("safe_globals", True))


def _line(text: str) -> int:
    with open(__file__, encoding="utf-8") as f:
        return next(n for n, line in enumerate(f, 1) if text in line and "_line(" not in line)


if __name__ == "__main__":
    unittest.main()
