"""A checkpoint written under numpy 1 names ``numpy.core.*``; under numpy 2 that module forwards to
``numpy._core`` in a module-level ``__getattr__``.  The tools judge the name by what it is forwarded
to, and the snippet allowlists it in the one form torch matches: ``(object, "numpy.core....")``
(issue 38).  The bytes are the test's own: saved while numpy's two functions carry their numpy 1
``__module__`` (see test/loading/test_numpy_checkpoints.py)."""

from __future__ import annotations

import io
import unittest

import numpy as np
import torch

from test.helpers.torch_trust import torch_takes_named_entries
from test.loading.test_numpy_checkpoints import numpy1_names
from torch_serial_testing import Checkpoint
from torch_serial_testing.registry import restore_registry, snapshot_registry
from torch_serial_testing.tools.cli.inspect_text import format_inspect
from torch_serial_testing.tools.cli.inspection import inspect_report
from torch_serial_testing.tools.policy.trust import _numpy2, judge_name

SKIP = None if _numpy2() else "numpy 1 is installed: numpy.core is numpy's own module there"
NAMED = None if torch_takes_named_entries() else f"torch {torch.__version__} takes no (obj, name) allowlist entries"


@unittest.skipIf(SKIP, SKIP or "")
class TestNumpy1Names(unittest.TestCase):
    def setUp(self) -> None:
        self.addCleanup(restore_registry, snapshot_registry())  # a pasted snippet may register process-wide
        with numpy1_names():
            self.data = Checkpoint.save({"s": np.float64(2.5), "a": np.arange(3.0)}).rewound().getvalue()

    def test_judged_by_what_numpy_2_forwards_them_to(self) -> None:
        for old, kind in (("scalar", "documented"), ("_reconstruct", "callable")):
            with self.subTest(old):
                verdict = judge_name(f"numpy.core.multiarray.{old}")
                self.assertEqual((verdict.kind, verdict.moved), (kind, f"numpy._core.multiarray.{old}"))
                self.assertIn("(obj, name)", verdict.reason)
        # forwarded to nothing: absent, as for any name this numpy lacks
        self.assertEqual(judge_name("numpy.core.multiarray.no_such_thing").kind, "absent")

    @unittest.skipIf(NAMED, NAMED or "")
    def test_inspect_prints_the_form_torch_matches_and_it_loads(self) -> None:
        r = inspect_report("np1.pt", [], data=self.data)
        self.assertEqual(r["status"], "needs_opt_in", format_inspect(r))
        self.assertIn("(scalar, 'numpy.core.multiarray.scalar')", r["snippet"])
        self.assertIn("(_reconstruct, 'numpy.core.multiarray._reconstruct')", r["snippet"])
        pasted: dict = {"f": io.BytesIO(self.data)}
        exec(r["snippet"], pasted)
        self.assertEqual((pasted["obj"]["s"], pasted["obj"]["a"].tolist()), (2.5, [0.0, 1.0, 2.0]))

    @unittest.skipIf(NAMED or not hasattr(torch.serialization, "safe_globals"), NAMED or "no safe_globals context")
    def test_the_live_objects_alone_do_not_load_it(self) -> None:
        # the reason the snippet needs the (obj, name) form: torch keys the live objects as numpy._core.*
        from numpy._core.multiarray import _reconstruct, scalar

        with torch.serialization.safe_globals([_reconstruct, scalar, np.dtype, np.ndarray, type(np.dtype("float64"))]):
            with self.assertRaisesRegex(Exception, "numpy.core.multiarray"):
                torch.load(io.BytesIO(self.data), weights_only=True)


if __name__ == "__main__":
    unittest.main()
