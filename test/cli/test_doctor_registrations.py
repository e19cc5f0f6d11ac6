"""``doctor`` says which registered safe globals are torch's own and which were added (issue 41.10).

torch registers some safe globals itself when its modules are imported (``NestedTensor``,
``_rebuild_njt``, ...); a backend, a ``sitecustomize`` or the user's code adds others.  ``doctor``
labels each, asking a fresh interpreter what torch registers by itself; an entry registering
another object under one of torch's names is reported as a problem, never labelled torch's own.
"""

from __future__ import annotations

import unittest

import torch

from test.helpers.isolation_fixtures import only_torchs_registrations
from torch_serial_testing.registry import preserved_registry
from torch_serial_testing.tools.cli.doctor import doctor_report, format_doctor

NJT = "torch.nested._internal.nested_tensor.NestedTensor"


class Mine:
    """A class of the user's, registered by the test."""


MINE = f"{__name__}.Mine"


def own_line(text: str) -> str:
    return next(line for line in text.splitlines() if line.startswith("  torch's own: "))


class DoctorRegistrations(unittest.TestCase):
    def setUp(self):
        only_torchs_registrations(self)
        if NJT not in {
            getattr(g, "__module__", "") + "." + getattr(g, "__qualname__", "")
            for g in torch.serialization.get_safe_globals()
        }:
            self.skipTest(f"this torch does not register {NJT} itself")

    def test_the_users_registrations_are_not_torchs_own(self):
        with preserved_registry():
            torch.serialization.add_safe_globals([Mine])
            r = doctor_report({})
        self.assertIn(MINE, r["safe_globals"])
        self.assertIn(NJT, r["safe_globals_torch_own"])
        self.assertNotIn(MINE, r["safe_globals_torch_own"])
        text = format_doctor(r)
        self.assertNotIn(MINE, own_line(text).replace(" ", ""))
        self.assertRegex(text.replace("\n    ", " "), rf"not torch's \(added in this process[^)]*\): {MINE}")

    def test_another_object_under_torchs_name_is_a_problem(self):
        with preserved_registry():
            torch.serialization.add_safe_globals([(torch.nn.Linear, NJT)])
            r = doctor_report({})
        self.assertIn(NJT, r["safe_globals_torch_own"])  # torch's own entry is still there
        twice = [p for p in r["problems"] if "registered by torch and again by another entry" in p]
        self.assertEqual(len(twice), 1, r["problems"])
        self.assertIn(NJT, twice[0])
        self.assertEqual(r["status"], "attention")

    def test_benign_twin_only_torchs_own(self):
        with preserved_registry():
            r = doctor_report({})
        self.assertEqual(r["safe_globals_torch_own"], r["safe_globals"])
        self.assertIn(
            "  not torch's (added in this process: a backend, sitecustomize, your code): none", format_doctor(r)
        )
        self.assertFalse([p for p in r["problems"] if "registered by torch and again" in p])


if __name__ == "__main__":
    unittest.main()
