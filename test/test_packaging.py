"""The package's build and the maintainers' tools agree with each other and with the README.

What can be checked without a network: the extras hold what their names say (the ``test`` extra
exactly what the suite imports or runs, no documentation toolchain); the console script and
``python -m torch_serial_testing`` resolve to the CLI; no project URL points at someone else's
project; pre-commit runs the ruff the ``lint`` extra pins; the nox sessions exist, ``tests`` runs
the README's test command, and ``.ci/run`` runs the sessions in a venv it makes and fills itself.
The real build (wheel, sdist, an install of each) is ``nox -s sdist`` and CONTRIBUTING.rst.
"""

from __future__ import annotations

import ast
import configparser
import contextlib
import importlib
import importlib.metadata
import importlib.util
import io
import os
import re
import shlex
import sys
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def read(*parts: str) -> str:
    with open(os.path.join(ROOT, *parts), encoding="utf-8") as fh:
        return fh.read()


def setup_cfg() -> configparser.ConfigParser:
    cfg = configparser.ConfigParser()
    cfg.read(os.path.join(ROOT, "setup.cfg"), encoding="utf-8")
    return cfg


def requirements(text: str) -> list[str]:
    return [line.strip() for line in text.strip().splitlines() if line.strip() and not line.strip().startswith("#")]


def name_of(requirement: str) -> str:
    """The normalized distribution name of a requirement (PEP 503: lower case, runs of -_. as -)."""
    name = re.match(r"[A-Za-z0-9._-]+", requirement).group(0)
    return re.sub(r"[-_.]+", "-", name).lower()


def extras() -> dict[str, list[str]]:
    section = setup_cfg()["options.extras_require"]
    return {extra: requirements(section[extra]) for extra in section}


def ruff_pins(text: str) -> list[str]:
    return re.findall(r"\bruff==([\w.]+)", text)


def imported_top_level(folder: str) -> dict[str, str]:
    """{top-level module: a file importing it} for every absolute import in *folder*'s Python files."""
    found: dict[str, str] = {}
    for dirpath, dirnames, filenames in os.walk(os.path.join(ROOT, folder)):
        dirnames[:] = [d for d in dirnames if d != "__pycache__"]
        for f in filenames:
            if f.endswith(".py"):
                path = os.path.join(dirpath, f)
                for node in ast.walk(ast.parse(read(path))):
                    if isinstance(node, ast.Import):
                        names = [alias.name for alias in node.names]
                    elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                        names = [node.module]
                    else:
                        continue
                    for name in names:
                        found.setdefault(name.split(".")[0], os.path.relpath(path, ROOT))
    return found


def ci_nox_command() -> list[str]:
    (line,) = [line for line in read(".ci", "run").splitlines() if line.startswith("nox ")]
    return shlex.split(line)


def noxfile_sessions() -> set[str]:
    """The functions of noxfile.py decorated with ``@nox.session`` (read, not imported: nox may be absent)."""
    sessions = set()
    for node in ast.parse(read("noxfile.py")).body:
        if isinstance(node, ast.FunctionDef):
            for deco in node.decorator_list:
                target = deco.func if isinstance(deco, ast.Call) else deco
                if ast.unparse(target) == "nox.session":
                    sessions.add(node.name)
    return sessions


class TestExtras(unittest.TestCase):
    def test_each_extra_is_what_its_name_says(self):
        declared = {extra: {name_of(r) for r in reqs} for extra, reqs in extras().items()}
        # test: no documentation toolchain (the one test that builds the site skips without it, naming
        # the docs extra); docs: Sphinx and its theme; lint: exact pins, as pre-commit's
        self.assertEqual(declared["test"] & declared["docs"], set())
        self.assertEqual(declared["docs"], {"sphinx", "furo"})
        self.assertEqual(declared["lint"], {"ruff", "mypy"})
        self.assertEqual([r for r in extras()["lint"] if "==" not in r], [], "lint pins exact versions")
        # dev: every other extra, and the tools that run them
        (self_ref,) = [r for r in extras()["dev"] if name_of(r) == "torch-serial-testing"]
        self.assertEqual(set(re.search(r"\[(.*)\]", self_ref).group(1).split(",")), set(declared) - {"dev"})
        self.assertEqual(declared["dev"] - {"torch-serial-testing"}, {"nox", "pre-commit"})

    @unittest.skipIf(sys.version_info < (3, 10), "packages_distributions and stdlib_module_names need Python 3.10")
    def test_the_test_extra_is_what_the_suite_imports_or_runs(self):
        dists = importlib.metadata.packages_distributions()
        cfg = setup_cfg()
        core = {name_of(r) for r in requirements(cfg["options"]["install_requires"])}
        test = {name_of(r) for r in extras()["test"]}
        docs = {name_of(r) for r in extras()["docs"]}
        build = {
            name_of(r)
            for r in re.findall(r'"([^"]+)"', re.search(r"requires = \[(.*)\]", read("pyproject.toml")).group(1))
        }
        # Every installed distribution the suite imports is declared: a dependency, the test extra, the
        # docs extra (the site build test, which skips without it) or the build backend (the MANIFEST test).
        undeclared = {}
        for module, where in imported_top_level("test").items():
            if module in stdlib_modules() or module in local_modules():
                continue
            for dist in dists.get(module, []):  # not installed, or the suite's own: not a distribution here
                if name_of(dist) not in core | test | docs | build | {"torch-serial-testing"}:
                    undeclared[module] = (dist, where)
        self.assertEqual(undeclared, {})
        # Every requirement of the test extra is used: imported by the suite, or run by it.
        imported = {name_of(d) for m in imported_top_level("test") for d in dists.get(m, [m])}
        run_by_the_suite = {
            "pytest-xdist": "-n" in noxfile_suite(),  # the README's test command: python -m pytest -n 2 test
            "ninja": "is_ninja_available" in read("test", "npu_backend", "__init__.py"),  # builds the npu backend
            # pytorch's run_tests imports xmlrunner under CI: the suite runs an example so
            "unittest-xml-reporting": '{"CI": "true"}' in read("test", "test_readme.py"),
        }
        run = {name for name, used in run_by_the_suite.items() if used}
        self.assertEqual(sorted(test - imported - run), [])
        self.assertEqual(sorted(run - test), [])  # and what it runs is in the test extra


def stdlib_modules() -> frozenset[str]:
    if sys.version_info < (3, 10):  # pragma: no cover - the one test that needs it skips there
        raise unittest.SkipTest("sys.stdlib_module_names needs Python 3.10")
    return sys.stdlib_module_names


def local_modules() -> set[str]:
    """What the checkout itself makes importable: its top-level entries, and the suite's own modules."""
    names = {os.path.splitext(entry)[0] for entry in os.listdir(ROOT)}
    for _dirpath, dirnames, filenames in os.walk(os.path.join(ROOT, "test")):
        names |= {os.path.splitext(entry)[0] for entry in dirnames + filenames}
    return names


def noxfile_suite() -> list[str]:
    """noxfile.SUITE, read from the file (nox need not be installed)."""
    for node in ast.parse(read("noxfile.py")).body:
        if isinstance(node, ast.Assign) and [t.id for t in node.targets if isinstance(t, ast.Name)] == ["SUITE"]:
            return ast.literal_eval(node.value)
    raise AssertionError("noxfile.py defines no SUITE")


class TestMetadata(unittest.TestCase):
    def test_the_console_script_and_python_m_are_the_cli(self):
        cfg = setup_cfg()
        scripts = dict(
            (part.strip() for part in line.split("=", 1))
            for line in requirements(cfg["options.entry_points"]["console_scripts"])
        )
        self.assertEqual(list(scripts), ["torch-serial-testing"])
        module, _, attr = scripts["torch-serial-testing"].partition(":")
        main = getattr(importlib.import_module(module), attr)
        with contextlib.redirect_stdout(io.StringIO()) as out:
            self.assertEqual(main(["--version"]), 0)
        import torch_serial_testing

        self.assertEqual(out.getvalue().strip(), f"torch_serial_testing {torch_serial_testing.__version__}")
        self.assertIs(importlib.import_module("torch_serial_testing.__main__").main, main)
        # what pip installed, when the checkout is installed (CI, an editable install), says the same
        try:
            installed = importlib.metadata.entry_points(group="console_scripts")
        except TypeError:  # Python 3.9: a dict of groups
            installed = importlib.metadata.entry_points().get("console_scripts", ())
        ours = [ep.value for ep in installed if ep.name == "torch-serial-testing"]
        self.assertIn(ours, ([], [scripts["torch-serial-testing"]]))

    def test_no_url_points_at_another_project(self):
        # The project has no public address yet: its metadata names none rather than pytorch's pages
        # (a user reading them took pytorch's docs and test file for this project's).
        metadata = setup_cfg()["metadata"]
        urls = [url for value in metadata.values() for url in re.findall(r"https?://\S+", value)]
        self.assertEqual(urls, [])
        self.assertNotIn("project_urls", metadata)
        self.assertNotIn("url", metadata)

    def test_pyproject_builds_with_setuptools_from_setup_cfg(self):
        text = read("pyproject.toml")
        try:
            import tomllib
        except ImportError:
            self.skipTest("tomllib needs Python 3.11")
        data = tomllib.loads(text)
        self.assertEqual(data["build-system"]["build-backend"], "setuptools.build_meta")
        self.assertEqual([name_of(r) for r in data["build-system"]["requires"]], ["setuptools"])
        # a [project] table would replace setup.cfg's metadata; tool configuration lives in one file
        # each (ruff.toml, setup.cfg's [mypy], pytest.ini), never also here
        self.assertEqual(set(data), {"build-system"})
        self.assertIn("[mypy]", read("setup.cfg"))
        self.assertTrue(os.path.isfile(os.path.join(ROOT, "ruff.toml")))
        self.assertTrue(os.path.isfile(os.path.join(ROOT, "pytest.ini")))

    def test_the_sdist_ships_the_maintainers_files(self):
        try:
            from setuptools.command.egg_info import FileList
        except ImportError:
            self.skipTest("setuptools is not installed: cannot evaluate MANIFEST.in")
        cwd = os.getcwd()
        os.chdir(ROOT)  # FileList works on paths relative to the project root
        try:
            files = FileList()
            files.findall(".")
            for line in read("MANIFEST.in").splitlines():
                if line.strip() and not line.lstrip().startswith("#"):
                    files.process_template_line(line.strip())
        finally:
            os.chdir(cwd)
        wanted = {"pyproject.toml", "CONTRIBUTING.rst", ".pre-commit-config.yaml", ".ci/run", "noxfile.py"}
        self.assertEqual(wanted - {os.path.normpath(f) for f in files.files}, set())


class TestMaintainerTools(unittest.TestCase):
    def test_pre_commit_runs_ruff_check_and_format_at_the_lint_pin(self):
        config = read(".pre-commit-config.yaml")
        (lint_pin,) = ruff_pins("\n".join(extras()["lint"]))
        self.assertEqual(ruff_pins(config), [lint_pin, lint_pin])  # one per hook, both the lint extra's
        entries = re.findall(r"^\s+entry: (.+)$", config, re.M)
        self.assertEqual([e.split()[:2] for e in entries], [["ruff", "check"], ["ruff", "format"]])
        for entry in entries:  # ruff.toml's excludes hold for the files pre-commit names too
            self.assertIn("--force-exclude", entry.split())

    def test_the_sessions_exist_and_ci_runs_them_in_a_venv_it_fills(self):
        self.assertLessEqual({"tests", "lint", "docs", "sdist", "compat", "compat_table"}, noxfile_sessions())
        command = ci_nox_command()
        self.assertIn("--no-venv", command)
        sessions = command[command.index("--sessions") + 1 :]
        self.assertEqual(sessions, ["lint", "docs", "tests"])
        ci = read(".ci", "run")
        # a fresh clone has nothing: the script makes its venv and installs nox before calling it
        self.assertLess(ci.index("python3 -m venv .ci-venv\n. .ci-venv/bin/activate\n"), ci.index("pip install"))
        self.assertLess(ci.index('pip install --quiet "nox'), ci.index("\nnox "))
        self.assertIn("set -euo pipefail", ci)


class FakeSession:
    """The part of nox.Session the tests, lint and docs sessions use; records what they would run."""

    def __init__(self, venv_backend: str, posargs: list[str] | None = None) -> None:
        self.venv_backend = venv_backend
        self.posargs = posargs or []
        self.env: dict[str, str | None] = {}
        self.calls: list[tuple[str, ...]] = []

    def install(self, *args: str) -> None:
        self.calls.append(("install", *args))

    def run(self, *args: str) -> None:
        self.calls.append(("run", *args))


class TestSessions(unittest.TestCase):
    def setUp(self):
        if importlib.util.find_spec("nox") is None:  # the dev extra's, not the test extra's
            self.skipTest("nox is not installed (pip install nox; .ci/run installs it)")
        from unittest import mock

        sys.path.insert(0, ROOT)
        self.addCleanup(sys.path.remove, ROOT)
        self.noxfile = importlib.import_module("noxfile")
        # the docs session empties docs/_build before building: keep whatever a contributor has there
        patcher = mock.patch.object(self.noxfile, "shutil")
        self.shutil = patcher.start()
        self.addCleanup(patcher.stop)

    def test_tests_runs_the_readme_command(self):
        session = FakeSession("virtualenv")
        self.noxfile.tests(session)
        runs = [call[1:] for call in session.calls if call[0] == "run"]
        self.assertEqual(runs[-1], ("python", "-m", "pytest", "-n", "2", "test"))
        self.assertIn("\n   " + " ".join(runs[-1]) + "\n", read("README.rst"))
        self.assertEqual(runs[0], ("python", "-m", "test.npu_backend"))
        torch_pin = f"torch=={self.noxfile.CI_TORCH}"
        self.assertEqual(session.calls[:2], [("install", torch_pin), ("install", "-e", ".[test,docs]")])
        self.assertIn(torch_pin, re.findall(r"torch==[\d.]+", read("README.rst")))
        self.assertEqual(session.env.get("PYTHONPATH", "unset"), None)  # the checkout alone, not the caller's path
        # arguments replace "-n 2 test"
        session = FakeSession("virtualenv", ["-n", "2", "-m", "not slow", "test"])
        self.noxfile.tests(session)
        self.assertEqual(session.calls[-1], ("run", "python", "-m", "pytest", "-n", "2", "-m", "not slow", "test"))

    def test_without_a_venv_the_sessions_install_into_the_running_one(self):
        # nox refuses session.install() under --no-venv, which .ci/run uses: pip runs in the venv itself
        for name, extras in (("tests", ".[test,docs]"), ("lint", ".[lint]"), ("docs", ".[docs]")):
            with self.subTest(name):
                session = FakeSession("none")
                getattr(self.noxfile, name)(session)
                installs = [c for c in session.calls if c[:5] == ("run", "python", "-m", "pip", "install")]
                self.assertEqual(
                    [c[5:7] for c in installs], [("--quiet", f"torch=={self.noxfile.CI_TORCH}"), ("--quiet", "-e")]
                )
                self.assertEqual(installs[1][7], extras)
                self.assertFalse([c for c in session.calls if c[0] == "install"])

    def test_lint_and_docs_run_the_linters_and_a_warning_free_build(self):
        session = FakeSession("virtualenv")
        self.noxfile.lint(session)
        runs = [" ".join(call[1:]) for call in session.calls if call[0] == "run"]
        self.assertEqual(runs, ["ruff check .", "ruff format --check .", "mypy"])
        # mypy reads the types of everything the package imports: each is installed
        (install,) = [call[1:] for call in session.calls if call[:3] == ("install", "-e", ".[lint]")]
        installed = {name_of(r) for r in requirements(setup_cfg()["options"]["install_requires"])}
        installed |= {name_of(r) for r in install[2:]} | {"torch", "torch-serial-testing"}
        imports = {name_of(m) for m in imported_top_level("torch_serial_testing") if m not in stdlib_modules()}
        self.assertEqual(sorted(imports - installed), [])
        session = FakeSession("virtualenv")
        self.noxfile.docs(session)
        # from nothing: a kept build would not repeat the warnings of the pages it does not rebuild
        self.shutil.rmtree.assert_called_once_with(os.path.join("docs", "_build"), ignore_errors=True)
        (build,) = [call[1:] for call in session.calls if call[0] == "run"]
        self.assertEqual(build[:4], ("python", "-m", "sphinx", "-W"))
        self.assertEqual(build[-2], "docs")


class TestContributing(unittest.TestCase):
    def test_names_only_what_exists(self):
        text = read("CONTRIBUTING.rst")
        named = set(re.findall(r"nox (?:--no-venv )?-s ((?:\w+ ?)+)", text))
        self.assertEqual({s for group in named for s in group.split()} - noxfile_sessions(), set())
        self.assertIn("\n   " + " ".join(noxfile_suite()) + " ", text)  # a command line of its own
        for path in re.findall(r"``((?:test|bench|docs)/[\w./]+|\.[\w-]+\.yaml|[\w.]+\.(?:toml|cfg|ini))``", text):
            with self.subTest(path):
                self.assertTrue(os.path.exists(os.path.join(ROOT, path.rstrip("/"))), path)

    def test_renders_without_warnings(self):
        try:
            import docutils.core
        except ImportError:
            self.skipTest("docutils is not installed (pip install -e '.[test]')")
        errors = io.StringIO()
        docutils.core.publish_doctree(
            read("CONTRIBUTING.rst"), settings_overrides={"report_level": 2, "warning_stream": errors}
        )
        self.assertEqual(errors.getvalue(), "")


if __name__ == "__main__":
    unittest.main()
