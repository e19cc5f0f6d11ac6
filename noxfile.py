"""Maintenance sessions: the torch x Python compatibility matrix and the source-distribution check.

Why a matrix: what the library predicts of torch (the ``weights_only`` default, which
``TORCH_FORCE_*`` switches are read and how, the allowlist, the ``safe_globals`` context) changes
between releases, so "supported" is only a claim until the suite has run on each release.  Each
``compat`` session is the Quick start in a fresh venv -- ``torch==VERSION``, the checkout with its
test extra, pytest -- and deletes the venv afterwards (torch's CUDA builds are several GB), so only
one exists at a time.  It is separate from ``.ci/run``: one version takes 6 to 17 minutes on two
CPUs, mostly downloading torch.  ``pip install nox`` (or ``pipx install nox``) to run them::

    nox -l                                          # the sessions
    nox -s "compat-3.11(torch='2.8.0')"             # one version: pytest -n 2
    nox -s compat -p 3.11 -- -n 2 -m "not slow"     # every version on 3.11; arguments go to pytest
    nox -s compat_table -- --csv docs/_data/compat.csv   # the documentation's table, from the results
    nox -s sdist                                    # check-manifest, then the suite from the sdist
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
SDIST_TORCH = "2.13.0"  # CI's torch (.ci/run)


def _isolate(session: nox.Session) -> None:
    """The venv sees only what it installed and the checkout; the suite sets ``TORCH_FORCE_*`` itself."""
    session.env["PYTHONPATH"] = None
    for name in os.environ:
        if name.startswith("TORCH_FORCE_"):
            session.env[name] = None


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
    session.install("build", "check-manifest", f"torch=={SDIST_TORCH}")
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
