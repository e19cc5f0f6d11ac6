"""Round trips across ranks: a test body run in each of N processes sharing a gloo process group.

:class:`MultiRankRoundTrips`, a mixin beside :class:`~torch_serial_testing.SerializationRoundTripTestCase`, gives
each ``test_*`` method a world-size dimension: ``test_x`` becomes ``test_x_world_size_2`` (one per entry of the
class's :attr:`~MultiRankRoundTrips.world_sizes`, or of ``@at_world_sizes(...)`` on the method), before the core's
dimensions (``test_x_world_size_2_default_cpu`` once instantiated).  Run, such a test starts N rank processes
(new processes of the same interpreter, with this process's ``sys.path`` and working directory; CPU only) and
waits for them:

* **Rendezvous**: a :class:`torch.distributed.FileStore` in a private temporary directory (no port to race
  for), gloo's own sockets on the loopback interface only (``GLOO_SOCKET_IFNAME``).  The directory, with a
  folder the ranks share (:attr:`~MultiRankRoundTrips.shared_dir`, for a DCP checkpoint), is removed after.
* **In each rank** the same test id is loaded by ``unittest``'s loader and run by a ``unittest`` result, inside
  ``init_process_group("gloo")`` (destroyed after): its ``setUp``/cleanups are the core's, so every rank gets the
  isolation an in-process test gets (global torch state captured and restored, a leak fails the rank), and every
  load is predicted and asserted there, per rank.  ``self.rank``, ``self.world_size``, :meth:`device_mesh`.
  A test file run as a script is loaded there as ``__mp_main__`` (as ``multiprocessing`` does).
* **In the parent**: each rank's loads become the test's records (``rank r: <outcome>``), a failure or error of
  any rank fails the test naming the rank and its traceback, a test every rank skipped is skipped.  A rank that
  has not finished :data:`GRACE` seconds after another failed (waiting in a collective for it), or any rank after
  the test's :attr:`~MultiRankRoundTrips.rank_timeout`, is killed with its session and the failure says so, with
  its output.  A rank exits by itself when its parent is gone: no orphan outlives the test.
* **DCP's** ``.metadata`` is a plain pickle: :func:`scan_dcp_metadata` names its globals without running it.

In pytorch's tree this replaces ``MultiProcessTestCase`` (whose ``_spawn_processes`` it does the work of) and
``DTensorTestBase`` with ``@with_comms`` (the process group exists while the body runs); the test class may
still derive from ``torch.testing._internal.common_utils.TestCase``, which the library never imports.
"""

from __future__ import annotations

import datetime
import functools
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import unittest
from typing import Any, Callable, ClassVar, Optional, Sequence

from ..errors import RoundTripConfigError, dimension

#: Seconds a multi-rank test may take by default (the class's ``rank_timeout``).
TIMEOUT = float(os.environ.get("TORCH_SERIAL_TESTING_RANK_TIMEOUT", "300"))
#: Seconds the other ranks are given to finish once one failed (they usually wait in a collective for it).
GRACE = 10.0
_SPEC_ENV = "TORCH_SERIAL_TESTING_RANK_SPEC"
_REPORT_ENV = "TORCH_SERIAL_TESTING_REPORT"  # the parent reports the ranks' loads; a rank writes none itself
_BOOT = "from torch_serial_testing.paths.distributed import rank_main; rank_main()"
_here: Optional[dict[str, Any]] = None  # in a rank process: its spec (rank, world size, shared folder)


class RankFailure(AssertionError):
    """A rank of a multi-rank test failed, raised an error, died or did not finish in time."""


def at_world_sizes(*sizes: int) -> Callable[[Any], Any]:
    """The world sizes of one test method (instead of the class's ``world_sizes``)."""
    checked = _checked(sizes, "at_world_sizes")

    def decorate(fn: Any) -> Any:
        if not callable(fn):
            raise RoundTripConfigError("at_world_sizes(...) decorates a test method: put it above 'def test_...'")
        fn._tst_world_sizes = checked
        return fn

    return decorate


def _checked(sizes: Any, where: str) -> tuple[int, ...]:
    sizes = dimension("world_sizes", sizes, "(2,)")
    if not all(isinstance(n, int) and not isinstance(n, bool) and n >= 1 for n in sizes):
        raise RoundTripConfigError(f"{where}: world sizes are positive ints such as (2,) or (1, 4), got {sizes!r}")
    return sizes


def unavailable() -> Optional[str]:
    """Why multi-rank tests cannot run here (no torch.distributed, no gloo), or None."""
    import torch.distributed as dist

    if not dist.is_available():
        return "torch.distributed is not available in this torch build"
    if not dist.is_gloo_available():
        return "the gloo backend is not available in this torch build"
    return None


def _loopback() -> str:
    names = [name for _index, name in socket.if_nameindex() if name.startswith("lo")]
    return names[0] if names else "lo"


class MultiRankRoundTrips:
    """Mixin for a :class:`~torch_serial_testing.SerializationRoundTripTestCase`: its tests run in N ranks."""

    #: The world sizes every test of the class runs at (``@at_world_sizes(...)`` for one test).
    world_sizes: ClassVar[Sequence[int]] = (2,)
    #: Seconds a test may take, all ranks together, before the ranks still running are killed.
    rank_timeout: ClassVar[float] = TIMEOUT

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)  # the core wraps the test methods first
        sizes = _checked(cls.world_sizes, f"{cls.__name__}.world_sizes")
        for name, fn in list(vars(cls).items()):
            if not name.startswith("test") or not callable(fn) or hasattr(fn, "_tst_world_size"):
                continue
            delattr(cls, name)
            for n in getattr(fn, "_tst_world_sizes", sizes):
                if hasattr(cls, f"{name}_world_size_{n}"):
                    raise RoundTripConfigError(f"{cls.__name__}.{name}_world_size_{n} exists already; rename one")
                setattr(cls, f"{name}_world_size_{n}", _in_ranks(fn, n, f"{name}_world_size_{n}"))

    @property
    def rank(self) -> int:
        """This process's rank (0 outside a rank process)."""
        return _here["rank"] if _here else 0

    @property
    def world_size(self) -> int:
        return _here["world_size"] if _here else 1

    @property
    def shared_dir(self) -> str:
        """A folder every rank of this test sees (removed after the test)."""
        if _here is None:
            raise RoundTripConfigError("shared_dir exists only while a multi-rank test runs in its ranks")
        return str(_here["shared"])

    def device_mesh(self, shape: Optional[Sequence[int]] = None, names: Optional[Sequence[str]] = None) -> Any:
        """``init_device_mesh`` on this test's device type over all ranks (1-D unless *shape* says otherwise)."""
        from torch.distributed.device_mesh import init_device_mesh

        test: Any = self
        shape = tuple(shape) if shape is not None else (self.world_size,)
        return init_device_mesh(test.device_type, shape, mesh_dim_names=tuple(names) if names else None)

    def assertDTensorEqual(self, expected: Any, actual: Any) -> None:  # noqa: N802 - unittest naming
        """Exactly the same DTensor: type, mesh (ranks, device type, dim names), placements, this rank's local
        shard and the full tensor (``full_tensor()``, a collective: every rank calls it)."""
        from torch.distributed.tensor import DTensor

        test: Any = self
        test.assertIs(type(actual), DTensor, f"loaded a {type(actual).__name__}, not a DTensor")
        emesh, amesh = expected.device_mesh, actual.device_mesh
        test.assertEqual(amesh.mesh.tolist(), emesh.mesh.tolist(), "the device mesh's ranks")
        test.assertEqual((amesh.device_type, amesh.mesh_dim_names), (emesh.device_type, emesh.mesh_dim_names))
        test.assertEqual(tuple(actual.placements), tuple(expected.placements), "the placements")
        test.assertRoundTripEqual(expected.to_local(), actual.to_local())
        test.assertRoundTripEqual(expected.full_tensor(), actual.full_tensor())


def _in_ranks(fn: Callable[..., Any], world_size: int, name: str) -> Callable[..., Any]:
    @functools.wraps(fn)
    def in_ranks(self: Any, *args: Any, **kwargs: Any) -> Any:
        if _here is not None:  # a rank: the body
            return fn(self, *args, **kwargs)
        return run_ranks(self, world_size)

    in_ranks.__name__ = in_ranks.__qualname__ = name
    in_ranks._tst_world_size = world_size  # type: ignore[attr-defined]
    return in_ranks


def run_ranks(test: Any, world_size: int) -> None:
    """Run *test* (its id) in *world_size* rank processes; report their loads, fail naming a failed rank."""
    if reason := unavailable():
        raise unittest.SkipTest(reason)
    if (device := getattr(test, "device_type", "cpu")) != "cpu":
        raise unittest.SkipTest(f"multi-rank tests run on gloo, on CPU: {device} ranks need their own backend")
    cls = type(test)
    main = sys.modules.get("__main__")
    main_file = getattr(main, "__file__", None) if cls.__module__ in ("__main__", "__mp_main__") else None
    timeout = float(getattr(test, "rank_timeout", TIMEOUT))
    with tempfile.TemporaryDirectory(prefix="tst-ranks-") as tmp:
        os.mkdir(shared := os.path.join(tmp, "shared"))
        spec = {
            "world_size": world_size,
            "store": os.path.join(tmp, "store"),
            "shared": shared,
            "test": f"{cls.__qualname__}.{test._testMethodName}",
            "module": "__main__" if main_file else cls.__module__,
            "main_file": os.path.abspath(main_file) if main_file else None,
            "timeout": timeout,
            "parent": os.getpid(),
        }
        paths = [os.path.abspath(p or os.getcwd()) for p in sys.path]
        env = {k: v for k, v in os.environ.items() if k != _REPORT_ENV}
        env.update(PYTHONPATH=os.pathsep.join(dict.fromkeys(paths)), GLOO_SOCKET_IFNAME=_loopback())
        env.setdefault("OMP_NUM_THREADS", "1")  # N ranks share the machine's cores
        ranks = []
        try:
            for rank in range(world_size):
                out = open(os.path.join(tmp, f"rank{rank}.out"), "wb")
                rank_env = {**env, _SPEC_ENV: json.dumps({**spec, "rank": rank, "result": f"{tmp}/rank{rank}.json"})}
                proc = subprocess.Popen(
                    [sys.executable, "-c", _BOOT], env=rank_env, stdin=subprocess.DEVNULL, stdout=out,
                    stderr=subprocess.STDOUT, start_new_session=True,
                )  # fmt: skip
                ranks.append((proc, out))
            stopped = _wait([p for p, _ in ranks], timeout)
        finally:
            for proc, out in ranks:
                _kill(proc)
                out.close()
        results = [_read_result(tmp, r) for r in range(world_size)]
        outputs = [_tail(os.path.join(tmp, f"rank{r}.out")) for r in range(world_size)]
    _conclude(test, world_size, [p.returncode for p, _ in ranks], stopped, results, outputs)


def _wait(procs: list[subprocess.Popen], timeout: float) -> dict[int, str]:
    """Wait for every rank; {rank: why it was killed} for those stopped (timeout, or after another failed)."""
    start, failed_at, stopped = time.monotonic(), None, {}
    while any(p.poll() is None for p in procs):
        now = time.monotonic()
        if failed_at is None and any(p.returncode not in (None, 0) for p in procs):
            failed_at = now
        if now - start > timeout or (failed_at is not None and now - failed_at > GRACE):
            first = next((r for r, p in enumerate(procs) if p.returncode not in (None, 0)), None)
            why = (
                f"did not finish within the test's rank_timeout of {timeout:g} s (a hung rank; raise "
                "rank_timeout or TORCH_SERIAL_TESTING_RANK_TIMEOUT if it is only slow); killed"
                if failed_at is None or first is None
                else f"was still running {GRACE:g} s after rank {first} failed (waiting for it in a "
                "collective?); killed"
            )
            for r, p in enumerate(procs):
                if p.poll() is None:
                    stopped[r] = why
                    _kill(p)
            break
        time.sleep(0.02)
    return stopped


def _kill(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # the rank and anything it started
        except (ProcessLookupError, PermissionError):
            proc.kill()
    proc.wait()


def _read_result(tmp: str, rank: int) -> Optional[dict[str, Any]]:
    try:
        with open(os.path.join(tmp, f"rank{rank}.json"), encoding="utf-8") as fh:
            return dict(json.load(fh))
    except (OSError, ValueError):
        return None


def _tail(path: str, limit: int = 6000) -> str:
    with open(path, "rb") as fh:
        data = fh.read()
    text = data[-limit:].decode("utf-8", "replace")
    return ("...\n" if len(data) > limit else "") + text


def _conclude(test: Any, world_size: int, codes: list[Any], stopped: dict[int, str], results: list[Any],
              outputs: list[str]) -> None:  # fmt: skip
    from ..outcomes import report

    for rank, result in enumerate(results):
        for rec in (result or {}).get("records", ()):
            where = f"rank {rank}" + (f" {rec['subtest']}" if rec["subtest"] else "")
            report(test, rec["kind"], rec["mode"], rec["loaded"], rec["weights_only"], f"{where}: {rec['summary']}")
    problems = []
    for rank, (code, result, output) in enumerate(zip(codes, results, outputs)):
        head = f"rank {rank} of {world_size}"
        if rank in stopped:
            problems.append(f"{head} {stopped[rank]}; its output:\n{output}")
        elif result is None:
            problems.append(f"{head} exited with code {code} before reporting its result; its output:\n{output}")
        else:
            problems += [f"{head}: {kind} in {where}\n{tb}" for kind, where, tb in result["problems"]]
    if problems:
        raise RankFailure(f"{test.id()} failed in its ranks:\n\n" + "\n\n".join(problems))
    skips = [(r, res["skipped"]) for r, res in enumerate(results) if res and res["skipped"]]
    if skips and len(skips) == world_size:
        raise unittest.SkipTest(f"skipped in every rank: {skips[0][1]}")
    if skips:
        raise RankFailure(
            f"{test.id()}: rank {skips[0][0]} skipped ({skips[0][1]}) while other ranks ran it: a multi-rank test "
            "skips in every rank or in none (decide the skip from what every rank sees)"
        )


METADATA = ".metadata"  #: the file DCP's FileSystemWriter writes its Metadata to


def scan_dcp_metadata(checkpoint_dir: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The globals of a DCP checkpoint's ``.metadata``, scanned by the core's opcode walker, nothing executed:
    (as torch's weights-only unpickler spells them, every global a full unpickle resolves).

    ``.metadata`` is a plain pickle: ``FileSystemReader.read_metadata`` reads it with ``pickle.load``, outside
    ``torch.load`` and its ``weights_only`` (``TORCH_FORCE_WEIGHTS_ONLY_LOAD`` does not reach it): whatever it
    names is imported and called.  Read only a ``.metadata`` you (or your own test) wrote."""
    from ..model import ScanState, default_scan_limits
    from ..walker import scan_pickle

    with open(os.path.join(checkpoint_dir, METADATA), "rb") as fh:
        data = fh.read()
    state = ScanState(default_scan_limits())
    scan_pickle(data, 0, state, zip_format=False)
    return tuple(sorted(state.globals)), tuple(sorted(state.full_load_globals))


# -- in a rank process ----------------------------------------------------------------------------


def _watch_parent(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(0.5)
    os._exit(3)  # the test process is gone: no orphan rank


def rank_main() -> None:
    """The entry point of a rank process (started by :func:`run_ranks`)."""
    global _here
    spec = _here = json.loads(os.environ.pop(_SPEC_ENV))
    threading.Thread(target=_watch_parent, args=(spec["parent"],), daemon=True).start()
    import torch.distributed as dist

    dist.init_process_group(
        "gloo",
        init_method=f"file://{spec['store']}",
        rank=spec["rank"],
        world_size=spec["world_size"],
        timeout=datetime.timedelta(seconds=spec["timeout"]),
    )
    result, tests = unittest.TestResult(), []
    try:
        suite = _load(spec)
        tests = _flat(suite)  # (a suite forgets its tests as it runs them)
        suite.run(result)
    finally:
        dist.destroy_process_group()
    problems = [("ERROR", str(t), tb) for t, tb in result.errors] + [("FAIL", str(t), tb) for t, tb in result.failures]
    problems += [("unexpected success", str(t), "") for t in result.unexpectedSuccesses]
    from ..outcomes import records

    recs = [{**r.__dict__} for t in tests for r in records(t)]
    answer = {"problems": problems, "skipped": "; ".join(why for _t, why in result.skipped), "records": recs}
    with open(spec["result"] + ".part", "w", encoding="utf-8") as fh:
        json.dump(answer, fh)
    os.replace(spec["result"] + ".part", spec["result"])
    sys.exit(1 if problems else 0)  # a failed rank's peers get GRACE seconds, not the whole timeout


def _load(spec: dict[str, Any]) -> unittest.TestSuite:
    if spec["main_file"]:  # a test file run as a script: run again under the name multiprocessing gives it
        import runpy

        namespace = runpy.run_path(spec["main_file"], run_name="__mp_main__")
        module: Any = type(sys)("__mp_main__")
        module.__dict__.update(namespace)
        sys.modules["__mp_main__"] = module
        return unittest.defaultTestLoader.loadTestsFromName(spec["test"], module)
    return unittest.defaultTestLoader.loadTestsFromName(f"{spec['module']}.{spec['test']}")


def _flat(suite: Any) -> list[Any]:
    return [t for s in suite for t in _flat(s)] if isinstance(suite, unittest.TestSuite) else [suite]
