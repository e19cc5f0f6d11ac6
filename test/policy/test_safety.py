"""Safety: no public path of the library runs code from bytes it did not produce.

Every hostile checkpoint from ``hostile_checkpoints`` appends to a sentinel file
if any of its code runs; the sentinel must never exist.  A subprocess first
proves the payloads are live (a full unpickle *does* write the sentinel), so the
absence of the sentinel here means something.  Broken bytes must give a clear
:class:`CheckpointFormatError` (or the documented error), never a hang or crash.  Both ways foreign
bytes come in are driven: the core's ``Checkpoint`` (zip archives from memory; other formats are refused,
naming the tools) and the tools' ``FileCheckpoint`` (every format torch reads, files too).
"""

from __future__ import annotations

import atexit
import functools
import io
import itertools
import json
import os
import pickle
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap
import unittest
import uuid
import warnings
import zipfile
from typing import Optional
from unittest import mock

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the project root
sys.path.insert(0, ROOT)

import torch  # noqa: E402

from test.helpers import hostile_checkpoints as H  # noqa: E402
import torch_serial_testing as tst  # noqa: E402
from torch_serial_testing import (  # noqa: E402
    AllowlistError,
    Checkpoint,
    CheckpointFormatError,
    ExpectedRejection,
    LoadMode,
    RoundTripConfigError,
    SerializationRoundTripTestCase,
    UnsafeLoadRefused,
    required_globals,
    scan_checkpoint,
)
from torch_serial_testing.declarations import SafeGlobal, normalize_safe_globals  # noqa: E402
from torch_serial_testing.modes import torch_default_weights_only  # noqa: E402
from torch_serial_testing.registry import torch_allowlist  # noqa: E402
from torch_serial_testing.serialization import torch_load_replacement  # noqa: E402
from torch_serial_testing.tools import FileCheckpoint  # noqa: E402
from torch_serial_testing.tools import required_globals as tools_required_globals  # noqa: E402
from torch_serial_testing.tools import scan_checkpoint as tools_scan_checkpoint  # noqa: E402
from torch_serial_testing.tools.facts import torchscript_refusal  # noqa: E402
from torch_serial_testing.tools.policy.snippet import refusal_notes, safe_globals_snippet  # noqa: E402
from torch_serial_testing.tools.policy.trust import dangerous_reason  # noqa: E402

from test.helpers.roundtrip_fixtures import READS_FORCE_NO_WEIGHTS_ONLY, SAFE_GLOBALS_SKIP, assert_mode_skips_here  # noqa: E402
from test.helpers.subprocess_env import child_env  # noqa: E402

FORCE_NO_WO = "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD"
# A bare torch.load is weights-only since torch 2.6; before, the `default` mode is a full load,
# which the library refuses for foreign bytes (UnsafeLoadRefused, before any scan or format check).
TORCH_DEFAULT_WO, TORCH_DEFAULT_WHY = torch_default_weights_only()
# (The safe_globals mode needs torch >= 2.5; before, each load in it is asserted to skip with
# the library's reason -- SAFE_GLOBALS_SKIP -- before anything is read.)
WEIGHTS_ONLY_MODES = ("safe_globals", "default") if TORCH_DEFAULT_WO else ("safe_globals",)
# The exact refusal of a `default` load of foreign bytes where that is a full load.
DEFAULT_REFUSAL = re.escape(
    f"refusing a weights_only=False load (weights_only=False {TORCH_DEFAULT_WHY}) of bytes this process "
    "did not just produce: only Checkpoint.save() output may be fully unpickled"
)
# Whether torch.load reads TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD at all (torch >= 2.6; ignored before).
TORCH_READS_FORCE_NO = READS_FORCE_NO_WEIGHTS_ONLY


def _missing_storage_error() -> str:
    """What a weights-only torch.load raises for a record torch refuses (a missing storage),
    asked of torch: torch before 2.5 turns every RuntimeError inside the weights-only unpickler
    into pickle.UnpicklingError.  (The bytes are torch's own save of a tensor, its storage
    record dropped: nothing to run.)"""
    import zipfile

    buf = io.BytesIO()
    torch.save({"w": torch.arange(4.0)}, buf)
    with zipfile.ZipFile(io.BytesIO(buf.getvalue())) as z:
        pkl = z.read(next(n for n in z.namelist() if n.endswith("data.pkl")))
    try:
        torch.load(io.BytesIO(H.torch_zip(pkl, {})), weights_only=True)
    except (RuntimeError, pickle.UnpicklingError) as e:
        return type(e).__name__
    raise AssertionError("torch loaded a checkpoint whose storage record is missing")


TORCH_WO_RECORD_ERROR = _missing_storage_error()
assert TORCH_WO_RECORD_ERROR in ("RuntimeError", "UnpicklingError"), TORCH_WO_RECORD_ERROR

# torch's weights-only unpickler refuses these opcodes before it ever sees the global
# (STACK_GLOBAL/SHORT_BINUNICODE, INST/UNICODE): the scan records them, so the rejection is
# predicted ("opcode ... not supported by the weights-only unpickler") and expected.
OPCODE_REJECTED = frozenset({"stack_global_protocol4", "stack_global_unresolved", "inst_protocol0"})
# torch.load never reads the tar format from memory nor weights-only: CheckpointFormatError.
TAR = frozenset({"legacy_tar_payload"})
# Resolves to nothing even in a full unpickle (its point is the allowlisted-looking module).
NOT_LIVE = frozenset({"forged_torch_utils_name"})
# Formats before torch 1.6 (a legacy stream, a tar archive): the core reads the zip archives torch.save
# writes, from memory, and refuses these naming the tools, whose FileCheckpoint reads every format.
NOT_ZIP = frozenset({"legacy_cve_2025_32434", "legacy_sys_info_payload", "legacy_tar_payload"})
#: How foreign bytes reach the library: the core's Checkpoint, the tools' FileCheckpoint.
WRAPS = {"core": Checkpoint.from_bytes, "tools": FileCheckpoint.from_bytes}


def not_zip_refusal(data: bytes) -> str:
    """The core's exact refusal (a regex) of bytes that are not a zip archive."""
    return "^" + re.escape(
        f"not a zip archive (the first bytes are {data[:4]!r}): torch.save has written zip archives since "
        "torch 1.6; read other formats (legacy streams, tar archives) and files with "
        "torch_serial_testing.tools.scan_checkpoint"
    )


def core_reads(name: str, checkpoint: Checkpoint) -> bool:
    """Whether *checkpoint* (of the payload *name*) is read, or refused by the core as not a zip archive."""
    return isinstance(checkpoint, FileCheckpoint) or name not in NOT_ZIP


# The sentinel's folder is named at import (the hostile payloads carry its path) but made only when
# the module's tests start: collecting the suite writes nothing to the temporary directory.
_tmpdir = os.path.join(tempfile.gettempdir(), f"tst-safety-{os.getpid()}-{uuid.uuid4().hex}")
SENTINEL = os.path.join(_tmpdir, "sentinel")
HOSTILE = H.build_all(SENTINEL)


def setUpModule() -> None:  # noqa: N802
    os.mkdir(_tmpdir, 0o700)  # fails if anything is there already
    atexit.register(shutil.rmtree, _tmpdir, True)  # also after an interrupted run


def tearDownModule() -> None:  # noqa: N802
    # Catches anything that ran after its test's own check (e.g. a child process).
    executed = os.path.exists(SENTINEL)
    content = open(SENTINEL).read() if executed else ""
    shutil.rmtree(_tmpdir, ignore_errors=True)
    if executed:
        raise AssertionError(f"hostile code ran during test_safety: {content!r}")


def _small_module() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Linear(3, 2)


class SentinelMixin:
    def setUp(self) -> None:
        super().setUp()  # type: ignore[misc]
        # The hostile set holds protocol-4 pickles on purpose; torch's weights-only unpickler warns
        # about every one it reads ("Detected pickle protocol 4"): expected here, so not shown.
        caught = warnings.catch_warnings()
        caught.__enter__()
        self.addCleanup(caught.__exit__, None, None, None)  # type: ignore[attr-defined]
        warnings.filterwarnings("ignore", message="Detected pickle protocol", category=UserWarning)

    def tearDown(self) -> None:
        super().tearDown()  # type: ignore[misc]
        self.assertSentinelAbsent()

    def assertSentinelAbsent(self) -> None:  # noqa: N802
        """Fail (once, here) if hostile code ran; the sentinel is removed so the next test is judged alone."""
        if os.path.exists(SENTINEL):
            with open(SENTINEL) as fh:
                ran = fh.read()
            os.remove(SENTINEL)
            raise AssertionError(f"hostile code ran: {ran!r}")


class TestHostileCheckpointsAreReal(SentinelMixin, unittest.TestCase):
    def test_there_are_enough_distinct_payloads(self) -> None:
        self.assertGreaterEqual(len(HOSTILE), 12)
        self.assertEqual(len(set(HOSTILE.values())), len(HOSTILE))
        for name, data in HOSTILE.items():
            with self.subTest(name):
                if name.startswith("legacy_"):
                    continue
                with zipfile.ZipFile(io.BytesIO(data)) as z:
                    names = z.namelist()
                for record in (
                    "archive/data.pkl",
                    "archive/byteorder",
                    "archive/version",
                    "archive/.format_version",
                    "archive/.data/serialization_id",
                ):
                    self.assertIn(record, names)

    def test_payloads_run_when_fully_unpickled(self) -> None:
        """In a child process, torch.load(weights_only=False) of each payload writes the sentinel.

        Without this the sentinel's absence elsewhere would prove nothing.
        """
        work = tempfile.mkdtemp(prefix="tst-live-")
        self.addCleanup(shutil.rmtree, work, True)
        sentinel = os.path.join(work, "live-sentinel")
        script = textwrap.dedent(
            """
            import json, os, subprocess, sys, warnings
            sys.path.insert(0, sys.argv[1])
            import torch
            from test.helpers.hostile_checkpoints import build_all
            warnings.simplefilter("ignore")
            errors = {}
            for name, data in build_all(sys.argv[2]).items():
                path = os.path.join(sys.argv[3], name + ".pt")
                with open(path, "wb") as fh:
                    fh.write(data)
                try:  # a real file: the only way torch reads the legacy tar format
                    value = torch.load(path, weights_only=False)
                    if isinstance(value, subprocess.Popen):
                        value.wait()
                except Exception as e:
                    errors[name] = type(e).__name__
            print(json.dumps(errors))
            """
        )
        proc = subprocess.run(
            [sys.executable, "-c", script, ROOT, sentinel, work],
            capture_output=True,
            text=True,
            timeout=120,
            env=child_env(drop=()),
        )
        self.assertEqual(proc.returncode, 0, proc.stderr)
        errors = json.loads(proc.stdout.strip().splitlines()[-1])
        self.assertEqual(errors, {"forged_torch_utils_name": "AttributeError"})
        with open(sentinel) as fh:
            ran = sorted(line.strip() for line in fh if line.strip())
        self.assertEqual(ran, sorted(set(HOSTILE) - NOT_LIVE))


class TestStaticScan(SentinelMixin, unittest.TestCase):
    def test_scan_names_the_dangerous_global(self) -> None:
        for name, data in HOSTILE.items():
            with self.subTest(name):
                info = tools_scan_checkpoint(data)
                expected_format = "tar" if name in TAR else "legacy" if name in NOT_ZIP else "zip"
                self.assertEqual(info.format, expected_format)
                bad = H.DANGEROUS_GLOBALS[name]
                self.assertIn(bad, info.globals)
                self.assertEqual(info, FileCheckpoint.from_bytes(data).info)
                self.assertEqual(info, tools_scan_checkpoint(io.BytesIO(data)))
                self.assertIn(bad, tools_required_globals(data))
                self.assertIn(bad, tools_required_globals(FileCheckpoint.from_bytes(data)))
                # the core: the same facts of a zip archive, else a refusal naming the tools
                core = {
                    "scan_checkpoint": lambda: scan_checkpoint(data),
                    "info": lambda: Checkpoint.from_bytes(data).info,
                    "required_globals": lambda: required_globals(data),
                }
                if name in NOT_ZIP:
                    for label, call in core.items():
                        with self.subTest(name, core=label):
                            with self.assertRaisesRegex(CheckpointFormatError, not_zip_refusal(data)):
                                call()
                    continue
                self.assertEqual(scan_checkpoint(data), info)
                self.assertEqual(Checkpoint.from_bytes(data).info, info)
                self.assertEqual(required_globals(data), tools_required_globals(data))

    def test_dangerous_reason_flags_every_payload(self) -> None:
        forged = {"forged_torch_utils_name"}  # harmless-looking by name: flagged only as not allowlisted
        for name, data in HOSTILE.items():
            with self.subTest(name):
                flagged = [g for g in tools_required_globals(data) if dangerous_reason(g)]
                if name in forged:
                    self.assertEqual(flagged, [])
                    self.assertNotIn(H.DANGEROUS_GLOBALS[name], torch_allowlist())
                else:
                    self.assertIn(H.DANGEROUS_GLOBALS[name], flagged)

    def test_snippet_never_allowlists_a_dangerous_global(self) -> None:
        # The snippet is code only (imports and one safe_globals call): a refused name is left out
        # of it entirely, and refusal_notes says why, outside the code.
        for name, data in HOSTILE.items():
            with self.subTest(name):
                needed = tools_required_globals(data)
                snippet = safe_globals_snippet(needed)
                context_line = next(l for l in snippet.splitlines() if "safe_globals([" in l)
                notes = "\n".join(refusal_notes(needed))
                for g in needed:
                    if dangerous_reason(g):
                        self.assertIn(f"{g}: NOT suggested", notes)
                refs = context_line.split("safe_globals([", 1)[1].rsplit("])", 1)[0]
                for g in needed:
                    if dangerous_reason(g):
                        self.assertNotIn(g.rsplit(".", 1)[-1], refs.split(", "), context_line)
                if FileCheckpoint.from_bytes(data).info.weights_only_blocker:
                    # no allowlist makes it load (the str the payload REDUCEs with is a harmless class);
                    # inspect offers no snippet at all for it (test_cli)
                    continue
                # Every global these payloads need is refused: the list is empty, and no import is made.
                # (the context where torch has it, else the registry call: torch < 2.5)
                empty = "safe_globals([]):" if hasattr(torch.serialization, "safe_globals") else "add_safe_globals([])"
                self.assertTrue(context_line.endswith(empty), context_line)
                self.assertEqual([l for l in snippet.splitlines() if "import" in l], ["import torch"])


class TestLoadHelper(SentinelMixin, unittest.TestCase):
    def assertRejectedWeightsOnly(self, name: str, data: bytes, mode: str, via: str) -> None:  # noqa: N802
        """A weights-only load of the payload *name*, wrapped *via* the core or the tools, never runs it."""
        checkpoint = WRAPS[via](data)
        if assert_mode_skips_here(self, mode, lambda: tst.load(checkpoint, mode)):
            return  # a mode this torch cannot run (safe_globals before 2.5): skipped, nothing read
        if not core_reads(name, checkpoint):
            with self.assertRaisesRegex(CheckpointFormatError, not_zip_refusal(data)):
                tst.load(checkpoint, mode)
        elif name in TAR:
            with self.assertRaisesRegex(CheckpointFormatError, "legacy tar checkpoint"):
                tst.load(checkpoint, mode)
        elif name in OPCODE_REJECTED:
            result = tst.load(checkpoint, mode)
            self.assertFalse(result.loaded)
            self.assertRegex(str(result.error), r"Unsupported operand \d+")
            self.assertTrue(set(result.expectation.unsupported_opcodes) & {"STACK_GLOBAL", "INST"})
            self.assertIn("not supported by the weights-only unpickler", result.summary)
            self.assertTrue(result.summary.startswith(f"{mode}: rejected as expected"), result.summary)
        else:
            result = tst.load(checkpoint, mode)
            self.assertFalse(result.loaded)
            self.assertIsNone(result.value)
            self.assertIsInstance(result.error, pickle.UnpicklingError)
            self.assertTrue(result.expectation.weights_only)
            self.assertIn(H.DANGEROUS_GLOBALS[name], result.expectation.missing)
            self.assertTrue(result.summary.startswith(f"{mode}: rejected as expected"), result.summary)

    def assertDefaultRefused(self, checkpoint: Checkpoint) -> None:  # noqa: N802
        """A `default` load of foreign bytes where it is a full load (torch < 2.6): refused up front."""
        self.assertNotIn("default", WEIGHTS_ONLY_MODES)
        with self.assertRaisesRegex(UnsafeLoadRefused, DEFAULT_REFUSAL):
            tst.load(checkpoint, "default")

    def test_weights_only_modes_reject_every_payload(self) -> None:
        for via, wrap in WRAPS.items():
            for name, data in HOSTILE.items():
                for mode in WEIGHTS_ONLY_MODES:
                    with self.subTest(name, mode=mode, via=via):
                        self.assertRejectedWeightsOnly(name, data, mode, via)
                        self.assertSentinelAbsent()
                if "default" not in WEIGHTS_ONLY_MODES:
                    with self.subTest(name, mode="default", via=via):
                        self.assertDefaultRefused(wrap(data))
                        self.assertSentinelAbsent()

    def test_weights_only_false_is_refused_for_foreign_bytes(self) -> None:
        wraps = (
            Checkpoint.from_bytes,
            lambda d: Checkpoint.from_buffer(io.BytesIO(d)),
            FileCheckpoint.from_bytes,
            lambda d: FileCheckpoint.from_buffer(io.BytesIO(d)),
        )
        for env in ({}, {"TORCH_FORCE_WEIGHTS_ONLY_LOAD": "1"}, {"TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD": "1"}):
            with mock.patch.dict(os.environ, env):
                # where the switch makes even this mode weights-only, the load is predicted (the bytes
                # read) before it is refused: the core then refuses what is not a zip archive first
                scans = tst.predict("weights_only_false", Checkpoint.from_bytes(HOSTILE["os_system"])).weights_only
            for name, data in HOSTILE.items():
                for wrap in wraps:
                    with self.subTest(name, env=env), mock.patch.dict(os.environ, env):
                        checkpoint = wrap(data)
                        self.assertFalse(checkpoint.owned)
                        if scans and not core_reads(name, checkpoint):
                            with self.assertRaisesRegex(CheckpointFormatError, not_zip_refusal(data)):
                                tst.load(checkpoint, "weights_only_false")
                            continue
                        with self.assertRaisesRegex(UnsafeLoadRefused, "did not just produce"):
                            tst.load(checkpoint, "weights_only_false")
                        with self.assertRaises(UnsafeLoadRefused):
                            tst.load(checkpoint, LoadMode.WEIGHTS_ONLY_FALSE)

    def test_foreign_bytes_from_a_file_path_are_foreign(self) -> None:
        path = os.path.join(_tmpdir, "hostile.pt")
        with open(path, "wb") as fh:
            fh.write(HOSTILE["posix_system"])
        # the core reads bytes and buffers; a path is the tools' (FileCheckpoint)
        with self.assertRaisesRegex(
            TypeError,
            rf"^Checkpoint.from_buffer takes bytes or a buffer, not the path '{re.escape(path)}': files are read "
            r"by torch_serial_testing\.tools\.FileCheckpoint\.from_path\(path\)$",
        ):
            Checkpoint.from_buffer(path)
        for checkpoint in (FileCheckpoint.from_path(path), FileCheckpoint.from_buffer(path)):
            self.assertForeignFileNeverRuns(checkpoint)

    def assertForeignFileNeverRuns(self, checkpoint: Checkpoint) -> None:  # noqa: N802
        self.assertFalse(checkpoint.owned)
        with self.assertRaises(UnsafeLoadRefused):
            tst.load(checkpoint, "weights_only_false")
        if TORCH_DEFAULT_WO:
            self.assertFalse(tst.load(checkpoint, "default").loaded)
        else:
            self.assertDefaultRefused(checkpoint)

    def test_load_requires_a_checkpoint(self) -> None:
        with self.assertRaisesRegex(TypeError, "Checkpoint.from_bytes"):
            tst.load(HOSTILE["os_system"], "default")  # type: ignore[arg-type]
        with self.assertRaisesRegex(TypeError, "Checkpoint.from_bytes"):
            tst.load(io.BytesIO(HOSTILE["os_system"]), "weights_only_false")  # type: ignore[arg-type]

    def test_force_no_weights_only_refuses_default_on_foreign_bytes(self) -> None:
        # A torch that ignores the switch (< 2.6) still makes `default` a full load: its own default.
        refusal = (
            re.escape(f"(weights_only=False forced by {FORCE_NO_WO}=1)") if TORCH_READS_FORCE_NO else DEFAULT_REFUSAL
        )
        with mock.patch.dict(os.environ, {"TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD": "1"}):
            os.environ.pop("TORCH_FORCE_WEIGHTS_ONLY_LOAD", None)
            for via, wrap in WRAPS.items():
                for name, data in HOSTILE.items():
                    with self.subTest(name, via=via):
                        # a full load of foreign bytes: refused before anything reads them
                        with self.assertRaisesRegex(UnsafeLoadRefused, refusal):
                            tst.load(wrap(data), "default")
                        # An explicit weights_only=True still wins over the switch.
                        self.assertRejectedWeightsOnly(name, data, "safe_globals", via)
            # Owned bytes load fully, and torch warns about the switch as predicted (where it reads it).
            module = _small_module()
            result = tst.load(Checkpoint.save(module), "default")
            self.assertTrue(result.loaded)
            self.assertFalse(result.expectation.weights_only)
            self.assertEqual(result.expectation.warns, TORCH_READS_FORCE_NO)
            tst.assert_round_trip_equal(module, result.value)
            # The same bytes, re-wrapped as foreign, are refused.
            raw = Checkpoint.save(module).rewound().getvalue()
            with self.assertRaises(UnsafeLoadRefused):
                tst.load(Checkpoint.from_bytes(raw), "default")

    def test_replaced_torch_load_never_fully_unpickles_foreign_bytes(self) -> None:
        """An out-of-tree backend may replace torch.load with a weights_only=False default."""
        original = torch.load

        def backend_load(f, map_location=None, *, weights_only=False, **kwargs):  # type: ignore[no-untyped-def]
            return original(f, map_location=map_location, weights_only=weights_only, **kwargs)

        with mock.patch.object(torch, "load", backend_load):
            self.assertIsNotNone(torch_load_replacement())
            self.assertDefaultModeNeverRuns(
                "os_system", "posix_system", "state_dict_with_payload", "legacy_cve_2025_32434"
            )

    def assertDefaultModeNeverRuns(self, *names: str) -> None:  # noqa: N802
        """``default`` on each foreign payload: rejected weights-only, or refused where that is a full load."""
        for via, wrap in WRAPS.items():
            for name in names:
                with self.subTest(name, via=via):
                    checkpoint = wrap(HOSTILE[name])
                    if not TORCH_DEFAULT_WO:  # torch's own default is a full load here: refused before torch.load
                        self.assertDefaultRefused(checkpoint)
                    elif not core_reads(name, checkpoint):
                        with self.assertRaisesRegex(CheckpointFormatError, not_zip_refusal(HOSTILE[name])):
                            tst.load(checkpoint, "default")
                    else:
                        self.assertFalse(tst.load(checkpoint, "default").loaded)
                    self.assertSentinelAbsent()

    def test_environment_changed_during_load_cannot_disable_weights_only(self) -> None:
        """Another thread setting TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD after the prediction."""
        original = torch.load

        def racing_load(*args, **kwargs):  # type: ignore[no-untyped-def]
            with mock.patch.dict(os.environ, {"TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD": "1"}):
                return original(*args, **kwargs)

        with mock.patch.object(torch, "load", racing_load):
            self.assertDefaultModeNeverRuns("os_system", "nested_container", "functools_partial")

    def test_dangerous_safe_globals_are_refused_however_named(self) -> None:
        alias = H.torch_zip(H.proto(2) + H.call1(H.glob("mymod", "Safe"), H.ustr(f"echo alias >> {SENTINEL}")) + H.STOP)
        # (declared, the name it is declared as, what it runs as): refused by the small check on declarations
        declarations = [
            (["os.system"], "os.system", "posix.system"),
            ([os.system], "posix.system", "posix.system"),
            (["builtins.eval"], "builtins.eval", "builtins.eval"),
            ([eval], "builtins.eval", "builtins.eval"),
            (["functools.partial"], "functools.partial", "functools.partial"),
            ([(os.system, "mymod.Safe")], "mymod.Safe", "posix.system"),
            ([(eval, "mymod.Safe")], "mymod.Safe", "builtins.eval"),
            ([(subprocess.Popen, "mymod.Safe")], "mymod.Safe", "subprocess.Popen"),
            ([(functools.partial(os.system), "mymod.Safe")], "mymod.Safe", "functools.partial"),
            ([(open, "mymod.Safe")], "mymod.Safe", "io.open"),
        ]
        runs = "runs code or reaches the system when a pickle calls it"
        for declared, name, runs_as in declarations:
            with self.subTest(declared=declared):
                with self.assertRaisesRegex(RoundTripConfigError, f"^refusing to allowlist {name}: {runs_as} {runs}$"):
                    normalize_safe_globals(declared)
        for sg in (SafeGlobal(os.system, "mymod.Safe", True), SafeGlobal(os.system, "posix.system")):
            for mode in WEIGHTS_ONLY_MODES:
                with self.subTest(sg=sg, mode=mode):
                    # A mode this torch cannot run skips first, before the declaration is looked at.
                    if assert_mode_skips_here(self, mode, lambda: tst.load(Checkpoint.from_bytes(alias), mode, [sg])):
                        continue
                    if mode != "safe_globals":
                        # The declaration is read only where the mode uses it (issue 37): a bare load never
                        # passes it to torch, which refuses the alias as a global nobody allowlisted.
                        result = tst.load(Checkpoint.from_bytes(alias), mode, [sg])
                        self.assertFalse(result.loaded)
                        self.assertEqual(result.expectation.missing, ("mymod.Safe",))
                        continue
                    with self.assertRaisesRegex(
                        RoundTripConfigError, f"^refusing to allowlist {sg.name}: posix.system {runs}$"
                    ):
                        tst.load(Checkpoint.from_bytes(alias), mode, [sg])
        # Undeclared, the alias is just a missing global.
        if not assert_mode_skips_here(
            self, "safe_globals", lambda: tst.load(Checkpoint.from_bytes(alias), "safe_globals")
        ):
            self.assertFalse(tst.load(Checkpoint.from_bytes(alias), "safe_globals").loaded)

    def test_required_globals_of_a_hostile_object_does_not_run_it(self) -> None:
        payload = H._Reduce(os.system, f"echo object >> {SENTINEL}")
        self.assertIn("posix.system", required_globals({"x": [payload]}))


class TestMixinPaths(SentinelMixin, SerializationRoundTripTestCase, unittest.TestCase):
    """The mixin's load_checkpoint / round_trip with hostile input, every mode."""

    def test_load_checkpoint_default_mode(self) -> None:
        for via, wrap in WRAPS.items():
            for name, data in HOSTILE.items():
                with self.subTest(name, via=via):
                    checkpoint = wrap(data)
                    if not TORCH_DEFAULT_WO:  # a full load here (torch < 2.6): refused for foreign bytes
                        with self.assertRaisesRegex(UnsafeLoadRefused, DEFAULT_REFUSAL):
                            self.load_checkpoint(checkpoint, mode="default")
                    elif not core_reads(name, checkpoint):
                        with self.assertRaisesRegex(CheckpointFormatError, not_zip_refusal(data)):
                            self.load_checkpoint(checkpoint, mode="default")
                    elif name in TAR:
                        with self.assertRaisesRegex(CheckpointFormatError, "^this is a legacy tar checkpoint"):
                            self.load_checkpoint(checkpoint, mode="default")
                    elif name in OPCODE_REJECTED:
                        with self.assertRaisesRegex(
                            ExpectedRejection, "opcode .* not supported by the weights-only unpickler"
                        ):
                            self.load_checkpoint(checkpoint, mode="default")
                    else:
                        with self.assertRaisesRegex(ExpectedRejection, "^default: rejected as expected") as cm:
                            self.load_checkpoint(checkpoint, mode=LoadMode.DEFAULT)
                        self.assertIn(H.DANGEROUS_GLOBALS[name], cm.exception.summary)

    def test_load_checkpoint_safe_globals_mode_names_what_is_missing(self) -> None:
        # Names a declaration may hold (these two resolve to nothing callable here): the paste-ready fix.
        declarable = {"forged_torch_utils_name", "forged_torch_serialization_os"}
        for via, wrap in WRAPS.items():
            for name, data in HOSTILE.items():
                with self.subTest(name, via=via):
                    checkpoint = wrap(data)
                    load = lambda: self.load_checkpoint(checkpoint, mode="safe_globals")  # noqa: E731
                    if assert_mode_skips_here(self, "safe_globals", load):
                        continue  # no safe_globals context: the mode skips before the declaration is judged
                    if not core_reads(name, checkpoint):
                        with self.assertRaisesRegex(CheckpointFormatError, not_zip_refusal(data)):
                            load()
                        continue
                    if name in TAR:
                        with self.assertRaisesRegex(CheckpointFormatError, "^this is a legacy tar checkpoint"):
                            load()
                        continue
                    bad = H.DANGEROUS_GLOBALS[name]
                    with self.assertRaises(AllowlistError) as cm:
                        load()
                    message = str(cm.exception)
                    if FileCheckpoint.from_bytes(data).info.weights_only_blocker:
                        # a global no allowlist can make torch accept (or an opcode it refuses)
                        self.assertRegex(
                            message,
                            "^TestMixinPaths.safe_globals: this checkpoint cannot load weights-only, whatever is "
                            f"allowlisted: .* \\(it also names (.*, )?{re.escape(bad)}(, .*)? beyond torch's allowlist\\)",
                        )
                        continue
                    self.assertTrue(
                        message.startswith(
                            f"TestMixinPaths.safe_globals misses 1 global(s) the checkpoint needs: {bad}\n"
                        ),
                        message,
                    )
                    if name in declarable:
                        self.assertIn("\nThe exact declaration (declare only what you trust):\n", message)
                    else:  # a code-running global: no declaration is offered, none would be accepted
                        self.assertIn(
                            f"\nNo declaration can make this checkpoint load: {bad}: it runs code or reaches the system "
                            "when a pickle calls it. Never declare it;",
                            message,
                        )
                        self.assertNotIn("import", message)

    def test_load_checkpoint_weights_only_false_refused(self) -> None:
        for via, wrap in WRAPS.items():
            for name, data in HOSTILE.items():
                with self.subTest(name, via=via):
                    with self.assertRaisesRegex(UnsafeLoadRefused, "did not just produce"):
                        self.load_checkpoint(wrap(data), mode="weights_only_false")

    def test_load_checkpoint_refuses_dangerous_declarations(self) -> None:
        data = HOSTILE["os_system"]
        runs = "posix.system runs code or reaches the system when a pickle calls it"
        for declared, name in (
            ([os.system], "posix.system"),
            (["os.system"], "os.system"),
            ([(os.system, "os.system")], "os.system"),
            ([SafeGlobal(os.system, "os.system", True)], "os.system"),
            ([SafeGlobal(os.system, "mymod.Safe", True)], "mymod.Safe"),
        ):
            with self.subTest(declared=declared):
                with self.assertRaisesRegex(RoundTripConfigError, f"^refusing to allowlist {name}: {runs}$"):
                    self.load_checkpoint(Checkpoint.from_bytes(data), mode="safe_globals", safe_globals=declared)

    def test_round_trip_of_a_hostile_object_in_weights_only_modes(self) -> None:
        payload = {"weight": torch.ones(2), "hook": H._Reduce(os.system, f"echo round_trip >> {SENTINEL}")}
        # `default` is a weights-only mode only where a bare torch.load is (torch >= 2.6); an owned
        # checkpoint in a full-load mode would really run the payload, so it is not tried there.
        self.assertEqual(tst.predict("default", Checkpoint.save(payload)).weights_only, "default" in WEIGHTS_ONLY_MODES)
        if "default" in WEIGHTS_ONLY_MODES:
            with self.assertRaisesRegex(ExpectedRejection, "default: rejected as expected .*posix.system"):
                self.round_trip(payload, mode="default")
        if not assert_mode_skips_here(self, "safe_globals", lambda: self.round_trip(payload, mode="safe_globals")):
            with self.assertRaisesRegex(
                AllowlistError,
                "^TestMixinPaths.safe_globals: this checkpoint cannot load weights-only, whatever is allowlisted: "
                ".*posix.system",
            ):
                self.round_trip(payload, mode="safe_globals")

    def test_class_declaring_a_dangerous_global_fails_at_creation(self) -> None:
        for declared, name, runs_as in (
            (("os.system",), "os.system", "posix.system"),
            ((os.system,), "posix.system", "posix.system"),
            (((os.system, "mymod.Safe"),), "mymod.Safe", "posix.system"),
            (("builtins.exec",), "builtins.exec", "builtins.exec"),
        ):
            with self.subTest(declared=declared):
                with self.assertRaisesRegex(
                    RoundTripConfigError,
                    f"^refusing to allowlist {name}: {runs_as} runs code or reaches the system when a pickle calls it$",
                ):
                    type("Bad", (SerializationRoundTripTestCase, unittest.TestCase), {"safe_globals": declared})


class TestBrokenBytes(SentinelMixin, unittest.TestCase):
    @classmethod
    def setUpClass(cls) -> None:
        cls.good = Checkpoint.save({"w": torch.arange(4.0), "b": torch.ones(3)}).rewound().getvalue()

    def assertFormatError(self, data: bytes, pattern: str, core: Optional[str] = None) -> None:  # noqa: N802
        """Every public entry point raises CheckpointFormatError matching *pattern*: the tools' (which read
        every format) and the core's (which read zip archives; *core*: their pattern where it differs)."""
        entry_points = {
            "scan_checkpoint": (lambda: tools_scan_checkpoint(data), lambda: scan_checkpoint(data)),
            "required_globals": (lambda: tools_required_globals(data), lambda: required_globals(data)),
            "info": (lambda: FileCheckpoint.from_bytes(data).info, lambda: Checkpoint.from_bytes(data).info),
            "load default": (
                lambda: tst.load(FileCheckpoint.from_bytes(data), "default"),
                lambda: tst.load(Checkpoint.from_bytes(data), "default"),
            ),
            "load safe_globals": (
                lambda: tst.load(FileCheckpoint.from_bytes(data), "safe_globals"),
                lambda: tst.load(Checkpoint.from_bytes(data), "safe_globals"),
            ),
        }
        for (label, calls), via in itertools.product(entry_points.items(), ("tools", "core")):
            call = calls[via == "core"]
            expected = core if via == "core" and core is not None else pattern
            with self.subTest(label, via=via):
                if label == "load default" and not TORCH_DEFAULT_WO:
                    # A full load here (torch < 2.6): foreign bytes are refused before any scan.
                    with self.assertRaisesRegex(UnsafeLoadRefused, DEFAULT_REFUSAL):
                        call()
                    continue
                if label == "load safe_globals" and assert_mode_skips_here(self, "safe_globals", call):
                    continue  # torch < 2.5: the mode skips with its reason before any scan
                with self.assertRaisesRegex(CheckpointFormatError, expected):
                    call()

    def test_truncated(self) -> None:
        n = len(self.good)
        for cut in (1, 2, 3):
            with self.subTest(cut=cut):
                data = self.good[:cut]
                self.assertFormatError(data, r"not a torch checkpoint: the first bytes are", not_zip_refusal(data))
        for cut in (4, 30, 100, n // 2, n - 22, n - 1):
            with self.subTest(cut=cut):
                self.assertFormatError(self.good[:cut], r"zip archive is truncated or its central directory is damaged")

    def test_flipped_byte_in_central_directory(self) -> None:
        cd = self.good.find(b"PK\x01\x02")
        self.assertGreater(cd, 0)
        damaged = bytearray(self.good)
        damaged[cd + 1] ^= 0xFF  # the central directory signature
        # Read by torch's own zip reader (as torch.load reads it): its reason is quoted.
        self.assertFormatError(bytes(damaged), r"central directory is damaged \(torch's reader: .*corrupted")
        damaged = bytearray(self.good)
        name_at = self.good.find(b"archive/data.pkl", cd)
        damaged[name_at + 4] ^= 0x01  # the data.pkl file name in the directory
        self.assertFormatError(bytes(damaged), r"central directory is damaged \(torch's reader: .*version")

    def test_empty(self) -> None:
        self.assertFormatError(b"", r"the checkpoint is empty \(0 bytes\)")

    def test_not_a_checkpoint(self) -> None:
        for data, pattern in (
            (b"hello world", r"not a torch checkpoint"),
            (pickle.dumps({"a": 1}, protocol=2), r"no torch magic number"),
            (b"\x80\x02\x8a", r"pickle stream is truncated or damaged"),
        ):
            self.assertFormatError(data, pattern, not_zip_refusal(data))

    def assertLoadRefusedInEveryMode(self, data: bytes, pattern: str, core: str) -> None:  # noqa: N802
        """Weights-only modes: CheckpointFormatError (or the mode's skip) matching *pattern* through the
        tools' FileCheckpoint, *core* through the core's Checkpoint; full loads: UnsafeLoadRefused."""
        for via, wrap in WRAPS.items():
            for mode in WEIGHTS_ONLY_MODES:
                with self.subTest(mode, via=via):
                    if assert_mode_skips_here(self, mode, lambda: tst.load(wrap(data), mode)):
                        continue
                    with self.assertRaisesRegex(CheckpointFormatError, core if via == "core" else pattern):
                        tst.load(wrap(data), mode)
            with self.assertRaises(UnsafeLoadRefused):
                tst.load(wrap(data), "weights_only_false")
            if "default" not in WEIGHTS_ONLY_MODES:
                with self.assertRaisesRegex(UnsafeLoadRefused, DEFAULT_REFUSAL):
                    tst.load(wrap(data), "default")

    def test_legacy_tar_checkpoint(self) -> None:
        data = H.legacy_tar(pickle.dumps({"a": torch.Size([1])}, protocol=2))
        self.assertEqual(tools_scan_checkpoint(data).format, "tar")
        self.assertEqual(tools_required_globals(data), [])
        self.assertLoadRefusedInEveryMode(data, "^this is a legacy tar checkpoint", not_zip_refusal(data))
        no_pickle = io.BytesIO()
        import tarfile

        with tarfile.open(fileobj=no_pickle, mode="w:") as tar:
            info = tarfile.TarInfo("sys_info")
            raw = pickle.dumps({}, protocol=2)
            info.size = len(raw)
            tar.addfile(info, io.BytesIO(raw))
        # torch reads 'storages' first, then 'tensors', then 'pickle'.
        data = no_pickle.getvalue()
        self.assertFormatError(data, "no 'storages' member: not a legacy torch checkpoint", not_zip_refusal(data))

    def test_torchscript_archive(self) -> None:
        buf = io.BytesIO()
        with warnings.catch_warnings():  # torch >= 2.10 deprecates TorchScript; an archive is the point here
            warnings.filterwarnings(
                "ignore", message=r"`torch\.jit\.\w+` is deprecated"
            )  # Deprecation- or FutureWarning
            torch.jit.save(torch.jit.script(torch.nn.ReLU()), buf)
        data = buf.getvalue()
        self.assertEqual(tools_scan_checkpoint(data).format, "torchscript")
        with self.assertRaisesRegex(CheckpointFormatError, "TorchScript archive: load it with torch.jit.load"):
            tools_required_globals(data)
        # The core reads what torch.save writes, and names the reader of a TorchScript archive.
        core = "^" + re.escape(
            "this is a TorchScript archive (torch.jit.save wrote it): torch.load hands it to torch.jit.load; "
            "read it with torch_serial_testing.tools.scan_checkpoint"
        )
        for label, call in (
            ("scan_checkpoint", scan_checkpoint),
            ("required_globals", required_globals),
            ("info", lambda d: Checkpoint.from_bytes(d).info),
        ):
            with self.subTest(core=label):
                with self.assertRaisesRegex(CheckpointFormatError, core):
                    call(data)
        # What this torch does with the archive under weights_only=True (our own bytes: safe to try):
        # refuse it (torch >= 2.6), or hand it to torch.jit.load whatever weights_only says.
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                torch.load(io.BytesIO(data), weights_only=True)
            refused = False
        except RuntimeError as e:
            self.assertIn("TorchScript", str(e))
            refused = True
            refusal = str(e)
        # the library's probe of it: torch's own refusal message, or None where torch hands it to jit
        self.assertEqual(torchscript_refusal() is not None, refused)
        if refused:
            self.assertIn("TorchScript", torchscript_refusal())
            self.assertIn(torchscript_refusal(), refusal)
        if refused:
            self.assertLoadRefusedInEveryMode(data, "TorchScript archive: load it with torch.jit.load", core)
            return
        # Every mode is then a full load of foreign bytes: refused before torch sees them, saying why (the
        # tools, which read the archive); the core refuses to read it at all, as above.
        for via, wrap in WRAPS.items():
            for mode in WEIGHTS_ONLY_MODES:
                with self.subTest(mode, via=via):
                    if assert_mode_skips_here(self, mode, lambda: tst.load(wrap(data), mode)):
                        continue
                    if via == "core":
                        with self.assertRaisesRegex(CheckpointFormatError, core):
                            tst.load(wrap(data), mode)
                        continue
                    with self.assertRaisesRegex(
                        UnsafeLoadRefused,
                        r"^refusing a weights_only=False load \(weights_only=True .*; this torch hands TorchScript "
                        r"archives to torch\.jit\.load whatever weights_only says\) of bytes this process did not",
                    ):
                        tst.load(wrap(data), mode)
            with self.assertRaises(UnsafeLoadRefused):
                tst.load(wrap(data), "weights_only_false")

    def test_non_seekable_stream(self) -> None:
        r, w = os.pipe()
        os.write(w, self.good[:64])
        os.close(w)
        with open(r, "rb", buffering=0) as stream:
            self.assertFalse(stream.seekable())
            for call in (
                Checkpoint.from_buffer,
                scan_checkpoint,
                required_globals,
                FileCheckpoint.from_buffer,
                tools_scan_checkpoint,
                tools_required_globals,
            ):
                with self.subTest(f"{call.__module__}.{call.__qualname__}"):
                    with self.assertRaisesRegex(CheckpointFormatError, "not seekable .*io.BytesIO"):
                        call(stream)

    def test_text_mode_file(self) -> None:
        path = os.path.join(_tmpdir, "text.pt")
        with open(path, "wb") as fh:
            fh.write(self.good)
        with open(path, encoding="latin-1") as fh:
            for call in (Checkpoint.from_buffer, FileCheckpoint.from_buffer):
                with self.subTest(call.__qualname__):
                    with self.assertRaisesRegex(TypeError, "text mode"):
                        call(fh)

    def test_damaged_records_never_crash_the_interpreter(self) -> None:
        """Damaged storages and pickles inside a valid zip, loaded in a child process."""
        script = textwrap.dedent(
            """
            import io, json, pickle, random, sys, warnings, zipfile
            sys.path.insert(0, sys.argv[1])
            import torch, torch_serial_testing as tst
            from test.helpers.hostile_checkpoints import torch_zip
            warnings.simplefilter("ignore")
            good = tst.Checkpoint.save({"w": torch.arange(4.0), "b": torch.ones(3)}).rewound().getvalue()
            z = zipfile.ZipFile(io.BytesIO(good))
            pkl = z.read("archive/data.pkl")
            storages = {n.split("/data/", 1)[1]: z.read(n) for n in z.namelist() if "/data/" in n}
            cases = {"short_storage": torch_zip(pkl, {k: v[:2] for k, v in storages.items()}),
                     "missing_storage": torch_zip(pkl, {}),
                     "empty_pickle": torch_zip(b"", storages)}
            rng = random.Random(0)
            for i in range(40):
                b = bytearray(pkl)
                b[rng.randrange(2, len(b) - 1)] = rng.randrange(256)
                cases[f"flip{i}"] = torch_zip(bytes(b), storages)
            documented = (tst.CheckpointFormatError, tst.UnexpectedLoadOutcome)
            mode = sys.argv[2]  # a weights-only load here (chosen by the test; see there)
            out = {}
            for name, data in cases.items():
                try:
                    r = tst.load(tst.Checkpoint.from_bytes(data), mode)
                    out[name] = "loaded" if r.loaded else "rejected"
                except documented as e:
                    out[name] = type(e).__name__
            # What torch itself does with the damaged storages, weights-only (these bytes hold no
            # payload): torch before 2.6 does not check a storage record's size and loads a short one.
            raises = {}
            for name in ("short_storage", "missing_storage"):
                try:
                    torch.load(io.BytesIO(cases[name]), weights_only=True)
                    raises[name] = None
                except (RuntimeError, pickle.UnpicklingError) as e:
                    raises[name] = type(e).__name__
            print(json.dumps(raises))
            print(json.dumps(out))
            """
        )
        # A weights-only load: the bare default where it is one (torch >= 2.6), else the explicit
        # weights_only=True of the safe_globals mode (the same call the library makes) where torch
        # has that mode's context (>= 2.5), else the bare default made weights-only by
        # TORCH_FORCE_WEIGHTS_ONLY_LOAD (the library then calls torch.load(weights_only=True) too).
        env = child_env()
        if TORCH_DEFAULT_WO:
            mode = "default"
        elif SAFE_GLOBALS_SKIP is None:
            mode = "safe_globals"
        else:
            mode, env["TORCH_FORCE_WEIGHTS_ONLY_LOAD"] = "default", "1"
        self.assertTrue(tst.predict(mode, Checkpoint.from_bytes(self.good), environ=env).weights_only)
        proc = subprocess.run(
            [sys.executable, "-c", script, ROOT, mode],
            capture_output=True,
            text=True,
            timeout=120,
            env=env,
        )
        self.assertEqual(proc.returncode, 0, proc.stderr[-3000:])
        *_, raises_line, outcomes_line = proc.stdout.strip().splitlines()
        torch_raises, outcomes = json.loads(raises_line), json.loads(outcomes_line)
        self.assertEqual(len(outcomes), 43)
        # A storage torch refuses is an unexpected outcome of a load predicted to succeed; one
        # it accepts (a short record before torch 2.6) loads, as torch does.
        self.assertEqual(torch_raises["missing_storage"], TORCH_WO_RECORD_ERROR)
        for name in ("short_storage", "missing_storage"):
            self.assertIn(torch_raises[name], (None, TORCH_WO_RECORD_ERROR), name)
            self.assertEqual(outcomes[name], "UnexpectedLoadOutcome" if torch_raises[name] else "loaded", name)
        self.assertEqual(outcomes["empty_pickle"], "CheckpointFormatError")


if __name__ == "__main__":
    unittest.main()
