"""Device tests on a real second device: the npu test backend (``test/npu_backend``).

Registering the backend renames privateuse1 for the rest of a process, so every test that
needs it runs a child process (``python -m npu_backend.run --backend ...``) and checks that
child's outcome per generated test id; this process never registers it.  The backend is
built once (``.ci/run`` builds it before the tests; otherwise the first child does, under
torch's build lock) and skipped, saying why, only where no compiler exists.
"""

import json
import os
import re
import subprocess
import sys
import tempfile
import unittest
from pathlib import Path
from unittest import mock

import torch

import npu_backend

from test.helpers.device_filters import FILTERS_ALIAS_BACKEND, assert_filters_match_pytorch
from test.helpers.python_compat import verbose_headers
from test.helpers.roundtrip_fixtures import DEFAULT_WEIGHTS_ONLY, MODE_SKIPS
from test.test_flagship_environments import FLAGSHIP_DIR, FLAGSHIP_MODULE, NO_LOAD_TESTS, round_trip_tests
from test.test_readme import example, page

ROOT = Path(__file__).resolve().parents[2]
TEST_DIR = ROOT / "test"
SKIP = npu_backend.skip_reason()
ONLY_FOR = "PYTORCH_TESTING_DEVICE_ONLY_FOR"
EXCEPT_FOR = "PYTORCH_TESTING_DEVICE_EXCEPT_FOR"
REPORT_ENV = "TORCH_SERIAL_TESTING_REPORT"
MODES = ("weights_only_false", "safe_globals", "default")
ENGINES = ("fbgemm", "qnnpack")
NOT_REGISTERED = "no privateuse1 backend is registered (import its extension, e.g. torch_npu)"


def child(args, cwd=TEST_DIR, backend=True, **env_extra):
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("TORCH_FORCE_", "PYTORCH_TESTING_DEVICE_")) and k not in (REPORT_ENV, "EXPECTTEST_ACCEPT")
    }
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), str(TEST_DIR), os.environ.get("PYTHONPATH")) if p)
    env.update(env_extra)
    prefix = [sys.executable, "-m", "npu_backend.run", "--backend"] if backend else [sys.executable]
    return subprocess.run(
        prefix + list(args), cwd=cwd, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=900
    )  # a hang guard only


def outcomes(out):
    """test id -> the verbose runner's word for it (ok, skipped '...', FAIL, ERROR).

    Each test's segment runs from its header line to the next header, so warnings or outcome
    summaries printed in between do not hide the result.
    """
    headers = verbose_headers(out)  # either Python's format of the test ids
    found = {}
    for i, (test_id, m) in enumerate(headers):
        end = headers[i + 1][1].start() if i + 1 < len(headers) else len(out)
        words = re.findall(r"(?:\.\.\. |^)(ok|skipped '.*'|FAIL|ERROR)$", out[m.end() : end], re.M)
        found[test_id] = words[-1] if words else "?"
    return found


def ids(cls, methods, modes, parts):
    return {f"npu_backend.device_cases.{cls}.test_{m}_{mode}_{p}" for m in methods for mode in modes for p in parts}


def mode_outcome(test_id):
    """The verbose runner's word for a generated test: ok, or the skip of a load mode this torch lacks."""
    for mode, reason in MODE_SKIPS.items():
        if f"_{mode}_" in test_id:
            return f"skipped {reason!r}"
    return "ok"


def expected_device_case_ids():
    rt = ("module", "state_dict", "shared_storage_stays_shared", "map_location", "device_index_error_is_torchs_own")
    eng = [
        f"{name}_{e}"
        for name in ("engine_is_set_on_every_device", "quantized_tensors_cannot_live_on_the_device")
        for e in ENGINES
    ]
    modes = list(MODES)  # a mode this torch lacks is generated too, and skips visibly
    return (
        ids("TestNpuRoundTripCPU", rt, modes, ["cpu"])
        | ids("TestNpuRoundTripNPU", rt, modes, ["npu", "npu_to_cpu"])
        | ids("TestPrivateuse1DeclarationNPU", ["round_trip"], modes, ["npu", "npu_to_cpu"])
        | ids("TestNpuEnginesCPU", eng, ["default"], ["cpu"])
        | ids("TestNpuEnginesNPU", eng, ["default"], ["npu", "npu_to_cpu"])
        | {"npu_backend.device_cases.TestDeviceFiltersMatchPytorch.test_grid"}
    )


@unittest.skipIf(SKIP, SKIP)
class TestOnTheNpuBackend(unittest.TestCase):
    maxDiff = None

    def test_device_cases_all_run_and_pass(self):
        with tempfile.TemporaryDirectory() as tmp:
            report = Path(tmp) / "report.jsonl"
            proc = child(["-m", "unittest", "-v", "npu_backend.device_cases"], **{REPORT_ENV: str(report)})
            records = [json.loads(line) for line in report.read_text().splitlines()] if report.exists() else []
        out = proc.stdout + proc.stderr
        self.assertEqual(proc.returncode, 0, out[-5000:])
        expected = {i: mode_outcome(i) for i in expected_device_case_ids()}
        self.assertEqual(outcomes(out), expected, out[-3000:])  # nothing skipped but a mode this torch lacks
        skipped = sum(v != "ok" for v in expected.values())
        self.assertRegex(
            out, rf"\nRan {len(expected)} tests in .*\n\nOK" + (f" \\(skipped={skipped}\\)" if skipped else "") + "\n"
        )
        # the full-module default round trip on npu: rejected as expected, naming the module's globals
        npu_default = [r for r in records if r["test"].endswith("TestNpuRoundTripNPU.test_module_default_npu")]
        self.assertEqual(len(npu_default), 1)
        # (a bare load is a full one before torch 2.6: there it loads)
        self.assertEqual(npu_default[0]["loaded"], not DEFAULT_WEIGHTS_ONLY, npu_default[0]["summary"])
        if DEFAULT_WEIGHTS_ONLY:
            self.assertIn("npu_backend.device_cases.Net, torch.nn.modules.linear.Linear", npu_default[0]["summary"])
        loaded_modes = {r["mode"] for r in records if r["loaded"] and "_npu" in r["test"]}
        self.assertEqual(loaded_modes, {m for m in MODES if m not in MODE_SKIPS})

    def test_device_filters_select_like_pytorch(self):
        all_classes = [
            "TestNpuEnginesCPU",
            "TestNpuEnginesNPU",
            "TestNpuRoundTripCPU",
            "TestNpuRoundTripNPU",
            "TestPrivateuse1DeclarationNPU",
        ]
        npu_only = [c for c in all_classes if c.endswith("NPU")]
        cpu_only = [c for c in all_classes if c.endswith("CPU")]
        # The backend's name selects it where pytorch's filter reads it as privateuse1; torch 2.4's
        # does not (it selects nothing, excludes nothing), and the library selects as pytorch does.
        by_name_only, by_name_except = (npu_only, cpu_only) if FILTERS_ALIAS_BACKEND else ([], all_classes)
        cases = [
            ({}, all_classes),
            ({ONLY_FOR: "npu"}, by_name_only),
            ({ONLY_FOR: "privateuse1"}, npu_only),
            ({EXCEPT_FOR: "npu"}, by_name_except),
            ({EXCEPT_FOR: "privateuse1"}, cpu_only),
            ({ONLY_FOR: "cpu", EXCEPT_FOR: "cuda"}, cpu_only),
            ({ONLY_FOR: "npu", EXCEPT_FOR: "cpu"}, by_name_only),
        ]
        for env, expected in cases:
            with self.subTest(env=env):
                proc = child(["-m", "npu_backend.device_cases"], **env)
                self.assertEqual(proc.returncode, 0, proc.stderr[-3000:])
                self.assertEqual(json.loads(proc.stdout.strip().splitlines()[-1]), expected)
        proc = child(["-m", "npu_backend.device_cases"], **{ONLY_FOR: "npu", EXCEPT_FOR: "npu"})
        self.assertNotEqual(proc.returncode, 0)
        self.assertIn("RoundTripConfigError: device(s) ['npu'] appear in both", proc.stderr)

    def test_flagship_npu_class_skips_visibly(self):
        proc = child(["-m", "unittest", "-v", FLAGSHIP_MODULE], cwd=FLAGSHIP_DIR)
        out = proc.stdout + proc.stderr
        self.assertEqual(proc.returncode, 0, out[-5000:])
        found = outcomes(out)
        cpu_ids = set(round_trip_tests())
        npu_ids = set()
        for test_id in cpu_ids:
            base = test_id.replace("TestQlinearPackedParamsCPU", "TestQlinearPackedParamsNPU")[: -len("_cpu")]
            npu_ids |= {base + "_npu", base + "_npu_to_cpu"}
        self.assertEqual(set(found), cpu_ids | npu_ids | set(NO_LOAD_TESTS))
        # every npu test skips, visibly and for the one reason the flagship gives (a load mode this
        # torch lacks skips first, with the library's reason, as in the CPU class)
        self.assertEqual(
            {found[i] for i in npu_ids if mode_outcome(i) != "ok"},
            {mode_outcome(i) for i in npu_ids if mode_outcome(i) != "ok"},
        )
        reasons = {found[i] for i in npu_ids if mode_outcome(i) == "ok"}
        self.assertEqual(len(reasons), 1, reasons)
        self.assertRegex(reasons.pop(), r"^skipped '.*CPU-only module.*'$")
        # and the CPU tests are untouched: they run (a mode this torch lacks aside) and pass
        self.assertEqual({found[i] for i in cpu_ids if not any(f"_{m}_" in i for m in MODE_SKIPS)}, {"ok"})
        self.assertRegex(
            out,
            rf"\nOK \(skipped={len(npu_ids) + sum(1 for i in cpu_ids if any(f'_{m}_' in i for m in MODE_SKIPS))}\)\n",
        )

    def test_readme_device_example(self):
        example = readme_device_example()
        with tempfile.TemporaryDirectory() as tmp:
            Path(tmp, "test_linear_devices.py").write_text(example, encoding="utf-8")
            on_npu = child(["-m", "unittest", "-v", "test_linear_devices"], cwd=tmp)
            without = child(["-m", "unittest", "-v", "test_linear_devices"], cwd=tmp, backend=False)
        out = on_npu.stdout + on_npu.stderr
        self.assertEqual(on_npu.returncode, 0, out[-3000:])
        found = outcomes(out)
        modes = list(MODES)  # a mode this torch lacks skips visibly
        expected = {f"test_linear_devices.TestLinearDevicesCPU.test_linear_{m}_cpu" for m in modes} | {
            f"test_linear_devices.TestLinearDevicesNPU.test_linear_{m}_{p}"
            for m in modes
            for p in ("npu", "npu_to_cpu")
        }
        self.assertEqual(found, {i: mode_outcome(i) for i in expected})
        out = without.stdout + without.stderr
        self.assertEqual(without.returncode, 0, out[-3000:])
        skipped = {i: v for i, v in outcomes(out).items() if "PRIVATEUSE1" in i}
        self.assertEqual(len(skipped), 2 * len(modes))
        self.assertEqual(set(skipped.values()), {f"skipped {NOT_REGISTERED!r}"})


def readme_device_example():
    """The devices page's example (docs/howto-devices.rst includes docs/examples/test_linear_devices.py)."""
    assert ".. literalinclude:: examples/test_linear_devices.py\n" in page("howto-devices")
    return example("test_linear_devices")


class TestDeviceFiltersMatchPytorchWithoutBackend(unittest.TestCase):
    """pytorch's filter_desired_device_types on cpu/cuda bases vs ours, for a grid of values (#13.4)."""

    def test_grid(self):
        from torch.testing._internal import common_device_type as cdt

        values = ["", "cpu", "cuda", "cpu,cuda", "xpu", "cuda, xpu", " cpu", "CPU", "cpu,", "privateuse1"]
        assert_filters_match_pytorch(self, [cdt.CPUTestBase, cdt.CUDATestBase], ("cpu", "cuda"), values)


ALIASING_CHILD = r"""
import json, os, platform, subprocess, sys, types
from unittest import mock
import torch
from torch_serial_testing import dimensions
from torch_serial_testing.dimensions import EXCEPT_FOR, ONLY_FOR, resolve_devices
from torch_serial_testing.errors import RoundTripConfigError

CDT = "torch.testing._internal.common_device_type"
torch.utils.rename_privateuse1_backend("npu")  # a registered, available backend (irreversible: a child)
module = types.ModuleType("torch.npu")
module.is_available = lambda: True
torch._register_device_module("npu", module)
VALUES = ["", "cpu", "npu", "privateuse1", "cpu,npu", "npu,privateuse1", "NPU"]
out = {}
started = []

def no_child(*args, **kwargs):
    started.append(repr(args)[:200])
    raise AssertionError("the library started a child process")

def selections():
    found = {}
    for only in VALUES:
        for excl in VALUES:
            try:
                found[f"{only}|{excl}"] = list(resolve_devices(("cpu", "privateuse1"), {ONLY_FOR: only, EXCEPT_FOR: excl}))
            except RoundTripConfigError:
                found[f"{only}|{excl}"] = None
    return found

def pytorchs(cdt):
    bases = [type("CpuBase", (), {"device_type": "cpu"}), type("Pu1Base", (), {"device_type": "privateuse1"})]
    found = {}
    for only in VALUES:
        for excl in VALUES:
            try:
                found[f"{only}|{excl}"] = [b.device_type for b in cdt.filter_desired_device_types(
                    bases, excl.split(",") if excl else [], only.split(",") if only else [])]
            except AssertionError:
                found[f"{only}|{excl}"] = None
    return found

# pytorch's common_utils (imported with common_device_type) calls platform.platform(), which runs
# `uname -p` once per process: asked here first, so that a process started below is the library's
platform.platform()
with mock.patch.object(subprocess.Popen, "_execute_child", no_child), mock.patch.object(os, "fork", no_child):
    # 0. no filter set: pytorch's filter is not needed, and its module not imported
    out["cdt_at_start"] = CDT in sys.modules
    out["unfiltered"] = list(resolve_devices(("cpu", "privateuse1"), {}))
    out["cdt_unfiltered"] = CDT in sys.modules
    # 1. its module cannot be imported: a clear error, never a guess
    with mock.patch.dict(sys.modules, {CDT: None}):
        try:
            out["failed"] = ["answered", dimensions._filters_alias_backend_name("npu")]
        except RoundTripConfigError as e:
            out["failed"] = ["raised", str(e)]
    # 2. a filter set: pytorch's own function is asked, in this process (its module imported for it), once
    out["aliases"] = dimensions._filters_alias_backend_name("npu")
    out["cdt_after"] = CDT in sys.modules
    from torch.testing._internal import common_device_type as cdt
    out["mismatches"] = [k for k, v in pytorchs(cdt).items() if selections()[k] != v]
    # 3. a stand-in behaving like torch 2.4's filter (names compared as written), which the library must
    # read as not aliasing
    dimensions._aliasing.clear()

    def as_written(device_type_test_bases, except_for=None, only_for=None):
        both = set(except_for or []) & set(only_for or [])
        if both:
            raise AssertionError(f"device ({both}) appeared in both except_for and only_for")
        bases = list(device_type_test_bases)
        if except_for:
            bases = [b for b in bases if b.device_type not in except_for]
        if only_for:
            bases = [b for b in bases if b.device_type in only_for]
        return bases

    with mock.patch.object(cdt, "filter_desired_device_types", as_written):
        out["as_written"] = dimensions._filters_alias_backend_name("npu")
        out["as_written_selections"] = selections()
        out["as_written_mismatches"] = [k for k, v in pytorchs(cdt).items() if selections()[k] != v]
    dimensions._aliasing.clear()
out["started"] = started
print("RESULT", json.dumps(out))
"""


class TestTheLibraryAsksPytorchsFilter(unittest.TestCase):
    """dimensions._filters_alias_backend_name: pytorch's real filter_desired_device_types is asked, in this
    process (its module imported for it, only when a filter is set); no child interpreter."""

    def test_in_process_and_a_filter_like_torch_2_4(self):
        env = {k: v for k, v in os.environ.items() if not k.startswith(("TORCH_FORCE_", "PYTORCH_TESTING_DEVICE_"))}
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), str(TEST_DIR), os.environ.get("PYTHONPATH")) if p)
        proc = subprocess.run(
            [sys.executable, "-c", ALIASING_CHILD],
            cwd=TEST_DIR,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
            stdin=subprocess.DEVNULL,
        )
        self.assertEqual(proc.returncode, 0, proc.stderr[-3000:])
        (line,) = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
        r = json.loads(line[len("RESULT ") :])
        self.assertEqual(r["started"], [])
        # 0. no filter: both devices, pytorch's test module left alone
        self.assertFalse(r["cdt_at_start"])
        self.assertEqual(r["unfiltered"], ["cpu", "privateuse1"])
        self.assertFalse(r["cdt_unfiltered"], "the library imported torch.testing._internal.common_device_type")
        # 1. it cannot be imported: refused with the reason and the way out
        self.assertEqual(
            r["failed"],
            [
                "raised",
                "cannot tell how pytorch's filter_desired_device_types reads "
                "PYTORCH_TESTING_DEVICE_ONLY_FOR/PYTORCH_TESTING_DEVICE_EXCEPT_FOR for the npu backend: "
                "torch.testing._internal.common_device_type cannot be imported (ModuleNotFoundError: import of "
                "torch.testing._internal.common_device_type halted; None in sys.modules); unset the filters",
            ],
        )
        # 2. asked here, as pytorch's filter reads the name, and the selections are pytorch's
        self.assertEqual(r["aliases"], FILTERS_ALIAS_BACKEND)
        self.assertTrue(r["cdt_after"])
        self.assertEqual(r["mismatches"], [])
        # 3. the answer follows the filter's behaviour
        self.assertIs(r["as_written"], False)
        self.assertEqual(r["as_written_mismatches"], [])
        sel = r["as_written_selections"]
        self.assertEqual((sel["npu|"], sel["|npu"], sel["privateuse1|"]), ([], ["cpu", "privateuse1"], ["privateuse1"]))


class TestPrivateuse1IsJudgedByTheRegisteredBackend(unittest.TestCase):
    """device_skip_reason("privateuse1") asks the registered backend (the class used to always skip)."""

    def test_reason_follows_the_backend(self):
        from torch_serial_testing import dimensions

        self.assertEqual(
            dimensions.device_skip_reason("privateuse1"),
            NOT_REGISTERED
            if dimensions.privateuse1_backend() is None
            else dimensions.device_skip_reason(dimensions.privateuse1_backend()),
        )
        available = mock.Mock(is_available=lambda: True)
        absent = mock.Mock(is_available=lambda: False)
        with mock.patch.object(dimensions, "privateuse1_backend", return_value="npu"):
            with mock.patch.object(torch, "npu", available, create=True):
                self.assertIsNone(dimensions.device_skip_reason("privateuse1"))
                self.assertEqual(dimensions.torch_device_type("privateuse1"), "npu")
            with mock.patch.object(torch, "npu", absent, create=True):
                self.assertEqual(dimensions.device_skip_reason("privateuse1"), "NPU is not available")
        with mock.patch.object(dimensions, "privateuse1_backend", return_value=None):
            self.assertEqual(dimensions.device_skip_reason("privateuse1"), NOT_REGISTERED)
            self.assertEqual(dimensions.torch_device_type("privateuse1"), "privateuse1")


class TestBackendFixture(unittest.TestCase):
    def test_this_process_never_registers_the_backend(self):
        owner = torch._C._get_privateuse1_backend_name()
        self.assertFalse(getattr(getattr(torch, owner, None), "_tst_backend", False))
        if owner != "privateuseone":  # a real backend (torch_npu) owns privateuse1: the fake stays out
            self.assertRegex(npu_backend.skip_reason(), r"^privateuse1 already belongs to a real backend")

    def test_no_compiler_is_a_clear_skip_reason(self):
        with mock.patch("shutil.which", return_value=None):
            reason = npu_backend.skip_reason()
        self.assertRegex(
            reason, r"^no C\+\+ compiler \('\S+' not found on PATH\): the npu test backend cannot be built$"
        )

    def test_build_dir_is_git_ignored_and_versioned(self):
        build = npu_backend.build_dir()
        self.assertEqual(build.parent, ROOT / "build" / "npu_backend")
        self.assertIn(torch.__version__.replace("+", "_"), build.name)
        ignored = subprocess.run(["git", "check-ignore", "-q", str(build / "x.so")], cwd=ROOT)
        if ignored.returncode == 128:
            self.skipTest("not a git checkout")
        self.assertEqual(ignored.returncode, 0)


if __name__ == "__main__":
    unittest.main()
