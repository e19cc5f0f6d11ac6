"""Foreign engine/allocator switches in the same file never poison the generated engine tests.

``foreign_switch_cases.py`` mixes pytorch-style switching (helpers shaped like
pytorch's, setUp/tearDown switching, a test that leaks its engine switch, a
generated qnnpack test that installs the allocator and leaves it) with generated engine
tests.  It runs here in shuffled orders -- several orders back to back in one
unittest process, and under pytest (``-n 0`` and ``-n 2``) -- and every test id
must have the same, documented outcome in each: only the culprit fails,
each reported by name, and no innocent test is touched.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import tempfile
import textwrap
import unittest
import xml.etree.ElementTree as ET

from torch_serial_testing import dimensions

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HELPERS = os.path.join(ROOT, "test", "helpers")

DRIVER = textwrap.dedent("""
    import io, json, random, sys, unittest
    sys.path.insert(0, {root!r})
    from test.helpers import foreign_switch_cases as cases
    from torch_serial_testing import dimensions

    def flat(suite):
        for item in suite:
            if isinstance(item, unittest.TestSuite):
                yield from flat(item)
            else:
                yield item

    report = []
    for seed in {seeds!r}:
        tests = list(flat(unittest.defaultTestLoader.loadTestsFromModule(cases)))
        random.Random(seed).shuffle(tests)
        result = unittest.TextTestRunner(stream=io.StringIO(), verbosity=0).run(unittest.TestSuite(tests))
        outcome = {{t.id(): "pass" for t in tests}}
        for t, _ in result.failures:
            outcome[t.id()] = "fail" if outcome[t.id()] == "pass" else outcome[t.id()]
        for t, _ in result.errors:
            outcome[t.id()] = "error"
        for t, _ in result.skipped:
            outcome[t.id()] = "skip"
        messages = {{t.id(): tb.splitlines()[-1] for t, tb in result.failures}}
        report.append({{"seed": seed, "outcomes": outcome, "messages": messages,
                        "allocator_after": dimensions.allocator_installed()}})
    print(json.dumps(report))
""")


def _junit(path: str) -> dict[str, str]:
    out = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        tags = {child.tag for child in case}
        outcome = "fail" if tags & {"failure", "error"} else "skip" if "skipped" in tags else "pass"
        out[f"{case.get('classname', '').rsplit('.', 1)[-1]}.{case.get('name')}"] = outcome
    return out


class TestForeignSwitchesInShuffledOrders(unittest.TestCase):
    def setUp(self) -> None:
        missing = {"fbgemm", "qnnpack"} - set(dimensions.supported_qengines())
        if missing:
            self.skipTest(f"needs the fbgemm and qnnpack engines; this build lacks {sorted(missing)}")
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("TORCH_FORCE_")}

    def test_unittest_shuffled_orders_in_one_process(self) -> None:
        from test.helpers import foreign_switch_cases as cases

        seeds = [0, 1, 2, 3]
        proc = subprocess.run(
            [sys.executable, "-c", DRIVER.format(root=ROOT, seeds=seeds)],
            cwd=HELPERS,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        self.assertEqual(proc.returncode, 0, proc.stderr[-3000:])
        report = json.loads(proc.stdout.strip().splitlines()[-1])
        self.assertEqual(len(report), len(seeds))
        for run in report:
            with self.subTest(seed=run["seed"]):
                outcomes = run["outcomes"]
                self.assertEqual(len(outcomes), 20)
                self.assertEqual(outcomes, {i: cases.expected_outcome(i) for i in outcomes})
                for test_id, message in run["messages"].items():
                    self.assertRegex(
                        message,
                        r"LeakedGlobalStateError: .*qnnpack.* leaked global state \(now restored\): "
                        r"the qnnpack mobile CPU allocator is still installed",
                    )
                self.assertIs(run["allocator_after"], False)

    def test_pytest_shuffled_orders(self) -> None:
        from test.helpers import foreign_switch_cases as cases

        collect = subprocess.run(
            [
                sys.executable,
                "-m",
                "pytest",
                "-q",
                "--collect-only",
                "-p",
                "no:cacheprovider",
                "-o",
                "addopts=",
                "--rootdir",
                HELPERS,
                os.path.join(HELPERS, "foreign_switch_cases.py"),
            ],
            cwd=HELPERS,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        node_ids = [line for line in collect.stdout.splitlines() if "::" in line]
        self.assertEqual(len(node_ids), 20, collect.stdout[-3000:])
        tmp = tempfile.mkdtemp(prefix="tst-foreign-")
        self.addCleanup(__import__("shutil").rmtree, tmp, True)
        for seed, workers in ((11, "0"), (12, "2")):
            order = node_ids[:]
            random.Random(seed).shuffle(order)
            xml = os.path.join(tmp, f"{seed}.xml")
            proc = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "pytest",
                    "-q",
                    "-p",
                    "no:cacheprovider",
                    "-o",
                    "addopts=",
                    "-p",
                    "no:randomly",
                    "--rootdir",
                    HELPERS,
                    "-n",
                    workers,
                    f"--junitxml={xml}",
                    *order,
                ],
                cwd=HELPERS,
                env=self.env,
                capture_output=True,
                text=True,
                timeout=300,
            )
            with self.subTest(seed=seed, workers=workers):
                self.assertEqual(proc.returncode, 1, proc.stdout[-3000:])  # exactly the culprits fail
                got = _junit(xml)
                # pytest reports unittest errors and failures alike as failed.
                want = {k: {"error": "fail"}.get(cases.expected_outcome(k), cases.expected_outcome(k)) for k in got}
                self.assertEqual(len(got), 20)
                self.assertEqual(got, want)


if __name__ == "__main__":
    unittest.main()
