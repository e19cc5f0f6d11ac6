"""Observe every ``torch.load`` and ``torch.save`` of this process, one JSONL record per call.

:func:`enable` turns ``torch.load``/``torch.save`` into properties of the ``torch`` module (its class
becomes a subclass of ``ModuleType``): reading one gives an audited wrapper of whatever function is
stored there now, so a loader installed later (torch_npu replaces ``torch.load`` at import) is observed
as the call the test made, and assigning stores the new function as before.  Every call goes through to
the stored function with the same arguments; its result or exception is the caller's, unchanged.  The
record is written after the call (:mod:`.analysis` builds it), as one ``os.write`` to a file opened with
``O_APPEND``, so several processes (xdist workers) can share one report.
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

__all__ = ["enable", "enabled", "current_test", "call_site", "write_record", "install_unittest_hook"]

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
    if _State.report is None:
        return
    line = (json.dumps(record, default=str) + "\n").encode("utf-8")
    fd = os.open(_State.report, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


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


def _saved_bytes(f: Any, start: Optional[int]) -> Optional[bytes]:
    """The bytes a finished ``torch.save`` wrote to *f* (from offset *start* of a buffer)."""
    try:
        if isinstance(f, (str, os.PathLike)):
            with open(f, "rb") as fh:
                return fh.read(MAX_ANALYSED_BYTES)
        if isinstance(f, io.BytesIO):
            return f.getbuffer()[start or 0 :].tobytes()
        if start is not None and getattr(f, "readable", lambda: False)() and f.seekable():
            end = f.tell()
            try:
                f.seek(start)
                return f.read(min(end - start, MAX_ANALYSED_BYTES))
            finally:
                f.seek(end)
        name = getattr(f, "name", None)
        if isinstance(name, str) and os.path.isfile(name) and hasattr(f, "flush"):
            f.flush()
            with open(name, "rb") as fh:
                fh.seek(start or 0)
                return fh.read(MAX_ANALYSED_BYTES)
    except (OSError, ValueError, TypeError, AttributeError):
        pass
    return None


def _audited_load(inner: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(inner)
    def load(f: Any, *args: Any, **kwargs: Any) -> Any:
        if _busy() or _State.report is None:
            return inner(f, *args, **kwargs)
        with _Busy():
            test, site = current_test(), call_site()
            data, path = _read_source(f)
        try:
            result = inner(f, *args, **kwargs)
        except BaseException as e:
            _record_load(inner, test, site, data, path, args, kwargs, e)
            raise
        _record_load(inner, test, site, data, path, args, kwargs, None)
        return result

    load._tst_audited = inner  # type: ignore[attr-defined]
    return load


def _record_load(
    inner: Callable[..., Any],
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
        record = load_record(inner, test, site, data, path, args, kwargs, error, _State.saved)
        write_record(record)


def _audited_save(inner: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(inner)
    def save(obj: Any, f: Any, *args: Any, **kwargs: Any) -> Any:
        if _busy() or _State.report is None:
            return inner(obj, f, *args, **kwargs)
        with _Busy():
            test, site = current_test(), call_site()
            try:
                start: Optional[int] = None if isinstance(f, (str, os.PathLike)) else f.tell()
            except (OSError, ValueError, AttributeError):
                start = None
        result = inner(obj, f, *args, **kwargs)
        with _Busy():
            _record_save(_saved_bytes(f, start), test, site)
        return result

    save._tst_audited = inner  # type: ignore[attr-defined]
    return save


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
    (:func:`~..scan.checkpoint.add_save_listener`: they call torch's genuine ``save``) (idempotent)."""
    from ...checkpoint import add_save_listener

    add_save_listener(_library_saved)
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
