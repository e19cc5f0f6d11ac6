"""Maintenance sessions: tests, lint and docs (what ``.ci/run`` runs), the torch x Python
compatibility matrix and the source-distribution check.  ``pip install nox`` (or
``pip install -e ".[dev]"``) to run them::

    nox -l                                          # the sessions
    nox -s tests                                    # README's python -m pytest -n 2 test
    nox -s tests -- -n 2 -m "not slow" test         # arguments replace "-n 2 test"
    nox -s lint docs                                # ruff, ruff format --check, mypy; the site, -W
    nox --no-venv -s lint docs tests                # the same in the active venv (.ci/run does this)
    nox -s "compat-3.11(torch='2.8.0')"             # one torch version: pytest -n 2
    nox -s compat -p 3.11 -- -n 2 -m "not slow"     # every version on 3.11; arguments go to pytest
    nox -s compat_table -- --csv docs/_data/compat.csv   # the documentation's table, from the results
    nox -s sdist                                    # check-manifest, then the suite from the sdist

tests, lint and docs each make a venv (``.nox/<name>``) with ``torch==2.13.0`` and the checkout
with the extras they need; ``-R`` reuses it without installing again.  Under ``--no-venv`` they
install into the running environment instead, so ``.ci/run`` installs torch once for all three.

Why a matrix: what the library predicts of torch (the ``weights_only`` default, which
``TORCH_FORCE_*`` switches are read and how, the allowlist, the ``safe_globals`` context) changes
between releases, so "supported" is only a claim until the suite has run on each release.  Each
``compat`` session is the Quick start in a fresh venv -- ``torch==VERSION``, the checkout with its
test extra, pytest -- and deletes the venv afterwards (torch's CUDA builds are several GB), so only
one exists at a time.  It is separate from ``.ci/run``: one version takes 6 to 17 minutes on two
CPUs, mostly downloading torch.
"""

from __future__ import annotations

import glob
import os
import shutil
import sys
import tarfile

import nox

nox.needs_version = ">=2024.3.2"  # session(default=False)

PYTHONS = ["3.9", "3.10", "3.11", "3.12", "3.13"]
# The latest patch of every torch minor the library supports (setup.cfg: torch>=2.4).
ALL_VERSIONS = [
    "2.4.1",
    "2.5.1",
    "2.6.0",
    "2.7.1",
    "2.8.0",
    "2.9.1",
    "2.10.0",
    "2.11.0",
    "2.12.1",
    "2.13.0",
    "2.14.1",
    "2.15.0",
]
# The torch minors with wheels for a Python, where not all of them (PyPI, Linux x86-64).
TORCH_WITH_WHEELS = {"3.9": ((2, 4), (2, 8)), "3.10": ((2, 4), (2, 14)), "3.13": ((2, 5), (2, 15))}
RESULTS = os.path.join(".nox", "_results")  # JUnit XML, one file per compat session
CI_TORCH = "2.13.0"  # the torch of .ci/run and of the tests, lint, docs and sdist sessions
# What the package imports beyond its dependencies (the pytest plugins; the numpy remedy, when numpy is
# there): mypy reads their types, so the lint session installs them beside the lint extra.
TYPED_IMPORTS = ("pytest", "numpy")
# The README's test command; arguments given to the tests session replace its "-n 2 test".
SUITE = ["python", "-m", "pytest", "-n", "2", "test"]


def _isolate(session: nox.Session) -> None:
    """The venv sees only what it installed and the checkout; the suite sets ``TORCH_FORCE_*`` itself."""
    session.env["PYTHONPATH"] = None
    for name in os.environ:
        if name.startswith("TORCH_FORCE_"):
            session.env[name] = None


def _install(session: nox.Session, extras: str, *more: str) -> None:
    """CI's torch, then the checkout (editable) with ``extras`` and ``more``; under --no-venv, into the running venv."""
    for args in ([f"torch=={CI_TORCH}"], ["-e", f".[{extras}]", *more]):
        if session.venv_backend == "none":  # nox refuses session.install() without a venv of its own
            session.run("python", "-m", "pip", "install", "--quiet", *args)
        else:
            session.install(*args)


@nox.session
def tests(session: nox.Session) -> None:
    """The README's test command, python -m pytest -n 2 test (with the docs extra: one test builds the site)."""
    _isolate(session)
    _install(session, "test,docs")
    session.run("python", "-m", "test.npu_backend")  # build the npu test backend once, before the test processes
    session.run(*SUITE[:3], *(session.posargs or SUITE[3:]))


@nox.session
def lint(session: nox.Session) -> None:
    """ruff check, ruff format --check and mypy, at the lint extra's pinned versions."""
    _install(session, "lint", *TYPED_IMPORTS)
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")
    session.run("mypy")


@nox.session
def docs(session: nox.Session) -> None:
    """The documentation site, warnings as errors, rebuilt from nothing into docs/_build/html."""
    _install(session, "docs")
    out = os.path.join("docs", "_build")
    shutil.rmtree(out, ignore_errors=True)  # a kept build would not repeat the warnings of unchanged pages
    doctrees, html = os.path.join(out, "doctrees"), os.path.join(out, "html")
    session.run("python", "-m", "sphinx", "-W", "-q", "-b", "html", "-d", doctrees, "docs", html)


def _pytest_args(session: nox.Session) -> list[str]:
    return ["-p", "no:cacheprovider", "-q", "-rs", *(session.posargs or ["-n", "2"])]


@nox.session(python=PYTHONS, default=False)
@nox.parametrize("torch", ALL_VERSIONS)
def compat(session: nox.Session, torch: str) -> None:
    """The suite on one torch release, in a fresh venv deleted afterwards; JUnit XML into .nox/_results/."""
    try:
        oldest, newest = TORCH_WITH_WHEELS.get(str(session.python), ((0, 0), (99, 0)))
        if not oldest <= tuple(int(p) for p in torch.split(".")[:2]) <= newest:
            session.skip(f"torch {torch} publishes no wheel for Python {session.python}")
        # A machine may cap torch through a pip constraints file; the matrix asks for exact versions.
        session.env["PIP_CONSTRAINT"] = os.devnull
        session.env["PIP_NO_CACHE_DIR"] = "1"  # several GB per version: no copy in pip's cache
        _isolate(session)
        session.install(f"torch=={torch}")
        session.install("-e", ".[test]")
        session.run("python", "-m", "test.npu_backend")  # once, before the test processes (as .ci/run)
        os.makedirs(RESULTS, exist_ok=True)
        xml = os.path.join(RESULTS, f"compat-{session.python}-torch-{torch}.xml")
        if os.path.exists(xml):
            os.remove(xml)  # an earlier run's result must not stand for this one
        code = 0
        try:
            session.run("python", "-m", "pytest", f"--junitxml={xml}", *_pytest_args(session), "test")
        except nox.command.CommandFailed as exc:
            code = exc.return_code if exc.return_code is not None else 1
            raise
        finally:
            # the torch and Python versions the suite ran on, and pytest's exit status, into the
            # XML; then this version's row of the table
            session.run("python", "-m", "tools.compat_table", "--stamp", str(code), xml)
    finally:
        shutil.rmtree(session.virtualenv.location, ignore_errors=True)


@nox.session(python=False, default=False)
def compat_table(session: nox.Session) -> None:
    """The compat sessions' results as CSV (arguments: python -m tools.compat_table's)."""
    session.run(sys.executable, "-m", "tools.compat_table", *session.posargs)


@nox.session
def sdist(session: nox.Session) -> None:
    """check-manifest, build the sdist, install it with its test extra, run the suite from the unpacked sdist."""
    _isolate(session)
    session.install("build", "check-manifest", f"torch=={CI_TORCH}")
    session.run("check-manifest")
    tmp = session.create_tmp()
    dist, unpacked = os.path.join(tmp, "dist"), os.path.join(tmp, "unpacked")
    for folder in (dist, unpacked):
        shutil.rmtree(folder, ignore_errors=True)
    session.run("python", "-m", "build", "--sdist", "--outdir", dist, ".", silent=True)
    (archive,) = glob.glob(os.path.join(dist, "*.tar.gz"))
    session.install(f"{archive}[test]")
    with tarfile.open(archive) as tar:
        # the "data" filter (Python >= 3.12, and security backports) refuses unsafe members
        tar.extractall(unpacked, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
    (tree,) = glob.glob(os.path.join(unpacked, "*"))
    with session.chdir(tree):
        session.run("python", "-m", "test.npu_backend")
        session.run("python", "-m", "pytest", *_pytest_args(session), "test")
