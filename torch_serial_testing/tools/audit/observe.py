"""Observe every ``torch.load`` and ``torch.save`` of this process, one JSONL record per call.

:func:`enable` turns ``torch.load``/``torch.save`` into properties of the ``torch`` module (its class
becomes a subclass of ``ModuleType``): reading one gives an audited wrapper of whatever function is
stored there now, so a loader installed later (torch_npu replaces ``torch.load`` at import) is observed
as the call the test made, and assigning stores the new function as before.  Every call goes through to
the stored function with the same arguments; its result or exception is the caller's, unchanged.  The
record is written after the call (:mod:`.analysis` builds it), as one ``os.write`` to a file opened with
``O_APPEND``, so several processes (xdist workers) can share one report, and ``O_NOFOLLOW``: the audit
never writes through a symbolic link (:func:`write_file`).  A save is remembered by the sha256 of exactly
the bytes it wrote (its stream's position before and after it), never of what a reused buffer held beyond.
The wrappers are hidden from pytest's tracebacks (``__tracebackhide__``).
"""

from __future__ import annotations

import functools
import io
import json
import os
import sys
import threading
import types
from typing import Any, Callable, Optional

__all__ = [
    "enable",
    "enabled",
    "current_test",
    "call_site",
    "write_record",
    "write_file",
    "ReportPathError",
    "install_unittest_hook",
]

#: Checkpoints bigger than this are observed, not read a second time for the analysis.
MAX_ANALYSED_BYTES = 512 * 1024 * 1024
#: Modules whose frames are never a call site: torch, torch_npu, this package.
_LIBRARY_PREFIXES = ("torch.", "torch_npu.", "torch_serial_testing.")
_LIBRARY_NAMES = ("torch", "torch_npu", "torch_serial_testing")


class _State:
    report: Optional[str] = None
    #: sha256 of bytes torch.save wrote in this process -> (test, site) of that save.
    saved: dict[str, tuple[Optional[str], Optional[str]]] = {}
    unittest_test: Optional[str] = None
    local = threading.local()
    lock = threading.Lock()


def enabled() -> bool:
    return _State.report is not None


def enable(report: str) -> None:
    """Observe this process's loads and saves into the JSONL file *report* (imports torch)."""
    _State.report = os.path.abspath(report)
    import torch

    install_torch(torch)
    install_unittest_hook()


def write_record(record: dict[str, Any]) -> None:
    """Append *record* to the report as one line, in one write (safe across processes)."""
    if _State.report is not None:
        write_file(_State.report, json.dumps(record, default=str) + "\n", append=True)


def write_file(path: str, text: str, append: bool = False) -> None:
    """Write *text* to *path* (created if missing, emptied first unless *append*) as one ``os.write``,
    never through a symbolic link: opened with ``O_NOFOLLOW``, a link there is refused, not followed
    (a committed ``serial-audit.jsonl -> ~/.bashrc`` would otherwise be emptied by the run)."""
    flags = os.O_WRONLY | os.O_CREAT | (os.O_APPEND if append else os.O_TRUNC) | getattr(os, "O_NOFOLLOW", 0)
    if not hasattr(os, "O_NOFOLLOW") and os.path.islink(path):
        raise ReportPathError(path)
    try:
        fd = os.open(path, flags, 0o644)
    except OSError as e:
        if os.path.islink(path):
            raise ReportPathError(path) from e
        raise
    try:
        os.write(fd, text.encode("utf-8"))
    finally:
        os.close(fd)


class ReportPathError(OSError):
    """The audit's report or Markdown file is a symbolic link: refused, never written through."""

    def __init__(self, path: str) -> None:
        try:
            target = f" (to {os.readlink(path)!r})"
        except OSError:
            target = ""
        super().__init__(
            f"{path!r} is a symbolic link{target}: the audit writes its files only where no link leads "
            "elsewhere; remove the link, or name another file"
        )


def current_test() -> Optional[str]:
    """The running test's id: unittest's in this process (``TestResult.startTest``), else pytest's
    PYTEST_CURRENT_TEST without the phase (inherited by a child process, it names the parent's test)."""
    if _State.unittest_test is not None:
        return _State.unittest_test
    running = os.environ.get("PYTEST_CURRENT_TEST")
    return running.rsplit(" (", 1)[0] if running else None


def call_site() -> Optional[str]:
    """``file.py:LINE`` of the innermost frame outside torch, torch_npu and this package."""
    frame: Optional[types.FrameType] = sys._getframe(1)
    while frame is not None:
        name = str(frame.f_globals.get("__name__", ""))
        if not (name in _LIBRARY_NAMES or name.startswith(_LIBRARY_PREFIXES)):
            path = frame.f_globals.get("__file__") or name
            return f"{_shown_path(str(path))}:{frame.f_lineno}"
        frame = frame.f_back
    return None


def _shown_path(path: str) -> str:
    full = os.path.abspath(path)
    rel = os.path.relpath(full, os.getcwd())
    return full if rel.startswith(os.pardir) else rel


# -- the wrappers -------------------------------------------------------------------------------------


def _busy() -> bool:
    return getattr(_State.local, "depth", 0) > 0


class _Busy:
    """Marks this thread as inside an observed call: nested loads and saves go straight through."""

    def __enter__(self) -> None:
        _State.local.depth = getattr(_State.local, "depth", 0) + 1

    def __exit__(self, *exc: Any) -> None:
        _State.local.depth -= 1


def _read_source(f: Any) -> tuple[Optional[bytes], Optional[str]]:
    """(the bytes a load of *f* reads, the file path if *f* names one), leaving *f* where it was."""
    try:
        if isinstance(f, (str, os.PathLike)):
            path = os.fspath(f)
            path = path.decode() if isinstance(path, bytes) else path
            if os.path.isfile(path) and os.path.getsize(path) <= MAX_ANALYSED_BYTES:
                with open(path, "rb") as fh:
                    return fh.read(), path
            return None, path
        if hasattr(f, "read") and hasattr(f, "seek") and hasattr(f, "tell"):
            start = f.tell()
            try:
                data = f.read(MAX_ANALYSED_BYTES + 1)
            finally:
                f.seek(start)
            name = getattr(f, "name", None)
            ok = isinstance(data, bytes) and len(data) <= MAX_ANALYSED_BYTES
            return (data if ok else None), (name if isinstance(name, str) else None)
    except (OSError, ValueError, TypeError, AttributeError):
        pass
    return None, None


def _saved_bytes(f: Any, start: Optional[int], end: Optional[int]) -> Optional[bytes]:
    """Exactly the bytes a finished ``torch.save`` wrote to *f*: offsets *start* to *end* (its position
    before and after the save), never what lay beyond them (a reused buffer keeps its old tail)."""
    try:
        if isinstance(f, (str, os.PathLike)):  # torch.save opened it "wb": the whole file is the save's
            with open(f, "rb") as fh:
                data = fh.read(MAX_ANALYSED_BYTES + 1)
            return data if len(data) <= MAX_ANALYSED_BYTES else None
        if start is None or end is None or not 0 <= end - start <= MAX_ANALYSED_BYTES:
            return None
        if isinstance(f, io.BytesIO):
            return f.getbuffer()[start:end].tobytes()
        if getattr(f, "readable", lambda: False)() and f.seekable():
            try:
                f.seek(start)
                data = f.read(end - start)
            finally:
                f.seek(end)
            return data if isinstance(data, bytes) and len(data) == end - start else None
        name = getattr(f, "name", None)
        if isinstance(name, str) and os.path.isfile(name) and hasattr(f, "flush"):
            f.flush()
            with open(name, "rb") as fh:
                fh.seek(start)
                data = fh.read(end - start)
            return data if len(data) == end - start else None
    except (OSError, ValueError, TypeError, AttributeError):
        pass
    return None


def _audited_load(inner: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(inner)
    def load(f: Any, *args: Any, **kwargs: Any) -> Any:
        __tracebackhide__ = True  # pytest: a failing load's traceback shows the test's call, then torch's
        if _busy() or _State.report is None:
            return inner(f, *args, **kwargs)
        with _Busy():
            test, site = current_test(), call_site()
            data, path = _read_source(f)
        try:
            result = inner(f, *args, **kwargs)
        except BaseException as e:
            _record_load(test, site, data, path, args, kwargs, e)
            raise
        _record_load(test, site, data, path, args, kwargs, None)
        return result

    load._tst_audited = inner  # type: ignore[attr-defined]
    return load


def _record_load(
    test: Optional[str],
    site: Optional[str],
    data: Optional[bytes],
    path: Optional[str],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    error: Optional[BaseException],
) -> None:
    if isinstance(error, (KeyboardInterrupt, SystemExit)):
        return
    from .analysis import load_record

    with _Busy():
        record = load_record(test, site, data, path, args, kwargs, error, _State.saved)
        write_record(record)


def _audited_save(inner: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(inner)
    def save(obj: Any, f: Any, *args: Any, **kwargs: Any) -> Any:
        __tracebackhide__ = True
        if _busy() or _State.report is None:
            return inner(obj, f, *args, **kwargs)
        with _Busy():
            test, site = current_test(), call_site()
            start = _position(f)
        result = inner(obj, f, *args, **kwargs)
        with _Busy():
            _record_save(_saved_bytes(f, start, _position(f)), test, site)
        return result

    save._tst_audited = inner  # type: ignore[attr-defined]
    return save


def _position(f: Any) -> Optional[int]:
    try:
        return None if isinstance(f, (str, os.PathLike)) else int(f.tell())
    except (OSError, ValueError, TypeError, AttributeError):
        return None


def _record_save(data: Optional[bytes], test: Optional[str], site: Optional[str]) -> None:
    from .analysis import digest

    key = digest(data) if data is not None else None
    if key is not None:
        with _State.lock:
            _State.saved[key] = (test, site)
    write_record({"event": "save", "test": test, "site": site, "digest": key})


def _library_saved(data: bytes) -> None:
    """A save of this package's (``Checkpoint.save``, by torch's own function, which no wrapper sees)."""
    if _busy() or _State.report is None:
        return
    with _Busy():
        _record_save(data, current_test(), call_site())


_WRAPPERS = {"load": _audited_load, "save": _audited_save}


def _audited_module_class(base: type) -> type:
    def attribute(name: str) -> property:
        cache: dict[int, tuple[Any, Any]] = {}  # id(stored function) -> (it, its wrapper)

        def get(module: Any) -> Any:
            stored = module.__dict__[name]
            hit = cache.get(id(stored))
            if hit is None or hit[0] is not stored:
                hit = cache[id(stored)] = (stored, _WRAPPERS[name](stored))
            return hit[1]

        def put(module: Any, value: Any) -> None:  # restoring a wrapper read earlier stores its function
            module.__dict__[name] = getattr(value, "_tst_audited", value)

        return property(get, put)

    return type("AuditedTorchModule", (base,), {"load": attribute("load"), "save": attribute("save")})


def install_torch(torch: Any) -> None:
    """Make ``torch.load``/``torch.save`` audited properties, and observe this package's own saves
    (:func:`~..scan.checkpoint.add_save_listener`: they call torch's genuine ``save``) (idempotent).  torch's
    own ``load`` is known from here on (:func:`~...serialization.genuine`), before any test can replace it:
    the analysis's trial loads call only it."""
    from ...checkpoint import add_save_listener
    from ...errors import ProbeFailed
    from ...serialization import genuine

    add_save_listener(_library_saved)
    try:
        genuine("load")
    except ProbeFailed:  # replaced before torch finished importing: every trial load says "not verified"
        pass
    if type(torch).__name__ != "AuditedTorchModule":
        torch.__class__ = _audited_module_class(type(torch))


def install_unittest_hook() -> None:
    """Follow unittest's running test (``TestResult.startTest``/``stopTest``) and write its outcome."""
    import unittest.result as ur

    cls = ur.TestResult
    if getattr(cls.startTest, "_tst_audited", None) is not None:
        return
    start, stop = cls.startTest, cls.stopTest

    @functools.wraps(start)
    def start_test(self: Any, test: Any) -> None:
        _State.unittest_test = test.id()
        self._tst_audit_counts = _counts(self)
        start(self, test)

    @functools.wraps(stop)
    def stop_test(self: Any, test: Any) -> None:
        try:
            stop(self, test)
        finally:
            before = getattr(self, "_tst_audit_counts", None)
            if before is not None:
                outcome = next((k for k, n in _counts(self).items() if n > before[k]), "passed")
                write_record({"event": "test", "test": test.id(), "outcome": outcome})
            _State.unittest_test = None

    start_test._tst_audited = start  # type: ignore[attr-defined]
    stop_test._tst_audited = stop  # type: ignore[attr-defined]
    cls.startTest, cls.stopTest = start_test, stop_test  # type: ignore[method-assign]


def _counts(result: Any) -> dict[str, int]:
    return {
        k: len(getattr(result, attr, ()) or ())
        for k, attr in (
            ("error", "errors"),
            ("failed", "failures"),
            ("skipped", "skipped"),
            ("xfailed", "expectedFailures"),
            ("xpassed", "unexpectedSuccesses"),
        )
    }
