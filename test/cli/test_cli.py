"""``python -m torch_serial_testing doctor|inspect``, run for real in subprocesses.

Every checkpoint is written by these tests; the CLI only ever scans them.  Each
subprocess pays for ``import torch`` (~3 s), so checks are combined per
invocation; usage errors and ``--help`` never import torch and are cheap.
"""

from __future__ import annotations

import contextlib
import io
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
import warnings

import torch

from torch_serial_testing import Checkpoint

from torch_serial_testing.tools.cli import contract
from torch_serial_testing.tools.cli.contract import (
    EXIT_ATTENTION,
    EXIT_CODES,
    EXIT_DANGEROUS,
    EXIT_OK,
    EXIT_USAGE,
    SCHEMA_VERSION,
)
from torch_serial_testing.tools.cli.doctor import AUTOLOAD, ENV_VARS, WAIT_LIMIT
from torch_serial_testing.tools.cli.inspection import MODES
from torch_serial_testing import loading as load_modes
from torch_serial_testing.registry import preserved_registry, torch_allowlist
from torch_serial_testing.dimensions import override_qengine
from torch_serial_testing.modes import torch_default_weights_only

from test.helpers.hostile_checkpoints import DANGEROUS_GLOBALS, build_all, legacy_tar
from test.helpers.roundtrip_fixtures import FORCE_NO_WO, FORCE_WO, READS_FORCE_NO_WEIGHTS_ONLY, SAFE_GLOBALS_SKIP
from test.helpers.subprocess_env import child_env

# What the seed checkpoint (a full sparse Linear) needs beyond torch's allowlist, sorted: its
# classes and torch.ScriptObject on every torch, plus builtins.set (nn.Module's
# _non_persistent_buffers_set) where torch's allowlist lacks it (before torch 2.6).
SET_NEEDED = "builtins.set" not in torch_allowlist()
SEED_GLOBALS = (["builtins.set"] if SET_NEEDED else []) + [
    "torch.ScriptObject",
    "torch.ao.nn.sparse.quantized.dynamic.linear.Linear",
    "torch.ao.nn.sparse.quantized.linear.LinearPackedParams",
]
# How the suggested safe_globals([...]) context names them (the import-free spellings).
SEED_REFS = ", ".join((["set"] if SET_NEEDED else []) + ["torch.ScriptObject", "Linear", "LinearPackedParams"])
ENV_SWITCHES = ENV_VARS

# A bare torch.load here and why: weights-only since torch 2.6, a full unpickle before.
TORCH_DEFAULT_WO, TORCH_DEFAULT_WHY = torch_default_weights_only()
# Whether torch.load reads TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD at all (torch >= 2.6); before, it is
# ignored: no forced full load, no warning, no error when both switches are set (asked of torch).
TORCH_READS_FORCE_NO = READS_FORCE_NO_WEIGHTS_ONLY


def default_mode_line(rejected_or_loads: str) -> str:
    """The regex of inspect's `default` line for a checkpoint that is *rejected_or_loads* weights-only."""
    if not TORCH_DEFAULT_WO:  # a full load: the CLI never does it, whatever the checkpoint needs
        return (
            rf"default +unsafe: weights_only=False {re.escape(TORCH_DEFAULT_WHY)}: would execute arbitrary pickle code"
        )
    if rejected_or_loads == "loads":
        return rf"default +loads \(weights_only=True {re.escape(TORCH_DEFAULT_WHY)}\)"
    return rf"default +rejected: weights_only=True {re.escape(TORCH_DEFAULT_WHY)}"


DOCTOR_KEYS = {
    "schema",
    "command",
    "status",
    "exit_code",
    "problems",
    "torch",
    "torch_load_replaced_by",
    "default_weights_only",
    "environment",
    "backend_entry_points",
    "safe_globals",
    "safe_globals_torch_own",
    "quantized_engines",
    "devices",
}
INSPECT_KEYS = {
    "schema",
    "command",
    "status",
    "exit_code",
    "checkpoint",
    "nbytes",
    "format",
    "error",
    "globals",
    "required_globals",
    "dangerous",
    "malformed",
    "unknown",
    "unverified",
    "needs_opt_in",
    "notes",
    "safe_globals",
    "imported",
    "modes",
    "snippet",
    "torch",
    "torch_load_replaced_by",
}
MODE_KEYS = {"weights_only", "outcome", "missing", "summary"}

# What each exit code means, per subcommand ("all": every one): the contract --help must show.
EXPECTED_EXIT_CODES = {
    EXIT_OK: {
        "inspect": "loads weights-only here (with the --safe-global names given)",
        "doctor": "environment OK: torch.load does what its call site says",
        "vendor": "done, or (--check) the copy is current",
    },
    EXIT_ATTENTION: {
        "inspect": "needs action first: allowlisting the listed classes, an explicit UnsafeCallable opt-in "
        "for a needed global that is not a class, --import of the module of an UNVERIFIED class, "
        "(TorchScript, legacy .tar) a loader only for trusted files, or a link leading out of a folder (not "
        "followed); for several checkpoints, the worst code of theirs",
        "doctor": "attention: a TORCH_FORCE_* switch is active or set to a spelling torch ignores, a "
        "variable is named almost like a switch, torch.load is replaced, a bare torch.load is "
        "not weights-only, or backend autoload is off for installed backends or set to "
        "neither '0' nor '1'",
        "vendor": "--check: the copy is not current (listed)",
    },
    EXIT_DANGEROUS: {
        "inspect": "dangerous or unloadable input: a DANGEROUS or malformed global, a global this torch "
        "lacks, unreadable / truncated / not a checkpoint, a failed --import, both TORCH_FORCE_* "
        "switches set (every torch.load fails), or this torch cannot be asked what torch.load does",
        "doctor": "error: both TORCH_FORCE_* switches set (every torch.load raises RuntimeError), or this "
        "torch cannot be asked what torch.load does",
        "vendor": "not a pytorch checkout, the flagship or aggregator is missing, or a symlink (or anything but a "
        "regular file or folder) where vendor would write or remove: refused, nothing written",
    },
    EXIT_USAGE: {"all": "usage error (bad arguments, unknown subcommand)"},
}


def exit_code_blocks(help_text: str) -> dict[int, dict[str, str]]:
    """The ``exit codes:`` block of a --help text, read back: code -> {subcommand (or "all"): meaning}.

    Fails when the block is missing or twice, a code or a subcommand under one code appears
    twice, or a line belongs to no entry.
    """
    _, sep, rest = help_text.partition("\nexit codes:\n")
    assert sep, f"no exit codes block in:\n{help_text}"
    assert "\nexit codes:\n" not in rest, "two exit codes blocks"
    block = rest.split("\n\n", 1)[0].rstrip("\n").split("\n")
    shown = "\n".join(block)
    entries: list[tuple[int, str, list[str]]] = []  # (code, subcommand, lines of its meaning)
    for line in block:
        first = re.match(r"^  (\d)  (?:(\w+): +)?(\S.*)$", line)
        more = re.match(r"^ {5}(\w+): +(\S.*)$", line)
        if first:
            code = int(first.group(1))
            assert code not in {c for c, _, _ in entries}, f"exit code {code} listed twice:\n{shown}"
            entries.append((code, first.group(2) or "all", [first.group(3)]))
        elif more:
            assert entries, f"a meaning before any code:\n{shown}"
            code = entries[-1][0]
            assert more.group(1) not in {c for k, c, _ in entries if k == code}, (
                f"{more.group(1)} listed twice under exit code {code}:\n{shown}"
            )
            entries.append((code, more.group(1), [more.group(2)]))
        else:
            assert entries and line.startswith(" " * 7) and line.strip(), f"stray line {line!r} in:\n{shown}"
            entries[-1][2].append(line.strip())
    codes: dict[int, dict[str, str]] = {}
    for code, command, lines in entries:
        codes.setdefault(code, {})[command] = " ".join(lines)
    return codes


class _NotAllowlisted:
    """A class weights-only loads refuse (it is no safe global) and a full load rebuilds."""


@contextlib.contextmanager
def _switches(env: dict):
    """The two TORCH_FORCE_* switches as in *env* (absent: unset) for the block, as before after it."""
    before = {name: os.environ.get(name) for name in (FORCE_WO, FORCE_NO_WO)}
    try:
        for name in before:
            os.environ.pop(name, None)
        os.environ.update({k: v for k, v in env.items() if k in before})
        yield
    finally:
        for name, value in before.items():
            os.environ.pop(name, None)
            if value is not None:
                os.environ[name] = value


def _seed_module():
    from torch.ao.nn.sparse.quantized.dynamic.linear import Linear

    with override_qengine("qnnpack"), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # quantized tensor creation is deprecated
        w = torch.quantize_per_tensor(torch.randn(3, 16), 2.0, 0, torch.qint8)
        lin = Linear(3, 16, 1, 4, bias=True, dtype=torch.qint8)
        lin.set_weight_bias(w, torch.ones(3), 1, 4)
    return lin


class CLITestBase(unittest.TestCase):
    tmp: str

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="tst-cli-")
        cls.seed = os.path.join(cls.tmp, "seed.pt")
        torch.save(_seed_module(), cls.seed)
        cls.state_dict = os.path.join(cls.tmp, "state_dict.pt")
        torch.save({"weight": torch.randn(2, 3), "bias": torch.zeros(2), "step": torch.tensor(7)}, cls.state_dict)
        with open(cls.seed, "rb") as f:
            seed_bytes = f.read()
        cls.truncated = os.path.join(cls.tmp, "truncated.pt")
        with open(cls.truncated, "wb") as f:
            f.write(seed_bytes[: len(seed_bytes) // 3])
        cls.not_checkpoint = os.path.join(cls.tmp, "notes.txt")
        with open(cls.not_checkpoint, "w") as f:
            f.write("just some text, not a checkpoint\n")
        cls.sentinel = os.path.join(cls.tmp, "SENTINEL")
        cls.hostile = {}
        for name, data in build_all(cls.sentinel).items():
            path = os.path.join(cls.tmp, f"hostile-{name}.pt")
            with open(path, "wb") as f:
                f.write(data)
            cls.hostile[name] = path
        cls.hostile_expected = DANGEROUS_GLOBALS

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def tearDown(self):
        self.assertFalse(os.path.exists(self.sentinel), "a hostile payload ran")

    # -- running the real command ---------------------------------------------------------------

    def env(self, **switches: str) -> dict[str, str]:
        env = child_env(drop=ENV_SWITCHES)
        # Content is checked on unwrapped lines; wrapping to the terminal is TestReading's.
        env["COLUMNS"] = "10000"
        env.update(switches)
        return env

    def run_cli(self, *args: str, stdin: bytes | None = None, **switches: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "torch_serial_testing", *args],
            input=stdin,
            capture_output=True,
            cwd=self.tmp,
            env=self.env(**switches),
            timeout=300,
        )

    def run_code(self, code: str, **switches: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-c", textwrap.dedent(code)],
            capture_output=True,
            cwd=self.tmp,
            env=self.env(**switches),
            timeout=300,
        )

    def json_of(self, proc: subprocess.CompletedProcess, expect_code: int) -> dict:
        self.assertEqual(proc.returncode, expect_code, proc.stdout.decode() + proc.stderr.decode())
        report = json.loads(proc.stdout)
        self.assertEqual(report["schema"], SCHEMA_VERSION)
        self.assertEqual(report["exit_code"], expect_code)
        return report

    def text_of(self, proc: subprocess.CompletedProcess, expect_code: int) -> str:
        out = proc.stdout.decode()
        self.assertEqual(proc.returncode, expect_code, out + proc.stderr.decode())
        return out


class TestInspect(CLITestBase):
    def test_seed_module_text(self):
        out = self.text_of(self.run_cli("inspect", self.seed, "-v"), EXIT_ATTENTION)
        self.assertIn("format zip", out)
        for name in SEED_GLOBALS:
            self.assertIn(f"  {name}\n", out)
        self.assertIn(f"globals beyond torch's allowlist ({len(SEED_GLOBALS)}), found without unpickling", out)
        self.assertRegex(out, default_mode_line("rejected"))
        self.assertIn("Unsupported global", out)
        self.assertRegex(out, r"weights_only_false +unsafe: .*execute arbitrary pickle code.*never does it")
        if hasattr(torch.serialization, "safe_globals"):
            self.assertIn(f"with torch.serialization.safe_globals([{SEED_REFS}]):", out)
        else:  # torch < 2.5: the snippet registers process-wide instead of using the missing context
            self.assertIn(
                f"    torch.serialization.add_safe_globals([{SEED_REFS}])\n    obj = torch.load(f, weights_only=True)",
                out,
            )
            self.assertNotIn("with torch.serialization.safe_globals", out)
        self.assertIn("from torch.ao.nn.sparse.quantized.dynamic.linear import Linear", out)
        self.assertIn("status: NEEDS_ALLOWLIST (exit 1)", out)
        self.assertNotIn("DANGEROUS", out)

    def test_seed_module_json(self):
        r = self.json_of(self.run_cli("inspect", self.seed, "--json"), EXIT_ATTENTION)
        self.assertEqual(set(r), INSPECT_KEYS)
        self.assertEqual(r["command"], "inspect")
        self.assertEqual(r["status"], "needs_allowlist")
        self.assertEqual(r["format"], "zip")
        self.assertEqual(r["required_globals"], SEED_GLOBALS)
        self.assertTrue(set(SEED_GLOBALS) < set(r["globals"]))
        self.assertEqual((r["dangerous"], r["unknown"], r["error"]), ([], [], None))
        self.assertEqual((r["malformed"], r["needs_opt_in"], r["notes"]), ([], [], []))  # all three are classes
        self.assertEqual(r["nbytes"], os.path.getsize(self.seed))
        self.assertEqual(list(r["modes"]), list(MODES))
        for mode in r["modes"].values():
            self.assertEqual(set(mode), MODE_KEYS)
        wof, sg, default = (r["modes"][m] for m in MODES)
        self.assertEqual((wof["weights_only"], wof["outcome"]), (False, "unsafe"))
        self.assertEqual((sg["weights_only"], sg["outcome"], sg["missing"]), (True, "rejected", SEED_GLOBALS))
        default_outcome = "rejected" if TORCH_DEFAULT_WO else "unsafe"  # unsafe: a full load (< 2.6)
        self.assertEqual((default["weights_only"], default["outcome"]), (TORCH_DEFAULT_WO, default_outcome))
        self.assertTrue(default["summary"].startswith(f"{default_outcome}: "))
        self.assertIn(f"safe_globals([{SEED_REFS}])", r["snippet"])

    def test_prediction_matches_real_torch_here(self):
        # What the CLI predicts for the seed file, checked against torch.load in this (test) process.
        with self.assertRaisesRegex(pickle.UnpicklingError, "Unsupported global: GLOBAL torch.ao.nn.sparse"):
            torch.load(self.seed, weights_only=True)
        from torch.ao.nn.sparse.quantized.dynamic.linear import Linear
        from torch.ao.nn.sparse.quantized.linear import LinearPackedParams

        needed = [torch.ScriptObject, Linear, LinearPackedParams] + ([set] if SET_NEEDED else [])
        if SAFE_GLOBALS_SKIP is None:
            with override_qengine("qnnpack"), torch.serialization.safe_globals(needed):
                self.assertIsInstance(torch.load(self.seed, weights_only=True), Linear)
            return
        # A torch without the safe_globals context (< 2.5): the library's safe_globals mode skips
        # with its reason, and the allowlist the prediction rests on is checked through the
        # process-wide registry this torch does have (add_safe_globals), restored afterwards.
        self.assertFalse(hasattr(torch.serialization, "safe_globals"))
        with open(self.seed, "rb") as f:
            seed = Checkpoint.from_bytes(f.read())
        with self.assertRaises(unittest.SkipTest) as cm:
            load_modes.load(seed, "safe_globals", needed)
        self.assertEqual(str(cm.exception), SAFE_GLOBALS_SKIP)
        with override_qengine("qnnpack"), preserved_registry():
            torch.serialization.add_safe_globals(needed)
            self.assertIsInstance(torch.load(self.seed, weights_only=True), Linear)
        with self.assertRaisesRegex(pickle.UnpicklingError, "Unsupported global: GLOBAL torch.ao.nn.sparse"):
            torch.load(self.seed, weights_only=True)  # the registry is back as it was

    def test_all_three_safe_globals_from_stdin(self):
        args = ["inspect", "-", "--json"] + [a for n in SEED_GLOBALS for a in ("--safe-global", n)]
        with open(self.seed, "rb") as f:
            r = self.json_of(self.run_cli(*args, "--safe-global", "not.Needed", stdin=f.read()), EXIT_OK)
        self.assertEqual((r["checkpoint"], r["status"], r["format"]), ("-", "loads", "zip"))
        self.assertEqual(r["safe_globals"], {"given": SEED_GLOBALS + ["not.Needed"], "unused": ["not.Needed"]})
        self.assertEqual(r["modes"]["safe_globals"]["outcome"], "loads")
        # a bare torch.load still needs them where it is weights-only; before torch 2.6 it is a full load
        self.assertEqual(r["modes"]["default"]["outcome"], "rejected" if TORCH_DEFAULT_WO else "unsafe")

    def test_two_of_three_safe_globals(self):
        # All but the last needed global (two of three where torch allowlists builtins.set).
        args = [a for name in SEED_GLOBALS[:-1] for a in ("--safe-global", name)]
        out = self.text_of(self.run_cli("inspect", self.seed, "-v", *args), EXIT_ATTENTION)
        self.assertRegex(
            out, rf"safe_globals +rejected: weights_only=True explicit; not allowlisted: {SEED_GLOBALS[-1]} "
        )

    def test_state_dict_loads(self):
        out = self.text_of(self.run_cli("inspect", self.state_dict), EXIT_OK)
        self.assertIn("globals beyond torch's allowlist (0), found without unpickling: none", out)
        self.assertRegex(out, r"safe_globals +loads \(weights_only=True explicit\)")
        self.assertRegex(out, default_mode_line("loads"))
        self.assertIn("status: LOADS (exit 0)", out)

    def test_hostile_text_flagged_dangerous(self):
        name = "os_system"
        out = self.text_of(self.run_cli("inspect", self.hostile[name]), EXIT_DANGEROUS)
        expected = self.hostile_expected[name]
        self.assertRegex(out, rf"{expected} +<-- DANGEROUS: ")
        self.assertIn("status: DANGEROUS (exit 2)", out)
        self.assertNotIn("safe_globals([", out)  # never suggested
        self.assertNotIn(f"import {expected.rsplit('.', 1)[1]}", out)

    def test_every_hostile_checkpoint_and_other_formats(self):
        # One process runs cli.main on every file, with torch.load and the unpicklers booby-trapped
        # for its input: the CLI must never hand them the file (nor any record or tail of it; it does
        # hand torch its own few-byte probes), and no payload may run (the sentinel is checked in tearDown).
        ts = os.path.join(self.tmp, "scripted.pt")
        with warnings.catch_warnings():
            warnings.filterwarnings(
                "ignore", message=r"`torch\.jit\.\w+` is deprecated"
            )  # Deprecation- (2.13) or FutureWarning (2.15)
            torch.jit.script(torch.nn.Linear(2, 2)).save(ts)
        tar = os.path.join(self.tmp, "legacy.tar.pt")
        with open(tar, "wb") as f:
            f.write(legacy_tar(pickle.dumps({"epoch": 1}, protocol=2)))
        files = dict(self.hostile, torchscript=ts, legacy_tar_benign=tar)
        proc = self.run_code(
            f"""
            import contextlib, io, json, os, pickle, sys, tarfile, zipfile
            import torch
            import torch._weights_only_unpickler as wou

            # The bytes of every input, of each of its zip or tar members, and what follows any
            # position of an input file: what the CLI must never hand to a loader or unpickler.
            # (It does hand torch its own probes and canaries: those are passed through.)
            files = {files!r}
            whole, streams = set(), []
            for path in files.values():
                with open(path, "rb") as f:
                    data = f.read()
                whole.add(data)
                streams.append(data)
                try:
                    with zipfile.ZipFile(io.BytesIO(data)) as z:
                        whole.update(z.read(n) for n in z.namelist())
                except zipfile.BadZipFile:
                    pass
                try:
                    with tarfile.open(fileobj=io.BytesIO(data)) as t:
                        whole.update(t.extractfile(m).read() for m in t.getmembers() if m.isfile())
                except tarfile.TarError:
                    pass

            class Trapped(SystemExit):
                pass

            def is_input(content):
                return content in whole or (len(content) >= 16 and any(s.endswith(content) for s in streams))

            def content_of(f):
                if isinstance(f, (bytes, bytearray, memoryview)):
                    return bytes(f)
                if isinstance(f, (str, os.PathLike)):
                    with open(f, "rb") as fh:
                        return fh.read()
                try:
                    pos = f.tell()
                    rest = f.read()
                    f.seek(pos)
                except Exception:
                    raise Trapped(f"TRAPPED: a stream that cannot be looked at reached a loader: {{f!r}}")
                return bytes(rest)

            def guard(name, original, arg_index=0):
                def guarded(*a, **k):
                    source = a[arg_index] if len(a) > arg_index else next(iter(k.values()), b"")
                    if is_input(content_of(source)):
                        raise Trapped(f"TRAPPED: the CLI handed its input to {{name}}")
                    return original(*a, **k)
                return guarded

            # The library's own probes call torch's own load, captured by identity before the guards
            # go in (it never calls a replaced one); the Unpickler and pickle guards see every load.
            from torch_serial_testing.serialization import genuine
            genuine("load")
            guarded_load = guard("torch.load", torch.serialization.load)
            torch.load = torch.serialization.load = guarded_load
            torch.jit.load = guard("torch.jit.load", torch.jit.load)
            wou.Unpickler.__init__ = guard("the weights-only Unpickler", wou.Unpickler.__init__, 1)
            pickle.load = guard("pickle.load", pickle.load)
            pickle.loads = guard("pickle.loads", pickle.loads)
            from torch_serial_testing.tools import cli
            results = {{}}
            for name, path in files.items():
                out = io.StringIO()
                with contextlib.redirect_stdout(out):
                    code = cli.main(["inspect", path, "--json"])
                results[name] = (code, json.loads(out.getvalue()))
            # the traps are live: each refuses an input handed to it
            live = []
            for name, call in [("torch.load", lambda p, d: torch.load(p, weights_only=True)),
                               ("torch.serialization.load", lambda p, d: torch.serialization.load(io.BytesIO(d))),
                               ("Unpickler", lambda p, d: wou.Unpickler(io.BytesIO(d)).load()),
                               ("pickle.loads", lambda p, d: pickle.loads(d))]:
                path = files["os_system"]
                with open(path, "rb") as f:
                    d = f.read()
                with zipfile.ZipFile(io.BytesIO(d)) as z:
                    pkl = z.read(next(n for n in z.namelist() if n.endswith("data.pkl")))
                try:
                    call(path, pkl if name in ("Unpickler", "pickle.loads") else d)
                except Trapped:
                    live.append(name)
            print(json.dumps({{"results": results, "live": live}}))
            """
        )
        self.assertEqual(proc.returncode, 0, proc.stderr.decode())
        report = json.loads(proc.stdout)
        self.assertEqual(report["live"], ["torch.load", "torch.serialization.load", "Unpickler", "pickle.loads"])
        results = report["results"]
        for name in self.hostile:
            code, r = results[name]
            with self.subTest(name):
                self.assertEqual(code, EXIT_DANGEROUS, r)
                self.assertIn(r["status"], ("dangerous", "unloadable"))
                flagged = {d["name"] for d in r["dangerous"] + r["malformed"] + r["unknown"]}
                self.assertIn(self.hostile_expected[name], flagged)
                self.assertIsNone(r["snippet"])
                self.assertNotEqual(r["modes"]["safe_globals"]["outcome"], "loads")
        code, r = results["torchscript"]
        self.assertEqual((code, r["status"], r["format"]), (EXIT_ATTENTION, "needs_trusted_loader", "torchscript"))
        self.assertIn("torch.jit.load", r["modes"]["default"]["summary"])
        code, r = results["legacy_tar_benign"]
        self.assertEqual((code, r["status"], r["format"]), (EXIT_ATTENTION, "needs_trusted_loader", "tar"))
        self.assertIn("legacy .tar", r["modes"]["safe_globals"]["summary"])

    def test_truncated_and_not_a_checkpoint(self):
        proc = self.run_cli("inspect", self.truncated)
        self.assertEqual(self.text_of(proc, EXIT_DANGEROUS), "")  # an error report: stderr only
        self.assertIn("truncated", proc.stderr.decode())
        r = self.json_of(self.run_cli("inspect", self.not_checkpoint, "--json"), EXIT_DANGEROUS)
        self.assertEqual((r["status"], r["format"]), ("unreadable", None))
        self.assertIn("not a torch checkpoint", r["error"])

    def test_missing_file_error_is_printed_once(self):
        proc = self.run_cli("inspect", "nope.pt")
        self.assertEqual(proc.returncode, EXIT_DANGEROUS)
        self.assertEqual(proc.stdout, b"")
        err = proc.stderr.decode()
        self.assertEqual(err.count("cannot read 'nope.pt'"), 1, err)
        self.assertEqual(err.count("No such file or directory"), 1, err)
        self.assertIn("status: UNREADABLE (exit 2)", err)

    def test_force_switches_change_the_predictions(self):
        proc = self.run_code(
            f"""
            import contextlib, io, json, os
            from torch_serial_testing.tools import cli
            results = {{}}
            for name, env in [("force", {{"TORCH_FORCE_WEIGHTS_ONLY_LOAD": "1"}}),
                              ("force_no", {{"TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD": "yes"}}),
                              ("both", {{"TORCH_FORCE_WEIGHTS_ONLY_LOAD": "true", "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD": "y"}})]:
                for k in {list(ENV_VARS)!r}:
                    os.environ.pop(k, None)
                os.environ.update(env)
                out = io.StringIO()
                with contextlib.redirect_stdout(out):
                    code = cli.main(["inspect", {self.state_dict!r}, "--json"])
                results[name] = (code, json.loads(out.getvalue()))
            print(json.dumps(results))
            """
        )
        self.assertEqual(proc.returncode, 0, proc.stderr.decode())
        results = json.loads(proc.stdout)
        code, r = results["force"]  # weights_only=False is overridden: even that mode runs weights-only
        self.assertEqual(code, EXIT_OK)
        self.assertEqual(
            (r["modes"]["weights_only_false"]["weights_only"], r["modes"]["weights_only_false"]["outcome"]),
            (True, "loads"),
        )
        self.assertIn(
            "forced by TORCH_FORCE_WEIGHTS_ONLY_LOAD=1 over explicit weights_only=False",
            r["modes"]["weights_only_false"]["summary"],
        )
        code, r = results["force_no"]  # the bare default now fully unpickles; explicit True still obeyed
        self.assertEqual(code, EXIT_OK)
        self.assertEqual((r["modes"]["default"]["weights_only"], r["modes"]["default"]["outcome"]), (False, "unsafe"))
        if TORCH_READS_FORCE_NO:
            self.assertIn("forced by TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=yes", r["modes"]["default"]["summary"])
            self.assertIn("torch warns", r["modes"]["default"]["summary"])
        else:  # ignored by this torch: the bare load is a full one by torch's own default, silently
            self.assertEqual(TORCH_DEFAULT_WO, False)
            self.assertIn(f"weights_only=False {TORCH_DEFAULT_WHY}", r["modes"]["default"]["summary"])
            self.assertNotIn("torch warns", r["modes"]["default"]["summary"])
        self.assertEqual(r["modes"]["safe_globals"]["outcome"], "loads")
        code, r = results["both"]
        if TORCH_READS_FORCE_NO:
            self.assertEqual((code, r["status"]), (EXIT_DANGEROUS, "environment_error"))
            self.assertEqual({m["outcome"] for m in r["modes"].values()}, {"error"})
            self.assertIn("RuntimeError", r["modes"]["default"]["summary"])
        else:  # torch < 2.6 ignores the second switch: every mode is forced weights-only, and loads
            self.assertEqual((code, r["status"]), (EXIT_OK, "loads"))
            self.assertEqual({(m["weights_only"], m["outcome"]) for m in r["modes"].values()}, {(True, "loads")})
            self.assertIn(
                "forced by TORCH_FORCE_WEIGHTS_ONLY_LOAD=true over explicit weights_only=False",
                r["modes"]["weights_only_false"]["summary"],
            )


class TestTorchThatCannotBeAsked(CLITestBase):
    def test_predictions_become_unknown_never_a_guess(self):
        # torch's weights-only unpickler broken (a stand-in raising OSError): the library's probes
        # cannot run, so no weights-only outcome is claimed -- each says why, and the exit code is 2.
        proc = self.run_code(
            f"""
            import contextlib, io, json, os
            import torch._weights_only_unpickler as wou

            def broken(self):
                raise OSError("the weights-only unpickler is broken here")

            wou.Unpickler.load = broken
            from torch_serial_testing.tools import cli
            results = {{}}
            for name, args in [("state_dict", ["inspect", {self.state_dict!r}, "--json"]),
                               ("seed", ["inspect", {self.seed!r}, "--json"]),
                               ("doctor", ["doctor", "--json"]), ("doctor_text", ["doctor"])]:
                os.environ.pop("{FORCE_WO}", None)
                if name.startswith("doctor"):
                    os.environ["{FORCE_WO}"] = "1"
                out = io.StringIO()
                with contextlib.redirect_stdout(out):
                    code = cli.main(args)
                results[name] = (code, out.getvalue())
            print(json.dumps(results))
            """
        )
        self.assertEqual(proc.returncode, 0, proc.stderr.decode())
        results = json.loads(proc.stdout)
        why = "the weights-only unpickler is broken here"
        for name in ("state_dict", "seed"):
            code, out = results[name]
            r = json.loads(out)
            with self.subTest(name):
                self.assertEqual((code, r["exit_code"]), (EXIT_DANGEROUS, EXIT_DANGEROUS))
                # (the seed's names are judged without this torch's renames: what is left unjudged stays DANGEROUS)
                self.assertEqual(r["status"], "environment_error" if not r["dangerous"] else "dangerous")
                if name == "state_dict":
                    self.assertEqual((r["status"], r["required_globals"]), ("environment_error", []))
                self.assertTrue(r["error"].startswith("cannot predict what torch.load does here: "), r["error"])
                self.assertIn(why, r["error"])
                # the weights-only modes here (a bare load is a full one before torch 2.6: asked, and unsafe)
                for mode in ("safe_globals", "default") if TORCH_DEFAULT_WO else ("safe_globals",):
                    m = r["modes"][mode]
                    self.assertEqual((m["outcome"], m["weights_only"]), ("error", None), m)
                    self.assertTrue(m["summary"].startswith("error: cannot predict this load here ("), m["summary"])
                    self.assertIn(why, m["summary"])
                    self.assertNotIn("not allowlisted", m["summary"])
                self.assertIsNone(r["snippet"])
                # an explicit weights_only=False load is a full one whatever the unpickler: still asked, still unsafe
                self.assertEqual(r["modes"]["weights_only_false"]["outcome"], "unsafe")
                if not TORCH_DEFAULT_WO:
                    self.assertEqual(
                        (r["modes"]["default"]["outcome"], r["modes"]["default"]["weights_only"]), ("unsafe", False)
                    )
        code, out = results["doctor"]
        r = json.loads(out)
        self.assertEqual((code, r["status"]), (EXIT_DANGEROUS, "error"))
        wo = r["default_weights_only"]
        # (TORCH_FORCE_WEIGHTS_ONLY_LOAD=1 makes the bare load weights-only: unknown; torch's own default
        # is unknown where it is weights-only, and known -- a full load -- before torch 2.6)
        self.assertEqual((wo["value"], wo["torch_default"]), (None, None if TORCH_DEFAULT_WO else False))
        self.assertTrue(wo["reason"].startswith("unknown: ") and why in wo["reason"], wo)
        if TORCH_DEFAULT_WO:
            self.assertTrue(wo["torch_default_reason"].startswith("unknown: "), wo)
        else:
            self.assertEqual(wo["torch_default_reason"], TORCH_DEFAULT_WHY)
        self.assertEqual(r["problems"][0], f"cannot tell what torch.load does here: {wo['reason'][len('unknown: ') :]}")
        force = r["environment"][FORCE_WO]
        self.assertEqual((force["raw"], force["value"]), ("1", None))
        self.assertIn(f"unknown: this torch cannot be asked how it reads {FORCE_WO}", force["effect"])
        code, out = results["doctor_text"]
        self.assertEqual(code, EXIT_DANGEROUS)
        self.assertIn("bare torch.load(f): UNKNOWN -- unknown: ", out)
        self.assertIn("status: ERROR (exit 2)", out)


class TestUsage(CLITestBase):
    def test_usage_errors_exit_3(self):
        for args in ([], ["bogus"], ["inspect"], ["doctor", "--bogus"], ["inspect", self.seed, "--safe-global"]):
            with self.subTest(args=args):
                proc = self.run_cli(*args)
                self.assertEqual(proc.returncode, EXIT_USAGE, proc.stderr.decode())
                self.assertIn("usage: python -m torch_serial_testing", proc.stderr.decode())
                self.assertIn("error:", proc.stderr.decode())
                self.assertEqual(proc.stdout, b"")

    def test_version(self):
        from torch_serial_testing import __version__

        proc = self.run_cli("--version")
        self.assertEqual(
            (proc.returncode, proc.stdout.decode(), proc.stderr), (0, f"torch_serial_testing {__version__}\n", b"")
        )
        self.assertRegex(__version__, r"^\d+\.\d+\.\d+")
        self.assertIn("--version", self.text_of(self.run_cli("--help"), 0))

    def test_help_documents_exit_codes_and_json_keys(self):
        top = self.text_of(self.run_cli("--help"), 0)
        self.assertIn("doctor", top)
        self.assertIn("3  usage error", top)
        # One table (cli/contract.py) gives every --help its exit codes: each code once, each
        # subcommand's meaning once under it (argparse's old copy listed "1" twice, with two texts).
        self.assertEqual(EXIT_CODES, EXPECTED_EXIT_CODES)  # the one table the codes are returned by
        self.assertEqual(exit_code_blocks(top), EXPECTED_EXIT_CODES)
        for command in ("doctor", "inspect", "vendor"):
            with self.subTest(command=command):
                text = self.text_of(self.run_cli(command, "--help"), 0)
                self.assertEqual(
                    exit_code_blocks(text),
                    {
                        code: {c: t for c, t in meanings.items() if c in (command, "all")}
                        for code, meanings in EXPECTED_EXIT_CODES.items()
                    },
                )
        doctor = self.text_of(self.run_cli("doctor", "--help"), 0)
        for key in DOCTOR_KEYS | {"TORCH_DEVICE_BACKEND_AUTOLOAD", "TORCH_AUTOGRAD_SHUTDOWN_WAIT_LIMIT"}:
            self.assertIn(key, doctor)
        inspect = self.text_of(self.run_cli("inspect", "--help"), 0)
        for key in INSPECT_KEYS | MODE_KEYS | {"--safe-global", "CHECKPOINT", "needs_allowlist"}:
            self.assertIn(key, inspect)
        for key in DOCTOR_KEYS | INSPECT_KEYS:
            self.assertIn(f"``{key}``", contract.__doc__)


class TestDoctor(CLITestBase):
    def test_clean_environment_text(self):
        out = self.text_of(self.run_cli("doctor"), self._clean_code())
        self.assertIn(f"torch {torch.__version__}", out)
        self.assertIn("torch.load: torch's own", out)
        self.assertIn(
            f"bare torch.load(f): weights_only={TORCH_DEFAULT_WO} -- torch's default {TORCH_DEFAULT_WHY}", out
        )
        if not TORCH_DEFAULT_WO:  # why the clean doctor asks for attention before torch 2.6
            self.assertIn(
                f"a bare torch.load is weights_only=False here ({TORCH_DEFAULT_WHY}): it fully unpickles", out
            )
        for name in ENV_SWITCHES:
            self.assertIn(f"  {name}=unset\n", out)
        self.assertIn("waits up to 10 s", out)
        self.assertIn(f"(current: {torch.backends.quantized.engine})", out)
        self.assertIn("devices: cpu", out)

    def _clean_code(self) -> int:
        import importlib.metadata as md

        eps = md.entry_points()  # Python 3.9: a dict of group -> entry points, no select()
        if list(eps.select(group="torch.backends") if hasattr(eps, "select") else eps.get("torch.backends", ())):
            self.skipTest("an out-of-tree backend is installed; a clean doctor is not expected here")
        # A bare torch.load that fully unpickles (torch < 2.6) is itself a reason for attention.
        return EXIT_OK if TORCH_DEFAULT_WO else EXIT_ATTENTION

    def test_json_and_imports_nothing_beyond_torch(self):
        proc = self.run_code(
            """
            import contextlib, io, json, sys
            import torch
            before = set(sys.modules)
            from torch_serial_testing.tools import cli
            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                code = cli.main(["doctor", "--json"])
            print(json.dumps({"code": code, "report": json.loads(out.getvalue()),
                              "new_modules": sorted(set(sys.modules) - before)}))
            """
        )
        self.assertEqual(proc.returncode, 0, proc.stderr.decode())
        result = json.loads(proc.stdout)
        new = result["new_modules"]
        # doctor asks torch by saving and loading a canary object of its own: what torch imports
        # for one plain save and load (its serialization config, lazily) is torch's, not the CLI's.
        plain = self.run_code(
            """
            import io, json, sys
            import torch
            before = set(sys.modules)
            buf = io.BytesIO()
            torch.serialization.save({"x": 1}, buf)
            torch.serialization.load(io.BytesIO(buf.getvalue()), weights_only=True)
            torch.serialization.load(io.BytesIO(buf.getvalue()), weights_only=False)
            print(json.dumps(sorted(set(sys.modules) - before)))
            """
        )
        self.assertEqual(plain.returncode, 0, plain.stderr.decode())
        by_save_and_load = set(json.loads(plain.stdout))
        # torch itself may import numpy (when installed) and parts of torch.testing._internal;
        # the CLI must add none of that, nor any test machinery.
        banned = ("numpy", "torch.testing", "expecttest", "parameterized", "unittest.mock", "pytest")
        self.assertEqual([m for m in new if m.startswith(banned)], [], new)
        self.assertEqual([m for m in new if m.startswith("torch.") and m not in by_save_and_load], [], new)
        r = result["report"]
        self.assertEqual(result["code"], r["exit_code"])
        self.assertEqual(set(r), DOCTOR_KEYS)
        self.assertEqual((r["schema"], r["command"]), (SCHEMA_VERSION, "doctor"))
        self.assertEqual(set(r["environment"]), set(ENV_SWITCHES))
        for entry in r["environment"].values():
            self.assertEqual(set(entry), {"raw", "value", "effect"})
        self.assertEqual(r["torch"]["version"], torch.__version__)
        self.assertEqual(r["torch"]["git_version"], torch.version.git_version)
        self.assertEqual(r["default_weights_only"]["value"], TORCH_DEFAULT_WO)
        self.assertEqual(r["quantized_engines"]["current"], torch.backends.quantized.engine)
        self.assertIn("qnnpack", r["quantized_engines"]["supported"])
        self.assertEqual(r["devices"]["available"][0], "cpu")
        self.assertIsNone(r["torch_load_replaced_by"])
        self.assertEqual(r["safe_globals"], sorted(r["safe_globals"]))

    def test_force_weights_only(self):
        r = self.json_of(
            self.run_cli(
                "doctor",
                "--json",
                TORCH_FORCE_WEIGHTS_ONLY_LOAD="1",
                TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD="on",
                TORCH_AUTOGRAD_SHUTDOWN_WAIT_LIMIT="2.5",
            ),
            EXIT_ATTENTION,
        )
        self.assertEqual(r["status"], "attention")
        force, force_no = r["environment"][FORCE_WO], r["environment"][FORCE_NO_WO]
        self.assertEqual((force["raw"], force["value"]), ("1", True))
        self.assertIn("even where the call site passes weights_only=False", force["effect"])
        self.assertEqual((force_no["raw"], force_no["value"]), ("on", False))  # not a spelling torch reads
        self.assertIn("ignored", force_no["effect"])  # (and torch < 2.6 does not read the switch at all)
        self.assertEqual(r["default_weights_only"]["value"], True)
        self.assertIn("forced by TORCH_FORCE_WEIGHTS_ONLY_LOAD=1", r["default_weights_only"]["reason"])
        wait = r["environment"][WAIT_LIMIT]
        self.assertEqual(wait["value"], 2.5)
        self.assertIn("waits up to 2.5 s", wait["effect"])
        self.assertEqual(len(r["problems"]), 2, r["problems"])

    def test_force_no_weights_only(self):
        proc = self.run_cli("doctor", TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD="yes", TORCH_AUTOGRAD_SHUTDOWN_WAIT_LIMIT="-1")
        out = self.text_of(proc, EXIT_ATTENTION)
        self.assertIn("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD='yes'", out)
        if TORCH_READS_FORCE_NO:
            self.assertIn(
                "bare torch.load(f): weights_only=False -- forced by TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=yes", out
            )
            self.assertIn("UserWarning", out)
            self.assertIn("explicit weights_only=True/False is obeyed", out)
        else:  # torch < 2.6 does not read the switch: torch's own default applies, and the switch is flagged
            self.assertIn(
                f"bare torch.load(f): weights_only={TORCH_DEFAULT_WO} -- torch's default {TORCH_DEFAULT_WHY}", out
            )
            self.assertIn("ignored: this torch's torch.load does not read it", out)
            self.assertNotIn("UserWarning", out)
        self.assertIn("does not wait for autograd worker threads", out)
        self.assertIn("status: ATTENTION (exit 1)", out)

    def test_both_force_switches_is_an_error(self):
        proc = self.run_cli(
            "doctor", "--json", TORCH_FORCE_WEIGHTS_ONLY_LOAD="true", TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD="y"
        )
        if not TORCH_READS_FORCE_NO:
            # torch < 2.6 ignores TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD: no error, TORCH_FORCE_WEIGHTS_ONLY_LOAD rules.
            r = self.json_of(proc, EXIT_ATTENTION)
            self.assertEqual(r["status"], "attention")
            self.assertIs(r["default_weights_only"]["value"], True)
            self.assertIn("forced by TORCH_FORCE_WEIGHTS_ONLY_LOAD=true", r["default_weights_only"]["reason"])
            self.assertEqual(
                (r["environment"][FORCE_WO]["value"], r["environment"][FORCE_NO_WO]["value"]), (True, False)
            )
            self.assertIn("ignored", r["environment"][FORCE_NO_WO]["effect"])
            return
        r = self.json_of(proc, EXIT_DANGEROUS)
        self.assertEqual(r["status"], "error")
        self.assertIsNone(r["default_weights_only"]["value"])
        self.assertIn("RuntimeError", r["default_weights_only"]["reason"])
        self.assertTrue(r["environment"][FORCE_WO]["value"] and r["environment"][FORCE_NO_WO]["value"])
        self.assertIn("both set", r["problems"][0])

    def test_misspelled_switch_names_need_attention(self):
        r = self.json_of(
            self.run_cli("doctor", "--json", TORCH_FORCE_WEIGHTS_ONLY="1", torch_force_no_weights_only_load="1"),
            EXIT_ATTENTION,
        )
        self.assertEqual(r["status"], "attention")
        self.assertEqual(r["environment"][FORCE_WO]["raw"], None)  # the real switches are unset
        self.assertEqual(r["default_weights_only"]["value"], TORCH_DEFAULT_WO)  # and have no effect
        near = [p for p in r["problems"] if "is not a switch torch reads" in p]
        self.assertEqual(
            near,
            [
                "TORCH_FORCE_WEIGHTS_ONLY='1' is not a switch torch reads: did you mean TORCH_FORCE_WEIGHTS_ONLY_LOAD? "
                "(torch reads only the exact name TORCH_FORCE_WEIGHTS_ONLY_LOAD; TORCH_FORCE_WEIGHTS_ONLY has no effect)",
                "torch_force_no_weights_only_load='1' is not a switch torch reads: did you mean "
                "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD? (torch reads only the exact name TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD; "
                "torch_force_no_weights_only_load has no effect)",
            ],
        )

    def test_bare_load_is_what_torch_load_does(self):
        # doctor's default_weights_only (value, warns) for a switch setting is what a bare
        # torch.load does under it: refused weights-only (True), fully unpickled (False; warned or
        # not), or RuntimeError for every load (None) -- checked here against torch itself.
        from torch_serial_testing.tools.cli.doctor import doctor_report

        buf = io.BytesIO()
        torch.save(_NotAllowlisted(), buf)
        settings = [
            {},
            {FORCE_WO: "1"},
            {FORCE_WO: "0"},
            {FORCE_WO: "TRUE"},
            {FORCE_WO: "on"},
            {FORCE_NO_WO: "1"},
            {FORCE_NO_WO: "yes"},
            {FORCE_NO_WO: "off"},
            {FORCE_NO_WO: " 1 "},
            {FORCE_WO: "true", FORCE_NO_WO: "y"},
            {FORCE_WO: "0", FORCE_NO_WO: "1"},
        ]
        for env in settings:
            with self.subTest(env=env):
                with _switches(env), warnings.catch_warnings(record=True) as seen:
                    warnings.simplefilter("always")
                    try:
                        loaded = torch.serialization.load(io.BytesIO(buf.getvalue()))
                    except pickle.UnpicklingError:
                        torch_did = True
                    except RuntimeError:
                        torch_did = None
                    else:
                        self.assertIsInstance(loaded, _NotAllowlisted)
                        torch_did = False
                    try:  # an explicit weights_only=False refused: TORCH_FORCE_WEIGHTS_ONLY_LOAD acts
                        torch.serialization.load(io.BytesIO(buf.getvalue()), weights_only=False)
                    except pickle.UnpicklingError:
                        forced_wo = True
                    except RuntimeError:
                        forced_wo = None
                    else:
                        forced_wo = False
                warned = any(FORCE_NO_WO in str(w.message) for w in seen)
                wo = doctor_report(dict(env))["default_weights_only"]
                self.assertEqual((wo["value"], wo["warns"]), (torch_did, warned), wo)
                self.assertEqual(
                    (wo["torch_default"], wo["torch_default_reason"]), (TORCH_DEFAULT_WO, TORCH_DEFAULT_WHY)
                )
                if torch_did is None:
                    self.assertIsNone(forced_wo)
                    reason = "both TORCH_FORCE_* switches are set: every torch.load raises RuntimeError"
                elif forced_wo:
                    reason = f"forced by {FORCE_WO}={env[FORCE_WO]}"
                elif warned:
                    reason = f"forced by {FORCE_NO_WO}={env[FORCE_NO_WO]} (torch warns)"
                else:
                    reason = f"torch's default {TORCH_DEFAULT_WHY}"
                self.assertEqual(wo["reason"], reason)

    def test_near_miss_names_and_no_false_alarms(self):
        from torch_serial_testing.tools.cli.doctor import near_miss_switches

        typos = {
            "TORCH_FORCE_WEIGHTS_ONLY": FORCE_WO,
            "TORCH_FORCE_WEIGHT_ONLY_LOAD": FORCE_WO,
            "PYTORCH_FORCE_WEIGHTS_ONLY_LOAD": FORCE_WO,
            "TORCH_FORCE_NO_WEIGHTS_ONLY": FORCE_NO_WO,
            "TORCH_FORCE_NO_WEIGHT_ONLY_LOAD": FORCE_NO_WO,
            "TORCH_DEVICE_BACKEND_AUTO_LOAD": AUTOLOAD,
            "TORCH_AUTOGRAD_SHUTDOWN_WAIT": WAIT_LIMIT,
            "torch_force_weights_only_load": FORCE_WO,
        }
        self.assertEqual(near_miss_switches(dict.fromkeys(typos, "1")), sorted(typos.items()))
        # The real switches, and variables torch (or this library) reads for other things, are not typos.
        real = [
            *ENV_VARS,
            "TORCH_HOME",
            "TORCH_LOGS",
            "TORCH_SERIAL_TESTING_REPORT",
            "TORCH_ELASTIC_SHUTDOWN_TIMEOUT",
            "PYTORCH_SINK_WAITS_LIMIT",
            "TORCH_BISECT_BACKEND",
            "TORCH_COMPILE_BACKEND",
            "TORCH_USE_RTLD_GLOBAL",
            "TORCH_DOCTEST_DATALOADER",
            "PYTORCH_TESTING_DEVICE_ONLY_FOR",
            "TORCH_SHOW_CPP_STACKTRACES",
        ]
        self.assertEqual(near_miss_switches(dict.fromkeys(real, "1")), [])

    def test_backend_autoload_disabled(self):
        code = self._clean_code()
        r = self.json_of(self.run_cli("doctor", "--json", TORCH_DEVICE_BACKEND_AUTOLOAD="0"), code)
        auto = r["environment"][AUTOLOAD]
        self.assertEqual((auto["raw"], auto["value"]), ("0", False))
        self.assertIn("disabled", auto["effect"])
        self.assertIn("no effect", auto["effect"])  # nothing installed in group torch.backends
        self.assertEqual(r["backend_entry_points"], [])
        self.assertEqual(r["status"], "ok" if code == EXIT_OK else "attention")


if __name__ == "__main__":
    unittest.main()
