"""pytest's view of the suite: which tests are slow, and a private temporary directory per run.

* ``slow``: the tests (or classes) listed in ``test/slow_tests.txt`` (seconds each: child
  processes running test runners, the CLI and whole matrices; the documentation build).
  ``python -m pytest -n 2 -m "not slow" test`` is the fast subset for an edit-test loop; CI runs
  everything.
* Temporary files: the run (and every xdist worker and child process, which inherit ``TMPDIR``)
  works in a fresh directory of its own; whatever is left in it at the end fails the run, naming
  it.  Tests clean up with ``tempfile.TemporaryDirectory``, ``addCleanup`` or pytest's ``tmp_path``.
  Two folders in it are pytest's and torch's own, removed with it: this run's ``tmp_path`` root,
  and ``PYTEST_DEBUG_TEMPROOT`` for the pytest runs tests start in child processes (pytest keeps
  their ``pytest-of-<user>`` folders by design; an xdist controller makes one even without
  ``tmp_path``).  A folder a torch module holds as a module-level ``TemporaryDirectory`` is torch's
  too (torch 2.8 makes one when ``torch._dynamo`` is imported): its finalizer removes it when the
  interpreter exits, after this check, so it is recognised by that object, not by its name.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
SLOW_LIST = os.path.join(HERE, "slow_tests.txt")
PYTEST_BASETEMP = "pytest-basetemp"
INDUCTOR_CACHE = "torchinductor"
CHILD_PYTEST_ROOT = "pytest-children"  # PYTEST_DEBUG_TEMPROOT: the temproot pytest documents for tmp_path
OWN_ENTRIES = {PYTEST_BASETEMP, INDUCTOR_CACHE, CHILD_PYTEST_ROOT}


def slow_test_ids() -> set[str]:
    with open(SLOW_LIST, encoding="utf-8") as fh:
        return {line.strip() for line in fh if line.strip() and not line.lstrip().startswith("#")}


@pytest.hookimpl(tryfirst=True)  # before -m deselects by marker
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    slow = slow_test_ids()
    found = set()
    for item in items:
        # a test's own id, or its class's (a class whose setUpClass runs the expensive part)
        listed = slow.intersection((item.nodeid, item.nodeid.rsplit("::", 1)[0]))
        if listed:
            item.add_marker(pytest.mark.slow)
            found.update(listed)
    # A listed test that was renamed would silently join the fast subset: say so.  Only when whole
    # files were collected (a node id on the command line collects part of a file).
    collected_files = {item.nodeid.split("::", 1)[0] for item in items}
    if not any("::" in arg for arg in config.args):
        stale = sorted(i for i in slow - found if i.split("::", 1)[0] in collected_files)
        if stale:
            raise pytest.UsageError(f"{SLOW_LIST} names tests that do not exist: {', '.join(stale)}")


def _is_controller(config: pytest.Config) -> bool:
    return not hasattr(config, "workerinput")  # an xdist worker inherits the controller's TMPDIR


def pytest_configure(config: pytest.Config) -> None:
    if not _is_controller(config):
        return
    private = tempfile.mkdtemp(prefix="tst-suite-")
    config.stash[_TMP] = (private, {name: os.environ.get(name) for name in _ENV})
    if config.option.basetemp is None:  # pytest's tmp_path folders: inside, removed with the rest
        config.option.basetemp = os.path.join(private, PYTEST_BASETEMP)
    # torch's own cache of compiled kernels (torch._inductor, imported with torch._dynamo by the
    # tests that run pytorch's TestCase) would otherwise stay in the temporary directory
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", os.path.join(private, INDUCTOR_CACHE))
    os.mkdir(os.path.join(private, CHILD_PYTEST_ROOT))  # pytest makes only pytest-of-<user> in it
    os.environ["PYTEST_DEBUG_TEMPROOT"] = os.path.join(private, CHILD_PYTEST_ROOT)
    os.environ["TMPDIR"] = private
    tempfile.tempdir = None  # gettempdir() reads TMPDIR again


def held_by_torch(folder: str) -> set[str]:
    """Entries of *folder* that a torch module holds as a module-level ``TemporaryDirectory``."""
    held, real = set(), os.path.realpath(folder)
    for name, module in list(sys.modules.items()):
        if name == "torch" or name.startswith("torch."):
            for value in list(getattr(module, "__dict__", {}).values()):
                if (
                    issubclass(type(value), tempfile.TemporaryDirectory)
                    and os.path.realpath(os.path.dirname(value.name)) == real
                ):
                    held.add(os.path.basename(value.name))
    return held


@pytest.hookimpl(trylast=True)  # after xdist has stopped its workers
def pytest_sessionfinish(session: pytest.Session) -> None:
    config = session.config
    if not _is_controller(config) or _TMP not in config.stash:
        return
    private, previous = config.stash[_TMP]
    left = sorted(set(os.listdir(private)) - OWN_ENTRIES - held_by_torch(private))
    shutil.rmtree(private, ignore_errors=True)
    for name, value in previous.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    tempfile.tempdir = None
    if left:
        reporter = config.pluginmanager.get_plugin("terminalreporter")
        message = f"the test run left {len(left)} entries in its temporary directory: {', '.join(left)}"
        if reporter is not None:
            reporter.write_line(message, red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


_ENV = ("TMPDIR", "PYTEST_DEBUG_TEMPROOT", "TORCHINDUCTOR_CACHE_DIR")
_TMP = pytest.StashKey[tuple]()
