"""A fork server: a ``python -I`` process that imported exactly the modules asked for, forking one child per request.

Started on first use, once per test process and set of imports (:func:`server`).  Its ``sys.path`` is the
isolated one (no ``PYTHON*`` variables, no user site, not the caller's directory) plus, in front, the folder
from which this process imports each requested top-level package (and the library), where the isolated path
would find another copy or none.  It imports the modules in order, then the handler module (whose
``prepare()`` readies it), and serves: each request goes to a child forked from it ahead of the request
(right after the previous answer, so the fork is not in the next request's time), which runs ``handle(header,
payload)`` once, sends the answer back and exits -- so no request sees what another changed.  Bounds: a
request's *timeout* (the child is killed and the answer says so), :data:`MEMORY_MIB` MiB of address space a
child may add to the server's (``RLIMIT_AS``, enforced on Linux), a child's own alarm should the server be
gone.  The server reads its pipe and exits at end of file, so it ends with this process; :func:`shutdown`
(at exit, or from a session-end hook) ends them all.  Output goes to unlinked temporary files.  Messages are a
JSON header and a byte payload, each length-prefixed."""

from __future__ import annotations

import atexit
import gc
import importlib.util
import json
import os
import select
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from dataclasses import dataclass
from typing import Any, Optional, Sequence

from ..errors import RoundTripConfigError, UnexpectedLoadOutcome

#: Seconds one request may take by default (a server's start: :data:`START_TIMEOUT`).
TIMEOUT = float(os.environ.get("TORCH_SERIAL_TESTING_FRESH_TIMEOUT", "120"))
START_TIMEOUT = 600.0
#: Address space (MiB) a load's child may add to the server's, where ``RLIMIT_AS`` is enforced.
MEMORY_MIB = int(os.environ.get("TORCH_SERIAL_TESTING_FRESH_MEMORY_MIB", "4096"))
SWITCHES = ("TORCH_FORCE_WEIGHTS_ONLY_LOAD", "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD")


def fork_unavailable() -> Optional[str]:
    """Why fresh loads cannot run here (no ``os.fork``), or None."""
    if not hasattr(os, "fork") or sys.platform.startswith(("win", "cygwin", "emscripten", "wasi")):
        return f"fresh-interpreter loads need os.fork (Linux, macOS); {sys.platform} has none"
    return None


# -- framing: a JSON header and a byte payload, each length-prefixed -----------------------------------


def _send(fd: int, header: dict, payload: bytes = b"") -> None:
    head = json.dumps(header).encode()
    data = memoryview(struct.pack("<IQ", len(head), len(payload)) + head + payload)
    while data:
        data = data[os.write(fd, data) :]


def _read_exact(fd: int, n: int, deadline: float) -> bytes:
    chunks, left = [], n
    while left:
        wait = None if deadline == float("inf") else max(0.0, deadline - time.monotonic())
        if not select.select([fd], [], [], wait)[0]:
            raise TimeoutError
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            raise EOFError
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def _receive(fd: int, deadline: float) -> tuple[dict, bytes]:
    nhead, npayload = struct.unpack("<IQ", _read_exact(fd, 12, deadline))
    return json.loads(_read_exact(fd, nhead, deadline)), _read_exact(fd, npayload, deadline)


# -- this process: the servers, one per set of imports ---------------------------------------------------


def _where(module: str) -> str:
    """The folder or file this process imports top-level *module* from (imported or not; importing nothing)."""
    top = module.partition(".")[0]
    loaded = sys.modules.get(top)
    spec = getattr(loaded, "__spec__", None) or importlib.util.find_spec(top)
    if spec is None:
        raise RoundTripConfigError(f"fresh interpreter: no module named {top!r} here, so none to import there")
    locations = list(spec.submodule_search_locations or ())
    if not (locations or spec.origin) or spec.origin in ("built-in", "frozen"):
        return ""  # the standard library's own: found by any interpreter
    return os.path.abspath(locations[0] if locations else str(spec.origin))


def _packages(modules: Sequence[str]) -> dict[str, str]:
    return {m.partition(".")[0]: _where(m) for m in modules if not m.startswith("__")}


#: The server's first line: the library from where this process has it (the same copy), then :func:`_serve`.
_BOOT = """import importlib.util, json, os, sys
spec = json.loads(sys.argv[1])
where, found = spec["packages"]["torch_serial_testing"], importlib.util.find_spec("torch_serial_testing")
if found is None or os.path.abspath(list(found.submodule_search_locations)[0]) != where:
    sys.path.insert(0, os.path.dirname(where))
from torch_serial_testing.paths.forkserver import _serve
_serve(spec)
"""


class _Server:
    def __init__(self, imports: tuple[str, ...], handler: str) -> None:
        self.imports, self.owner, self.lock = imports, os.getpid(), threading.Lock()
        packages = _packages(("torch_serial_testing", *imports))
        self.log = tempfile.TemporaryFile()  # unlinked: nothing left behind
        env = {k: v for k, v in os.environ.items() if k not in SWITCHES}
        spec = json.dumps({"imports": imports, "packages": packages, "handler": handler})
        self.proc = subprocess.Popen(
            [sys.executable, "-I", "-c", _BOOT, spec],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.log,
            env=env,
            start_new_session=True,  # a terminal's ^C goes to the test, which then closes the pipe
        )
        try:
            self.hello = self._receive(START_TIMEOUT, "starting")[0]
        except BaseException:
            self.close()
            raise
        if "error" in self.hello:
            self.close()
            raise RoundTripConfigError(f"fresh interpreter importing {', '.join(imports)}: {self.hello['error']}")

    def _output(self) -> str:
        self.log.seek(0)
        return self.log.read()[-4000:].decode(errors="replace")

    def _receive(self, timeout: float, what: str) -> tuple[dict, bytes]:
        assert self.proc.stdout is not None
        try:
            return _receive(self.proc.stdout.fileno(), time.monotonic() + timeout)
        except (TimeoutError, EOFError, struct.error) as e:
            output = self._output()
            self.close()
            why = f"did not answer within {timeout:.0f} s" if isinstance(e, TimeoutError) else "exited"
            raise UnexpectedLoadOutcome(
                f"the fresh interpreter importing {', '.join(self.imports)} {why} {what}; its output:\n{output}"
            ) from None

    def ask(self, header: dict, payload: bytes = b"", timeout: float = TIMEOUT) -> tuple[dict, bytes]:
        assert self.proc.stdin is not None
        with self.lock:
            _send(self.proc.stdin.fileno(), {**header, "timeout": timeout}, payload)
            return self._receive(timeout + 30, f"while {header['what']}")  # the server kills a late child itself

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                if self.proc.stdin:
                    self.proc.stdin.close()  # end of file: the server exits
                self.proc.wait(10)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe and not pipe.closed:
                pipe.close()
        self.log.close()
        for key in [k for k, v in _servers.items() if v is self]:
            _servers.pop(key)


_servers: dict[tuple[str, ...], _Server] = {}
_servers_lock = threading.Lock()


def server(imports: Sequence[str], handler: str) -> _Server:
    """The server that imported exactly *imports*, then *handler* (a module with ``prepare()`` and
    ``handle(header, payload) -> (answer, payload)``), started on first use in this process."""
    key = (handler, *imports)
    with _servers_lock:
        found = _servers.get(key)
        if found is not None and (found.owner != os.getpid() or found.proc.poll() is not None):
            _servers.pop(key)  # a forked test process's copy, or one that died: start another
            found = None
        if found is None:
            found = _servers[key] = _Server(tuple(imports), handler)
        return found


@atexit.register
def shutdown() -> None:
    """Stop every fresh-interpreter server this process started (they also stop when it exits)."""
    with _servers_lock:
        for s in list(_servers.values()):
            if s.owner == os.getpid():
                s.close()
        _servers.clear()


# -- the server and its children ------------------------------------------------------------


def _place(packages: dict[str, str]) -> None:
    """Put on ``sys.path`` the folder of each package this interpreter would find elsewhere or not at all."""
    for top, location in packages.items():
        spec = importlib.util.find_spec(top) if location else None
        found = spec and os.path.abspath(list(spec.submodule_search_locations or [spec.origin or ""])[0])
        if location and found != location:
            sys.path.insert(0, os.path.dirname(location))
            importlib.invalidate_caches()


def _serve(spec: dict) -> None:
    """The server's life: import, answer the hello, then fork one child per request until end of file."""
    proto_in, proto_out = os.dup(0), os.dup(1)
    os.dup2(2, 1)  # whatever imports print goes to the log, never into the protocol
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    try:
        _place(spec["packages"])
        for module in spec["imports"]:
            importlib.import_module(module)
        handler = importlib.import_module(spec["handler"])  # after them: what it imports must change nothing
        handler.prepare()
        gc.collect()
        gc.freeze()  # the server's objects are never collected in its children: their pages stay shared
    except BaseException as e:  # noqa: BLE001 - reported to the test, which names the imports
        _send(proto_out, {"error": f"the import failed: {type(e).__name__}: {e}"})
        return
    _send(proto_out, {"modules": sorted(sys.modules), "path": sys.path, "pid": os.getpid()})
    spare = _spawn(handler.handle, proto_in, proto_out)
    while True:
        try:
            header, payload = _receive(proto_in, float("inf"))
        except (EOFError, struct.error):
            return  # the test process closed the pipe (or died): this server (and its spare child) end with it
        answer, data, used = _answer(spare, header, payload, proto_in)
        _send(proto_out, answer, data)
        spare = _spawn(handler.handle, proto_in, proto_out)  # while the test runs on: no fork in the next load
        if used is not None:
            os.waitpid(used, 0)


@dataclass
class _Spare:
    """A child forked ahead of its request: it waits on *requests*, answers on *answers*, prints into *log*."""

    pid: int
    requests: int
    answers: int
    log: Any


def _spawn(handle: Any, proto_in: int, proto_out: int) -> _Spare:
    """Fork the child that will serve the next request: one request, then ``_exit`` (nothing of the server's
    state is cleaned up twice); at end of file on its requests (the server is gone) it just exits."""
    (req_r, req_w), (ans_r, ans_w), log = os.pipe(), os.pipe(), tempfile.TemporaryFile()
    pid = os.fork()
    if pid == 0:
        data = b""
        try:
            for fd in (req_w, ans_r, proto_in, proto_out):
                os.close(fd)
            for fd in (1, 2):
                os.dup2(log.fileno(), fd)
            gc.disable()  # a collection would touch, and so copy, every page of the server's objects
            try:
                header, payload = _receive(req_r, float("inf"))
            except (EOFError, struct.error):
                os._exit(0)
            signal.alarm(int(header["timeout"]) + 5)  # ends it even if the server is gone
            _limit_memory()
            answer, data = handle(header, payload)
        except BaseException as e:  # noqa: BLE001 - everything goes back to the test
            answer, data = {"raise": "error", "message": "".join(traceback.format_exception(e))}, b""
        try:
            _send(ans_w, answer, data)
        finally:
            os._exit(0)
    os.close(req_r)
    os.close(ans_w)
    return _Spare(pid, req_w, ans_r, log)


def _answer(spare: _Spare, header: dict, payload: bytes, proto_in: int) -> tuple[dict, bytes, Optional[int]]:
    """Hand the request to *spare* and read its answer, within the request's timeout; the child to reap."""
    timeout = float(header["timeout"])
    try:
        _send(spare.requests, header, payload)
    except BrokenPipeError:
        pass  # it died before reading it all: said below
    os.close(spare.requests)
    received, deadline, late = bytearray(), time.monotonic() + timeout, False
    while not _complete(received):
        ready = select.select([spare.answers, proto_in], [], [], max(0.0, deadline - time.monotonic()))[0]
        if proto_in in ready or not ready:  # the test process went away, or the load is late
            os.kill(spare.pid, signal.SIGKILL)
            late = not ready
            break
        chunk = os.read(spare.answers, 1 << 20)
        if not chunk:
            break
        received += chunk
    os.close(spare.answers)
    if _complete(received) and not late:  # answered: the child is reaped after the answer is sent on
        spare.log.close()
        nhead = struct.unpack("<IQ", bytes(received[:12]))[0]
        return json.loads(bytes(received[12 : 12 + nhead])), bytes(received[12 + nhead :]), spare.pid
    status = os.waitpid(spare.pid, 0)[1]
    spare.log.seek(0)
    output = spare.log.read()[-3000:].decode(errors="replace")
    spare.log.close()
    if late:
        return {"raise": "UnexpectedLoadOutcome", "message": f"timed out after {timeout:.0f} s"}, b"", None
    how = f"killed by {signal.Signals(os.WTERMSIG(status)).name}" if os.WIFSIGNALED(status) else "exited"
    memory = f" (its address space is bounded to {MEMORY_MIB} MiB more than the server's)"
    return {"raise": "UnexpectedLoadOutcome", "message": f"the child {how}{memory}; output:\n{output}"}, b"", None


def _complete(received: bytearray) -> bool:
    return len(received) >= 12 and len(received) >= 12 + sum(struct.unpack("<IQ", bytes(received[:12])))


def _limit_memory() -> None:
    try:
        import resource

        with open("/proc/self/statm") as fh:
            size = int(fh.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
        resource.setrlimit(resource.RLIMIT_AS, (size + MEMORY_MIB * 2**20, resource.RLIM_INFINITY))
    except (OSError, ValueError, ImportError):
        pass  # macOS: no /proc, and RLIMIT_AS is not enforced there; the timeout still bounds a load
