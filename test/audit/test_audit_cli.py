"""``python -m torch_serial_testing audit -- COMMAND``: the seed's three loads, a passing one, the switches."""

from __future__ import annotations

import os
import sys
import unittest

import torch

import torch_serial_testing as tst
from torch_serial_testing.tools.audit.summary import VERDICTS, verdict
from torch_serial_testing.tools.facts import torch_reads_force_no_weights_only

from .runs import BEFORE_THE_DEFAULT, TEST_ROOT, audit, fixture_line, run, unittest_cmd

SEED = "seed_qlinear_packed_params"
SEED_TESTS = (
    "test_qlinear_packed_params_fbgemm",
    "test_qlinear_packed_params_fbgemm_qnnpack_cross_compatibility",
    "test_qlinear_packed_params_qnnpack",
)
ALL_RECORD_KEYS = [
    "event",
    "test",
    "site",
    "weights_only_arg",
    "effective_weights_only",
    "switches",
    "loaded",
    "error",
    "needs",
    "provenance",
    "fix",
]


def seed_globals() -> list[str]:
    """What the library's scan says the seed's checkpoint needs (asked of the library, not written down)."""
    from torch.ao.nn.sparse.quantized.dynamic.linear import Linear

    engine = next(e for e in ("fbgemm", "qnnpack") if e in tst.supported_qengines())
    with tst.override_qengine(engine):
        lin = Linear(16, 8, 1, 4, dtype=torch.qint8)
        weight = torch.quantize_per_tensor(torch.randn(8, 16), scale=0.05, zero_point=0, dtype=torch.qint8)
        lin.set_weight_bias(weight, torch.randn(8), 1, 4)
        return tst.required_globals(obj=lin)


@unittest.skipIf(BEFORE_THE_DEFAULT, BEFORE_THE_DEFAULT)
class TestSeedUnderAudit(unittest.TestCase):
    @classmethod
    def setUpClass(cls) -> None:
        cls.plain = run(unittest_cmd(SEED))
        cls.audited = audit(unittest_cmd(SEED))

    def test_exit_status_and_output_are_the_runs_own(self) -> None:
        self.assertNotEqual(self.plain.returncode, 0, self.plain.stderr[-2000:])
        self.assertEqual(self.audited.code, self.plain.returncode)
        tail = self.plain.stderr.strip().splitlines()[-1]
        self.assertEqual(tail, "FAILED (errors=3)")
        self.assertIn(tail, self.audited.stderr)

    def test_each_load_with_test_site_globals_and_a_verified_fix(self) -> None:
        loads = self.audited.loads()
        self.assertEqual(sorted(r["test"].rsplit(".", 1)[-1] for r in loads), sorted(SEED_TESTS))
        site = f"{SEED}.py:{fixture_line(SEED + '.py', 'torch.load(')}"
        needs = seed_globals()
        self.assertIn("torch.ao.nn.sparse.quantized.dynamic.linear.Linear", needs)
        self.assertEqual(len(needs), 3, needs)
        for r in loads:
            with self.subTest(test=r["test"]):
                self.assertEqual(list(r), ALL_RECORD_KEYS)
                self.assertTrue(r["test"].startswith(f"{SEED}.TestQlinearPackedParams."), r["test"])
                self.assertEqual(r["site"], site)
                self.assertIsNone(r["weights_only_arg"])
                self.assertIs(r["effective_weights_only"], True)
                self.assertIs(r["loaded"], False)
                self.assertTrue(r["error"].startswith("UnpicklingError: "), r["error"])
                self.assertEqual(r["needs"], needs)
                self.assertEqual(r["provenance"]["kind"], "saved_in_process")
                self.assertEqual(r["provenance"]["test"], r["test"])
                self.assertEqual(r["fix"]["kind"], "safe_globals")
                self.assertIs(r["fix"]["verified"], True)
                self.assertIn("torch.serialization.safe_globals([", r["fix"]["snippet"])
                self.assertEqual(verdict(r), "default")
        self.assertEqual(set(self.audited.outcomes().values()), {"error"})

    def test_summary_and_markdown_name_every_test(self) -> None:
        for name in SEED_TESTS:
            self.assertIn(f"{name} [error]: {VERDICTS['default']}", self.audited.stderr)
            self.assertIn(name, self.audited.markdown or "")
        self.assertIn("fix (safe_globals, verified):", self.audited.stderr)
        rows = [line for line in (self.audited.markdown or "").splitlines() if line.startswith("| `")]
        self.assertEqual(len(rows), 3)


@unittest.skipIf(BEFORE_THE_DEFAULT, BEFORE_THE_DEFAULT)
class TestOtherFixtures(unittest.TestCase):
    @classmethod
    def setUpClass(cls) -> None:
        cls.audited = audit(unittest_cmd("optim_state_dict", "numpy_scalars", "dataclass_config"))

    def by_test(self, suffix: str) -> dict:
        (found,) = [r for r in self.audited.loads() if r["test"].endswith(suffix)]
        return found

    def test_a_passing_state_dict_load_needs_nothing(self) -> None:
        for name in ("test_sgd_steplr_state_dict", "test_adam_state_dict_weights_only"):
            r = self.by_test(name)
            self.assertIs(r["loaded"], True)
            self.assertEqual(r["needs"], [])
            self.assertEqual(r["fix"], {"kind": "none", "snippet": None, "verified": True})
            self.assertEqual(verdict(r), "ok")
        self.assertIs(self.by_test("test_adam_state_dict_weights_only")["weights_only_arg"], True)
        self.assertEqual(
            self.audited.outcomes()["optim_state_dict.TestOptimizerStateDict.test_sgd_steplr_state_dict"], "passed"
        )

    def test_numpy_scalars_get_a_full_load_only_for_their_own_bytes(self) -> None:
        r = self.by_test("test_metrics_with_numpy_scalars")
        self.assertIs(r["loaded"], False)
        self.assertTrue(any(n.startswith("numpy.") for n in r["needs"]), r["needs"])
        self.assertEqual(r["fix"]["kind"], "weights_only_false")
        self.assertIs(r["fix"]["verified"], True)

    def test_a_dataclass_config_gets_its_class_allowlisted(self) -> None:
        r = self.by_test("test_config_round_trip")
        self.assertEqual(r["needs"], ["dataclass_config.TrainConfig"])
        self.assertEqual(r["fix"]["kind"], "safe_globals")
        self.assertIs(r["fix"]["verified"], True)
        self.assertIn("from dataclass_config import TrainConfig", r["fix"]["snippet"])

    def test_the_exit_status_is_the_runs(self) -> None:
        self.assertEqual(self.audited.code, 1, self.audited.stderr[-2000:])


@unittest.skipUnless(torch_reads_force_no_weights_only(), "this torch does not read TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD")
class TestUnderTheSwitch(unittest.TestCase):
    def test_seed_passes_only_because_of_the_switch(self) -> None:
        env = {"TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD": "1"}
        passing = audit(unittest_cmd(SEED), env=env)
        self.assertEqual(passing.code, 0, passing.stderr[-2000:])
        self.assertEqual([verdict(r) for r in passing.loads()], ["force_no"] * 3)
        for r in passing.loads():
            self.assertEqual(r["switches"]["TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD"], "1")
            self.assertIs(r["effective_weights_only"], False)
            self.assertEqual((r["fix"]["kind"], r["fix"]["verified"]), ("safe_globals", True))
        self.assertIn(VERDICTS["force_no"], passing.stderr)
        failing = audit(unittest_cmd(SEED), "--fail-on", "force-no", env=env)
        self.assertEqual(failing.code, 1)


@unittest.skipIf(BEFORE_THE_DEFAULT, BEFORE_THE_DEFAULT)
class TestReplacedLoaderAndMixin(unittest.TestCase):
    def test_a_torch_npu_style_loader_is_observed_as_the_test_called_it(self) -> None:
        audited = audit(unittest_cmd("npu_replaced_loader"))
        (r,) = audited.loads()
        self.assertEqual(r["site"], f"npu_replaced_loader.py:{fixture_line('npu_replaced_loader.py', 'torch.load(')}")
        self.assertIsNone(r["weights_only_arg"])
        self.assertIs(r["loaded"], False)
        self.assertEqual((r["fix"]["kind"], r["fix"]["verified"]), ("safe_globals", True))
        self.assertEqual(audited.code, 1)

    def test_the_librarys_own_mixin_loads_are_explicit(self) -> None:
        tests = [
            "-k",
            "fbgemm_safe_globals",
            "-k",
            "fbgemm_weights_only_false",
            "ao.sparsity.test_qlinear_packed_params",
        ]
        audited = audit(unittest_cmd(*tests), cwd=TEST_ROOT)
        self.assertEqual(audited.code, 0, audited.stderr[-3000:])
        loads = audited.loads()
        self.assertTrue(loads)
        self.assertEqual({r["weights_only_arg"] for r in loads}, {True, False})
        self.assertTrue(all(r["loaded"] for r in loads))
        flagship = os.path.join("ao", "sparsity", "test_qlinear_packed_params.py:")
        self.assertEqual([r["site"] for r in loads if not r["site"].startswith(flagship)], [])
        self.assertTrue(all(r["provenance"]["kind"] == "saved_in_process" for r in loads))


class TestUsage(unittest.TestCase):
    def test_no_command_is_a_usage_error(self) -> None:
        proc = run([sys.executable, "-m", "torch_serial_testing", "audit"])
        self.assertEqual(proc.returncode, 3)
        self.assertIn("give the command", proc.stderr)


if __name__ == "__main__":
    unittest.main()
