"""The TORCH_FORCE_* environment matrix: every round trip green and accurate, or the one conflict message.

Expected outcomes are derived here from torch's own rules (``torch.load``:
the two switches, set or not as ``torch.load`` itself reads them (probed);
both set is an error; ``TORCH_FORCE_WEIGHTS_ONLY_LOAD`` beats an explicit
argument; ``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD`` only replaces the default), never
from observed output.  ``predict``/``WeightsOnlySwitches`` are unit-tested in
process for every rule and spelling; a few subprocesses run
``envcheck_roundtrip.py`` for real, batching the odd spellings into one process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import unittest
from typing import Mapping, Optional

from torch_serial_testing import Checkpoint, ConflictingEnvironmentError, LoadMode, predict
from torch_serial_testing.declarations import normalize_safe_globals
from torch_serial_testing.registry import torch_allowlist
from torch_serial_testing.modes import torch_default_weights_only
from torch_serial_testing.tools.facts import CANDIDATE_SPELLINGS, WeightsOnlySwitches, truthy_spellings

from test.helpers.roundtrip_fixtures import MODE_SKIPS, READS_FORCE_NO_WEIGHTS_ONLY, torch_sets
from test.helpers import subprocess_env

HELPERS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "helpers")
WO = "TORCH_FORCE_WEIGHTS_ONLY_LOAD"
NO = "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD"
REPORT = "TORCH_SERIAL_TESTING_REPORT"
MODULE = "envcheck_roundtrip"
CLASS = f"{MODULE}.EnvCheckRoundTripCPU"
TESTS = ("full_module", "state_dict")
MODES = ("weights_only_false", "safe_globals", "default")
ODD_TRUE = ("TRUE", "Yes", "y")
ODD_FALSE = ("0", "", "false")


#: The spellings torch.load counts as set, among those people write for "on" -- asked of
#: torch.load itself (roundtrip_fixtures.torch_sets), never read from its source.
TORCH_TRUE = tuple(s for s in CANDIDATE_SPELLINGS if torch_sets(WO, s))
#: Whether torch.load reads TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD at all (torch >= 2.6; before, it is
#: ignored: no forced full load, no warning, no conflict with TORCH_FORCE_WEIGHTS_ONLY_LOAD).
TORCH_READS_NO = READS_FORCE_NO_WEIGHTS_ONLY  # observed by roundtrip_fixtures with real torch.load calls
#: What a bare torch.load does here without any switch (True since torch 2.6).
TORCH_DEFAULT = torch_default_weights_only()[0]
#: What EnvCheckNet's full-module checkpoint needs beyond torch's allowlist: the class, and
#: builtins.set (nn.Module._non_persistent_buffers_set) where torch's allowlist lacks it (< 2.6).
FULL_MODULE_GLOBALS = tuple(sorted({f"{MODULE}.EnvCheckNet"} | ({"builtins.set"} - torch_allowlist())))


def torch_rule(env: Mapping[str, str], mode: str) -> Optional[tuple[bool, bool]]:
    """(effective weights_only, torch warns) for a load in *mode*; None when torch refuses every load."""
    force_wo = torch_sets(WO, env.get(WO, "0"))
    force_no = TORCH_READS_NO and torch_sets(NO, env.get(NO, "0"))
    if force_wo and force_no:
        return None
    explicit = {"weights_only_false": False, "safe_globals": True, "default": None}[mode]
    if force_wo:
        return True, False
    if explicit is not None:
        return explicit, False
    if force_no:
        return False, True
    return TORCH_DEFAULT, False


def expected_loaded(test: str, mode: str, weights_only: bool) -> bool:
    """The full module needs FULL_MODULE_GLOBALS, declared only in the safe_globals mode."""
    return not weights_only or test == "state_dict" or mode == "safe_globals"


# -- in process: predict and the switches -----------------------------------------------------

SPELLINGS = (
    "1",
    "y",
    "Y",
    "yes",
    "Yes",
    "YES",
    "true",
    "TRUE",
    "True",
    "0",
    "",
    "false",
    "False",
    "no",
    "n",
    "2",
    "on",
    " 1",
    "1 ",
    "yes!",
)


class TestWeightsOnlySwitches(unittest.TestCase):
    def test_truthy_spellings_match_torch(self) -> None:
        self.assertEqual(truthy_spellings(WO)[0], TORCH_TRUE)
        self.assertTrue({"1", "true"} <= set(TORCH_TRUE))  # every torch reads the plain spellings
        self.assertEqual(truthy_spellings(NO)[0], tuple(s for s in CANDIDATE_SPELLINGS if torch_sets(NO, s)))
        for value in SPELLINGS:
            with self.subTest(value=value):
                # torch.load itself says how it reads each spelling (2.6-2.12 compare as written)
                switches = WeightsOnlySwitches.from_environ({WO: value})
                self.assertEqual(switches.force_weights_only, torch_sets(WO, value))
                self.assertFalse(switches.force_no_weights_only)
                switches = WeightsOnlySwitches.from_environ({NO: value})
                # torch < 2.6 ignores TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD whatever its spelling
                self.assertEqual(switches.force_no_weights_only, torch_sets(NO, value) and TORCH_READS_NO)
                self.assertFalse(switches.force_weights_only)
                self.assertEqual(switches.raw, {WO: None, NO: value})

    def test_unset_is_false(self) -> None:
        switches = WeightsOnlySwitches.from_environ({})
        self.assertFalse(switches.force_weights_only or switches.force_no_weights_only or switches.conflict)

    def test_conflict_message_names_both_values(self) -> None:
        switches = WeightsOnlySwitches.from_environ({WO: "yes", NO: "true"})
        self.assertEqual(switches.conflict, TORCH_READS_NO)  # torch < 2.6 has no conflict to report
        self.assertEqual(
            switches.conflict_message(),
            f"{WO}=yes and {NO}=true are both set: torch.load raises RuntimeError on every load. Unset one of them.",
        )

    def test_reads_os_environ_when_no_mapping_given(self) -> None:
        from unittest import mock

        with mock.patch.dict(os.environ, {WO: "y"}):
            os.environ.pop(NO, None)
            self.assertTrue(WeightsOnlySwitches.from_environ().force_weights_only)


class TestPredictRules(unittest.TestCase):
    @classmethod
    def setUpClass(cls) -> None:
        sys.path.insert(0, HELPERS)
        import envcheck_roundtrip

        cls.net = envcheck_roundtrip.EnvCheckNet
        cls.checkpoints = {
            "full_module": Checkpoint.save(cls.net()),
            "state_dict": Checkpoint.save(cls.net().state_dict()),
        }
        # The test class's own (portable) declaration: EnvCheckNet and builtins.set.
        cls.declared = normalize_safe_globals(envcheck_roundtrip.EnvCheckRoundTripCPU.safe_globals)

    def environments(self) -> list[dict[str, str]]:
        envs: list[dict[str, str]] = [{}]
        for value in SPELLINGS:
            envs += [{WO: value}, {NO: value}]
        for a in ("1", "TRUE", "0", ""):
            for b in ("y", "Yes", "false", ""):
                envs.append({WO: a, NO: b})
        return envs

    def test_every_rule_and_spelling(self) -> None:
        for env in self.environments():
            for mode in MODES:
                for test, checkpoint in self.checkpoints.items():
                    with self.subTest(env=env, mode=mode, test=test):
                        rule = torch_rule(env, mode)
                        if rule is None:
                            with self.assertRaises(ConflictingEnvironmentError) as cm:
                                predict(mode, checkpoint, self.declared, environ=env)
                            self.assertEqual(
                                str(cm.exception), WeightsOnlySwitches.from_environ(env).conflict_message()
                            )
                            continue
                        weights_only, warns = rule
                        exp = predict(mode, checkpoint, self.declared, environ=env)
                        self.assertIs(exp.mode, LoadMode.parse(mode))
                        self.assertEqual(exp.weights_only, weights_only)
                        self.assertEqual(exp.warns, warns)
                        self.assertEqual(exp.loads, expected_loaded(test, mode, weights_only))
                        missing = () if exp.loads else FULL_MODULE_GLOBALS
                        self.assertEqual(exp.missing, missing)

    def test_reasons_name_the_switch(self) -> None:
        exp = predict("weights_only_false", self.checkpoints["state_dict"], environ={WO: "yes"})
        self.assertEqual(exp.reason, f"weights_only=True forced by {WO}=yes over explicit weights_only=False")
        exp = predict("default", self.checkpoints["state_dict"], environ={NO: "y"})
        if TORCH_READS_NO:
            self.assertEqual(exp.reason, f"weights_only=False forced by {NO}=y")
            self.assertIn("torch warned", exp.summary())
        else:  # torch ignores the switch: the bare load keeps torch's default, silently
            self.assertEqual(exp.reason, "weights_only={} {}".format(*torch_default_weights_only()))
            self.assertNotIn("torch warned", exp.summary())
        exp = predict("safe_globals", self.checkpoints["state_dict"], environ={NO: "1"})
        self.assertEqual(exp.reason, "weights_only=True explicit")

    def test_safe_globals_only_count_in_their_mode(self) -> None:
        for mode in ("weights_only_false", "default"):
            exp = predict(mode, self.checkpoints["full_module"], self.declared, environ={WO: "1"})
            self.assertEqual(exp.missing, FULL_MODULE_GLOBALS)


# -- subprocesses: the real thing ----------------------------------------------------------------


def _ids() -> list[str]:
    return [f"{CLASS}.test_{t}_{m}_cpu" for t in TESTS for m in MODES]


def _mode_of(test_id: str) -> str:
    """The load mode of one of :func:`_ids`."""
    (mode,) = [m for m in MODES if test_id.endswith(f"_{m}_cpu")]
    return mode


class TestEnvironmentMatrix(unittest.TestCase):
    """Runs envcheck_roundtrip.py under each environment; checks every test id and report line."""

    @classmethod
    def setUpClass(cls) -> None:
        cls.tmp = tempfile.mkdtemp(prefix="tst-envmatrix-")
        # Two processes keep this cheap (torch's import dominates).  One starts with both
        # switches set, as a CI job would; the other starts with TORCH_FORCE_WEIGHTS_ONLY_LOAD=1
        # and then runs every other state, set between suite runs (torch reads them on
        # every load; the driver clears all switches before applying each state).
        headline = [{}, {NO: "1"}, {WO: "1", NO: "1"}]
        odd = [{var: value} for var in (WO, NO) for value in ODD_TRUE + ODD_FALSE]
        odd += [{WO: "TRUE", NO: "y"}, {WO: "0", NO: "Yes"}, {WO: "true", NO: "false"}]
        procs = []
        both_at_start = {WO: "1", NO: "1"}
        report = os.path.join(cls.tmp, "start-both.jsonl")
        procs.append((_spawn({"ids": _ids()}, {**both_at_start, REPORT: report}), [(both_at_start, report)]))
        wo_at_start = {WO: "1"}
        start_report = os.path.join(cls.tmp, "start-wo.jsonl")
        batch = [(env, os.path.join(cls.tmp, f"state{i}.jsonl")) for i, env in enumerate(headline + odd)]
        spec = {"ids": _ids(), "states": [{"env": None}] + [{"env": {**e, REPORT: r}} for e, r in batch]}
        procs.append((_spawn(spec, {**wo_at_start, REPORT: start_report}), [(wo_at_start, start_report)] + batch))
        cls.results: list[tuple[dict[str, str], str, dict[str, dict[str, str]]]] = []
        cls.failures: list[str] = []
        for proc, states in procs:
            out, err = proc.communicate(timeout=300)
            if proc.returncode != 0:
                cls.failures.append(f"driver exited {proc.returncode}:\n{err[-3000:]}")
                continue
            lines = [line for line in out.splitlines() if line.startswith("{")]
            if len(lines) != len(states):
                cls.failures.append(f"expected {len(states)} result lines, got {len(lines)}:\n{out}\n{err[-3000:]}")
                continue
            for (env, report), line in zip(states, lines):
                cls.results.append((env, report, json.loads(line)))

    @classmethod
    def tearDownClass(cls) -> None:
        import shutil

        shutil.rmtree(cls.tmp, ignore_errors=True)

    def test_drivers_ran(self) -> None:
        self.assertEqual(self.failures, [])
        self.assertEqual(len(self.results), 2 + 3 + 15)

    def test_every_run_is_green_and_accurate(self) -> None:
        self.assertEqual(self.failures, [])
        for env, report, outcomes in self.results:
            with self.subTest(env=env):
                self.assertEqual(sorted(outcomes), sorted(_ids()))
                lines = []
                if os.path.exists(report):
                    with open(report) as fh:
                        lines = [json.loads(line) for line in fh]
                # A mode this torch cannot run (safe_globals before torch 2.5) skips with the
                # library's reason whatever the environment, and reports no round trip.
                for test_id, outcome in outcomes.items():
                    mode = _mode_of(test_id)
                    if mode in MODE_SKIPS:
                        self.assertEqual(outcome, {"outcome": "skip", "message": MODE_SKIPS[mode]}, test_id)
                running = [i for i in _ids() if _mode_of(i) not in MODE_SKIPS]
                self.assertTrue(running)
                conflict = any(torch_rule(env, m) is None for m in MODES)
                if conflict:
                    message = WeightsOnlySwitches.from_environ(env).conflict_message()
                    for test_id in running:
                        self.assertEqual(outcomes[test_id], {"outcome": "fail", "message": message}, test_id)
                    self.assertEqual(lines, [])
                    continue
                for test_id in running:
                    outcome = outcomes[test_id]
                    self.assertEqual(outcome["outcome"], "pass", f"{test_id}: {outcome['message']}")
                by_test = {line["test"]: line for line in lines}
                self.assertEqual(len(lines), len(running), "one report line per round trip")
                self.assertEqual(set(by_test), set(running))
                for test in TESTS:
                    for mode in MODES:
                        if mode in MODE_SKIPS:
                            continue
                        test_id = f"{CLASS}.test_{test}_{mode}_cpu"
                        weights_only, warns = torch_rule(env, mode)  # type: ignore[misc]
                        loaded = expected_loaded(test, mode, weights_only)
                        line = by_test[test_id]
                        self.assertEqual(line["mode"], mode, test_id)
                        self.assertEqual(line["weights_only"], weights_only, test_id)
                        self.assertEqual(line["loaded"], loaded, test_id)
                        verb = "loaded" if loaded else "rejected"
                        self.assertTrue(line["summary"].startswith(f"{mode}: {verb} as expected ("), line["summary"])
                        self.assertEqual("torch warned" in line["summary"], warns, line["summary"])
                        if not loaded:
                            self.assertIn(f"{', '.join(FULL_MODULE_GLOBALS)} not allowlisted", line["summary"])

    def test_matrix_covers_every_outcome(self) -> None:
        """The matrix is not vacuous: rejections, forced full loads and conflicts all occur."""
        summaries = set()
        warned = []
        for env, report, _ in self.results:
            if os.path.exists(report):
                with open(report) as fh:
                    full = [json.loads(line)["summary"] for line in fh]
                summaries |= {s.split(" (")[0] for s in full}
                warned += [s for s in full if "torch warned" in s]
        for mode in MODES:
            if mode in MODE_SKIPS:  # skipped here (safe_globals before torch 2.5): never reported
                self.assertFalse([s for s in summaries if s.startswith(f"{mode}: ")], summaries)
            else:
                self.assertIn(f"{mode}: loaded as expected", summaries)
        for mode in ("weights_only_false", "default"):
            self.assertIn(f"{mode}: rejected as expected", summaries)
        conflicts = [env for env, _, _ in self.results if torch_rule(env, "default") is None]
        # Two states set both switches to "1" (one of them at process start), one to the odd
        # spellings TRUE and y: a conflict where torch.load itself counts TRUE as set (2.13
        # lower-cases; 2.6-2.12 compare as written, so there TRUE is unset and only y forces a
        # full load).  Only a torch that reads TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD (>= 2.6) refuses
        # any of them.  Before, the forced full load with a warning cannot occur either.
        canonical = [env for env, _, _ in self.results if env.get(WO) == "1" and env.get(NO) == "1"]
        odd = [env for env, _, _ in self.results if env.get(WO) == "TRUE" and env.get(NO) == "y"]
        self.assertEqual((len(canonical), len(odd)), (2, 1))
        odd_conflicts = torch_sets(WO, "TRUE") and torch_sets(NO, "y")
        self.assertEqual(len(conflicts), 2 + odd_conflicts if TORCH_READS_NO else 0)
        self.assertEqual(odd[0] in conflicts, TORCH_READS_NO and odd_conflicts)
        self.assertEqual(bool(warned), TORCH_READS_NO, warned)


def _spawn(spec: dict, env: dict[str, str]) -> subprocess.Popen:
    child_env = subprocess_env.child_env(drop=(WO, NO, REPORT))
    child_env.update(env)
    return subprocess.Popen(
        [sys.executable, os.path.join(HELPERS, "envcheck_roundtrip.py"), "--spec", json.dumps(spec)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=child_env,
        cwd=HELPERS,
    )


if __name__ == "__main__":
    unittest.main()
