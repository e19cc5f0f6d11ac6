"""README.rst and docs/ are executable documentation: every example runs, the commands match CI,
the API is complete, the site builds without warnings and carries no development history."""

import collections
import csv
import glob
import os
import re
import subprocess
import sys
import tempfile
import textwrap
import unittest
import xml.etree.ElementTree as ET

import torch

import torch_serial_testing
from test.helpers.torch_trust import torch_takes_named_entries
from test.helpers.roundtrip_fixtures import DEFAULT_WEIGHTS_ONLY, MODE_SKIPS, MODULE_GLOBALS, default_outcome
from test.helpers.python_compat import verbose_ids, warnings_by_test
from test.helpers.example_twins import QDYNAMIC_TWIN, TINYNET_TWIN
from test.helpers.subprocess_env import child_env
from test.audit.runs import BEFORE_THE_DEFAULT
from test.ports._instantiate import PYTORCH_COPIES_METHODS, pytorch_subclasses_the_generic_class

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = os.path.join(ROOT, "docs")
EXAMPLES = os.path.join(DOCS, "examples")
# The pages of the site (docs/<name>.rst); the toctree of index.rst lists every other one.
PAGES = (
    "index",
    "quickstart",
    "tutorial",
    "howto-declarations",
    "howto-generated-tests",
    "howto-subclasses",
    "howto-fresh-interpreter",
    "howto-torchscript-export",
    "howto-distributed",
    "howto-porting",
    "howto-vendoring",
    "howto-devices",
    "howto-cli",
    "reference",
    "security",
    "prediction",
    "compatibility",
    "benchmarks",
    "audit",
    "composition",
    "changelog",
)


def read(*parts):
    with open(os.path.join(ROOT, *parts), encoding="utf-8") as fh:
        return fh.read()


def readme():
    return read("README.rst")


def page(name):
    return read("docs", f"{name}.rst")


def example(name):
    """A documentation example: docs/examples/NAME.py, the file the pages include."""
    return read("docs", "examples", f"{name}.py")


# The golden record of the TinyNet example pins the required globals of torch >= 2.6; before 2.6
# the record also holds builtins.set.  Where the suite runs it, it pins this torch's record.
TINYNET_RECORD = '"""\\\ntest_tinynet.TinyNet\n"""'


def tinynet_for_this_torch(source):
    needed = sorted(["test_tinynet.TinyNet", *MODULE_GLOBALS])
    assert source.count(TINYNET_RECORD) == 1, "the TinyNet example's golden record changed"
    return source.replace(TINYNET_RECORD, '"""\\\n' + "".join(f"{g}\n" for g in needed) + '"""')


def export_rewrites_code():
    """Why the example's torch.export round trip cannot pass here, or None: torch 2.4's serializer writes a positional
    argument back as a keyword, and ``round_trip_export`` compares the graph code exactly (it fails naming ['code'])."""
    from test.paths.test_export import code_after_torchs_own_round_trip, program

    if code_after_torchs_own_round_trip() != program().graph_module.code:
        return (
            f"torch {torch.__version__}'s torch.export.load changes the graph code (positional arguments as keywords)"
        )
    return None


def code_blocks(text, language):
    pattern = re.compile(r"^\.\. code-block:: %s\n\n((?:(?:   .*)?\n)+)" % language, re.M)
    return [textwrap.dedent(m.group(1)) for m in pattern.finditer(text)]


def run_example(name, source, script=False, env=None, keep=None):
    """Write a README example to a fresh directory as NAME.py and run it with ``unittest -v``, as on
    a developer's machine: without ``CI``, under which pytorch's ``run_tests`` also writes JUnit XML
    (:meth:`TestExamples.test_pytorch_idiom_example_reports_junit_as_in_pytorch_ci` runs it so).
    *env* adds variables; *keep(folder)* is called before the folder is removed."""
    with tempfile.TemporaryDirectory() as d:
        with open(os.path.join(d, f"{name}.py"), "w") as fh:
            fh.write(source)
        args = [f"{name}.py", "-v"] if script else ["-m", "unittest", name, "-v"]
        proc = subprocess.run(
            [sys.executable, *args],
            cwd=d,
            env=child_env(env, drop=("TORCH_FORCE_", "EXPECTTEST_", "CI")),
            capture_output=True,
            text=True,
        )
        if keep is not None:
            keep(d)
        return proc


def assert_warnings_as_in_twin(test, name, proc, twin_source):
    """*proc* (a README example run with ``unittest -v``) shows exactly the warnings its plain
    twin shows: each in the same test, at the same location, as often."""
    twin = run_example(name, twin_source.format(default_weights_only=DEFAULT_WEIGHTS_ONLY))
    test.assertEqual(twin.returncode, 0, twin.stderr)
    test.assertEqual(verbose_ids(proc.stderr), verbose_ids(twin.stderr))  # the same tests, in the same order
    shown = warnings_by_test(proc.stderr)
    test.assertEqual(shown, warnings_by_test(twin.stderr), proc.stderr)
    # none of them raised by the library itself
    test.assertNotIn(os.sep + "torch_serial_testing" + os.sep, "".join(w for ws in shown.values() for w in ws))


class TestExamples(unittest.TestCase):
    """The examples of README and docs: complete files, run as the pages say."""

    def test_complete_example_runs(self):
        proc = run_example("test_tinynet", tinynet_for_this_torch(example("test_tinynet")))
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertIn("Ran 13 tests", proc.stderr)
        # @no_round_trip_dims: one test_required_globals, with neither a mode nor an engine
        self.assertEqual(
            re.findall(r"^(test_required_globals\w*) \(", proc.stderr, re.M), ["test_required_globals_cpu"]
        )
        # Warnings exactly as in the same tests without the library (none from torch 2.6 on; before,
        # torch's FutureWarning of a bare torch.load, shown once).
        assert_warnings_as_in_twin(self, "test_tinynet", proc, TINYNET_TWIN)
        # Two full-module default round trips: rejected where a bare torch.load is weights-only;
        # two state_dict default round trips: loaded everywhere.
        rejected = 2 if DEFAULT_WEIGHTS_ONLY else 0
        self.assertEqual(proc.stderr.count("default: rejected as expected"), rejected, proc.stderr)
        self.assertEqual(proc.stderr.count("default: loaded as expected"), 4 - rejected, proc.stderr)
        # ... with the exact summaries for this torch (both the same before torch 2.6).
        needed = sorted(["test_tinynet.TinyNet", *MODULE_GLOBALS])
        full, state_dict = default_outcome(needed), default_outcome([])
        for summary, count in collections.Counter([full, full, state_dict, state_dict]).items():
            self.assertEqual(proc.stderr.count(summary), count, proc.stderr)
        self.assertIn("test_round_trip_fbgemm_default_cpu (test_tinynet.TestTinyNetCPU", proc.stderr)

    def test_complete_example_as_a_script_keeps_its_golden_record(self):
        # README says: python test_tinynet.py -v.  The file ends with unittest.main(), so it runs
        # its tests (not nothing, exit 0) and records its classes under the file's module name.
        source = example("test_tinynet")
        self.assertIn('\nif __name__ == "__main__":\n    unittest.main()\n', source)
        proc = run_example("test_tinynet", tinynet_for_this_torch(source), script=True)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertIn("Ran 13 tests", proc.stderr)
        self.assertIn("test_required_globals_cpu (__main__.TestTinyNetCPU", proc.stderr)

    def test_fuller_example_is_the_tested_file(self):
        # The README's first test is the tutorial's last file (test/test_tutorial.py); the fuller
        # example, with engines and a state_dict round trip, is on the generated tests' page.
        self.assertIn(".. literalinclude:: examples/test_tinynet.py\n", page("howto-generated-tests"))

    def test_quantized_example_compares_with_allow_subclasses(self):
        source = example("test_qdynamic")
        self.assertIn(".. literalinclude:: examples/test_qdynamic.py\n", page("howto-declarations"))
        proc = run_example("test_qdynamic", source)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertIn("Ran 6 tests", proc.stderr)
        # unittest -v output: outcomes, and exactly the warnings the same tests show without the library
        # (torch's TypedStorage deprecation, once, where torch 2.13 shows it)
        assert_warnings_as_in_twin(self, "test_qdynamic", proc, QDYNAMIC_TWIN)
        if "qnnpack" not in torch_serial_testing.supported_qengines():
            return
        # The option is what makes it pass: without it, the qnnpack tests that load fail as the docs say.
        strict = source.replace(
            "self.assertRoundTripEqual(original, loaded, allow_subclasses=True)",
            "self.assertRoundTripEqual(original, loaded)",
        )
        self.assertNotEqual(strict, source)
        proc = run_example("test_qdynamic", strict)
        loading = 2 - (1 if "safe_globals" in MODE_SKIPS else 0) - (0 if DEFAULT_WEIGHTS_ONLY else -1)
        skipped = 2 * len(MODE_SKIPS)  # a load mode this torch lacks, for each engine
        self.assertIn(f"FAILED (failures={loading}" + (f", skipped={skipped})" if skipped else ")"), proc.stderr)
        mismatch = (
            "round trip mismatch at .state_dict()['_packed_params._packed_params'][1]: tensor class "
            "Tensor != expected Parameter"
        )
        self.assertIn(mismatch, proc.stderr)
        self.assertIn("tensor class Tensor != expected Parameter``", page("howto-declarations"))  # as the page says

    def test_every_example_file_runs_as_a_script(self):
        # Every docs/examples/*.py is a complete file that exits 0 (OK, skips allowed) when run as
        # ``python FILE -v`` from a folder of its own, with the library only on the import path.
        # (the multi-rank example starts rank processes: test/paths/test_distributed.py::TestTheHowToFile
        # runs it, and checks the tests it makes against the page's list)
        names = sorted(
            os.path.basename(p)
            for p in glob.glob(os.path.join(EXAMPLES, "*.py"))
            if os.path.basename(p) != "test_sharded_checkpoints.py"
        )
        self.assertIn("test_tinynet.py", names)
        # (what two examples show exists only on newer torch: the audit finds the 2.6 default's failures,
        # and pytorch's own instantiation subclasses the generic class since torch 2.5)
        needs = {"audit_run.py": BEFORE_THE_DEFAULT}
        if not pytorch_subclasses_the_generic_class():
            needs["pytorch_composition.py"] = PYTORCH_COPIES_METHODS
        if reason := export_rewrites_code():
            needs["test_torchscript_export.py"] = reason
        if not (torch_takes_named_entries() and hasattr(torch.serialization, "safe_globals")):
            needs["numpy1_checkpoint.py"] = f"torch {torch.__version__} lacks safe_globals or (obj, name) entries"
        for name in names:
            with self.subTest(example=name):
                if needs.get(name):
                    self.skipTest(needs[name])
                source = example(name[:-3])
                if name == "test_tinynet.py":
                    source = tinynet_for_this_torch(source)
                proc = run_example(name[:-3], source, script=True)
                self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
                if re.search(r"^Ran \d+ tests? in ", proc.stderr, re.M):  # a unittest file ran its tests
                    self.assertRegex(proc.stderr, r"\nOK( \(skipped=\d+\))?\n")
                    self.assertNotRegex(proc.stderr, r"^Ran 0 tests", "a test file that runs nothing")

    def test_pytorch_idiom_example_reports_junit_as_in_pytorch_ci(self):
        # The example written as a file of pytorch's tree ends in pytorch's run_tests(); under CI (any
        # non-empty CI, as GitHub sets it) that writes JUnit XML through unittest-xml-reporting, as
        # pytorch's CI runs its files.  Every generated test is there under the name -v prints, passed,
        # at the line of the template it was generated from.
        if reason := export_rewrites_code():
            self.skipTest(reason)
        name = "test_torchscript_export"
        source = example(name)
        self.assertIn("\n    run_tests()\n", source)
        plain = run_example(name, source, script=True)
        self.assertEqual(plain.returncode, 0, plain.stderr)
        reports = []

        def collect(folder):
            for path in glob.glob(os.path.join(folder, "test-reports", "**", "*.xml"), recursive=True):
                reports.append(ET.parse(path).getroot())

        in_ci = run_example(name, source, script=True, env={"CI": "true"}, keep=collect)
        self.assertEqual(in_ci.returncode, 0, in_ci.stdout + in_ci.stderr)
        self.assertIn("Generated XML report", in_ci.stdout + in_ci.stderr)
        cases = [case for suite in reports for case in suite.iter("testcase")]
        self.assertEqual(
            sorted(f"__main__.{c.get('classname')}.{c.get('name')}" for c in cases), sorted(verbose_ids(plain.stderr))
        )
        self.assertGreater(len(cases), 0)
        for case in cases:
            self.assertEqual([child.tag for child in case], [], f"{case.get('name')} did not pass")
            self.assertEqual(case.get("file"), f"{name}.py")
        lines = source.splitlines()
        for case in cases:  # the template's first line: its decorator, or its def
            start = int(case.get("line")) - 1
            self.assertRegex(lines[start], r"^    (@|def )", case.get("name"))
            template = re.match(r"    def (test_\w+)\(self, device\):", next(x for x in lines[start:] if "def " in x))
            self.assertIsNotNone(template, case.get("name"))
            self.assertTrue(case.get("name").startswith(template.group(1) + "_"), (case.get("name"), template.group(1)))

    def test_every_python_block_of_the_pages_is_a_tested_file_or_checked(self):
        # Examples are included from docs/examples/ (run above); the only inline Python blocks are
        # the vendoring page's lines, which test/cli/test_vendoring.py compares with the flagship
        # and the vendor command.
        for name in PAGES:
            text = page(name)
            for included in re.findall(r"^\.\. literalinclude:: (\S+)$", text, re.M):
                with self.subTest(page=name, included=included):
                    self.assertTrue(included.startswith("examples/") and included.endswith(".py"), included)
                    self.assertTrue(os.path.isfile(os.path.join(DOCS, included)), included)
            if name != "howto-vendoring":
                self.assertEqual(code_blocks(text, "python"), [], f"docs/{name}.rst: inline Python")
            self.assertNotIn(".. code::", text)


class TestReadme(unittest.TestCase):
    def test_short(self):
        self.assertLessEqual(len(readme().splitlines()), 250)

    def test_install_is_into_your_own_project_and_never_from_an_index(self):
        # The first command block installs torch, then the library from a checkout (or a built
        # wheel or sdist), never by a name an index would resolve: the package is on none.
        torch_line, library_line = code_blocks(readme(), "console")[0].strip().splitlines()
        pin = re.fullmatch(
            r'python -m pip install "(torch==[\d.]+)" --index-url https://download\.pytorch\.org/whl/cpu', torch_line
        )
        self.assertIsNotNone(pin, torch_line)
        self.assertEqual(library_line, "python -m pip install /path/to/torch_serial_testing")
        self.assertLess(readme().index("``torch==2.8.0``"), readme().index("Your first test"))  # the Python 3.9 caveat
        for name, text in (("README.rst", readme()), *((n, page(n)) for n in ("index", "quickstart"))):
            with self.subTest(name):
                self.assertIn("not on PyPI or any other index", text)
                self.assertIn(torch_line, text)
                self.assertIn(library_line, text)
                self.assertNotRegex(
                    text, r"pip install (-U )?[\"']?torch[_-]serial[_-]testing\b"
                )  # by name: from an index
                self.assertIn("torch-serial-testing", text)  # the console script is mentioned
        for route in ("python -m pip install dist/torch_serial_testing-*.whl", "python -m build"):
            self.assertIn(route, readme())
        self.assertIn("   python -m pip install dist/torch_serial_testing-*.tar.gz\n", page("quickstart"))
        # the console script the pages name is the one installed
        with open(os.path.join(ROOT, "setup.cfg"), encoding="utf-8") as fh:
            self.assertIn("\n    torch-serial-testing = torch_serial_testing.tools.cli:main\n", fh.read())

    def test_developing_is_a_venv_then_install_then_run_and_ci_runs_the_suite(self):
        develop = code_blocks(readme(), "console")[-1].strip().splitlines()
        venv, activate, torch_line, library_line, fast, suite = develop
        self.assertEqual([venv, activate], ["python3 -m venv .venv", ". .venv/bin/activate"])
        self.assertEqual(torch_line, code_blocks(readme(), "console")[0].strip().splitlines()[0])
        self.assertEqual(library_line, 'python -m pip install -e ".[test]"')
        self.assertEqual(fast, suite.replace(" test", ' -m "not slow" test'))
        # The Quick start page says the same.
        quickstart = page("quickstart")
        flagship = "python -m unittest test.ao.sparsity.test_qlinear_packed_params -v"
        for command in [*develop, flagship]:
            self.assertIn("   " + command + "\n", quickstart)
        self.assertIn(flagship, readme())
        # CI: .ci/run runs nox's sessions, whose torch and suite command are the README's.
        self.assertRegex(read(".ci", "run"), r"\nnox [^\n]*--sessions [^\n]*\btests\b")
        noxfile = read("noxfile.py")
        pin = re.search(r'"torch==([\d.]+)"', torch_line).group(1)
        self.assertIn(f'\nCI_TORCH = "{pin}"', noxfile)
        self.assertIn("\nSUITE = " + repr(suite.split()).replace("'", '"') + "\n", noxfile)

    def test_every_timing_names_the_script_that_measures_it(self):
        # A figure of how long the suite takes is only published next to the command measuring it.
        script = os.path.join(ROOT, "bench", "suite_timing.py")
        self.assertTrue(os.path.isfile(script))
        for name, text in (("README.rst", readme()), ("docs/quickstart.rst", page("quickstart"))):
            with self.subTest(name):
                figures = list(re.finditer(r"[\d.]+ CPU-(?:minutes|seconds)", text))
                self.assertGreaterEqual(len(figures), 2, "the fast subset's and the suite's")
                for figure in figures:
                    context = text[max(0, figure.start() - 500) : figure.end()]
                    self.assertIn("python bench/suite_timing.py", context, figure.group(0))

    def test_renders_without_warnings(self):
        try:
            import docutils.core
        except ImportError:
            self.skipTest("docutils is not installed (pip install -e '.[test]')")
        import io

        for name, text in (("README.rst", readme()), ("CHANGELOG.rst", read("CHANGELOG.rst"))):
            with self.subTest(name):
                errors = io.StringIO()
                # Parsing reports every problem; no writer is needed (and publish_string's writer_name
                # argument is deprecated since docutils 0.22).
                docutils.core.publish_doctree(text, settings_overrides={"report_level": 2, "warning_stream": errors})
                self.assertEqual(errors.getvalue(), "")


class TestDocs(unittest.TestCase):
    def test_every_page_is_in_the_table_of_contents(self):
        index = page("index")
        for name in PAGES[1:]:
            self.assertRegex(index, rf"\n   {re.escape(name)}\n", name)
        self.assertEqual(page("changelog").strip(), ".. include:: ../CHANGELOG.rst")

    def test_benchmark_results_are_the_committed_ones(self):
        self.assertIn("\n.. include:: ../bench/RESULTS.rst\n", page("benchmarks"))
        self.assertIn(".. csv-table::", read("bench", "RESULTS.rst"))

    def test_compatibility_table_is_the_compat_tool_csv(self):
        from tools import compat_table

        self.assertIn(".. csv-table::\n   :file: _data/compat.csv\n   :header-rows: 1\n", page("compatibility"))
        with open(os.path.join(DOCS, "_data", "compat.csv"), encoding="utf-8", newline="") as fh:
            rows = list(csv.reader(fh))
        self.assertEqual(tuple(rows[0]), compat_table.CSV_HEADER)
        self.assertEqual({len(r) for r in rows}, {len(compat_table.CSV_HEADER)})
        self.assertEqual([r for r in rows[1:] if r[4] != "0"], [], "the matrix documents only green rows")
        # what the tool writes reads back as the rows it was given
        row = compat_table.Row("2.8.0+cpu", "3.9.18", 459, 3, 0, 'a "quoted", note')
        self.assertEqual(
            list(csv.reader(compat_table.csv_table([row]).splitlines())),
            [list(compat_table.CSV_HEADER), ["2.8.0+cpu", "3.9.18", "459", "3", "0", 'a "quoted", note']],
        )

    def test_every_public_name_is_documented(self):
        # Each public name has its own autodoc entry, in the order a user meets it (the mixin first).
        reference = page("reference")
        entries = re.findall(r"^\.\. auto(?:class|function|exception):: (\w+)", reference, re.M)
        self.assertEqual(sorted(entries), sorted(torch_serial_testing.__all__))
        self.assertEqual(entries[:2], ["SerializationRoundTripTestCase", "instantiate_round_trip_tests"])
        undocumented = [n for n in torch_serial_testing.__all__ if not getattr(torch_serial_testing, n).__doc__]
        self.assertEqual(undocumented, [])

    def test_user_docs_carry_no_development_history(self):
        history = re.compile(
            r"\b(this|last|two|previous) rounds?\b|\brounds? ago\b|\bflat package\b|\bthe layout\b|"
            r"\b(tree|commit) [0-9a-f]{7,40}\b|``[0-9a-f]{7,40}``|\b[0-9a-f]{7}\b(?=[, ])|(?<!pytorch )\bissue \d+\b",
            re.I,
        )
        sources = {"README.rst": readme(), **{f"docs/{n}.rst": page(n) for n in PAGES if n != "changelog"}}
        for name, text in sources.items():
            with self.subTest(name):
                self.assertEqual([m.group(0) for m in history.finditer(text)], [])

    def test_site_builds_without_warnings(self):
        try:
            import sphinx  # noqa: F401
        except ImportError:
            self.skipTest("sphinx is not installed (pip install -e '.[docs]')")
        with tempfile.TemporaryDirectory() as out:
            proc = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "sphinx",
                    "-W",
                    "-q",
                    "-b",
                    "html",
                    "-d",
                    os.path.join(out, "doctrees"),
                    DOCS,
                    os.path.join(out, "html"),
                ],
                env=child_env(),
                capture_output=True,
                text=True,
            )
            self.assertEqual(proc.returncode, 0, proc.stderr)
            html = read_html(os.path.join(out, "html", "reference.html"))
        for name in torch_serial_testing.__all__:  # autodoc rendered each public name
            self.assertIn(f'id="torch_serial_testing.{name}"', html, name)
        # ... and nothing private: no private parameter or base class, no "Return type: None",
        # no sentinel's address as a default value
        text = re.sub(r"<[^>]+>", "", html)
        for private in ("_owned", "_EscapedMessage", "Bases:", "object object at", "Return type:\nNone"):
            self.assertNotIn(private, text, private)
        self.assertNotRegex(text, r"Return type:\s*None\b")


def read_html(path):
    with open(path, encoding="utf-8") as fh:
        return fh.read()


if __name__ == "__main__":
    unittest.main()
