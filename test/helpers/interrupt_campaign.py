"""Real SIGINTs at every bytecode of the library's restore code (run by test/testing/test_interrupts.py).

For each scenario the campaign first counts the points where CPython runs
pending signal handlers (function entry, backward jumps, after a call returns)
in the library code of the phase under test (per-instruction events from
``sys.monitoring`` on Python >= 3.12, whose 3.12.1 ``settrace`` delivers no opcode
events; opcode tracing before), then re-runs the
scenario once per point, raising a real SIGINT (``signal.raise_signal``) there (a point
inside a loop: at its first and its last occurrence, not at every iteration).  After
each run it checks that a KeyboardInterrupt came out (a held-back signal is
delivered, never lost) and that the process is consistent:

* ``cleanup``: a test that leaked everything, interrupted during its restore
  (cleanup, then the ``finally`` around the run): everything restored exactly.
* ``body``: the same test changing everything and then round-tripping, with a
  signal at every point of the library code it runs (loading, scanning
  excepted): everything restored exactly by the ``finally`` around the run.
* ``engine``: ``override_qengine('qnnpack')`` interrupted anywhere: the engine
  and allocator are as before, or still (qnnpack, installed) if the signal
  landed before the restore began; either way the next switch works.
* ``warnings``: a round trip observing torch's FORCE_NO warning, interrupted
  anywhere in that code: the proxy is gone and the next round trip observes.

The campaign needs SIGINT to run Python's handler.  A process started with SIGINT ignored
(a background job of a non-interactive shell, ``nohup``, some CI runners) inherits SIG_IGN and
Python then installs no handler, so the kernel discards every raised SIGINT and each point
would read "not interrupted".  So first, with the inherited setting, one leaky test runs and
must leave an ignored SIGINT ignored and the process restored; then the campaign installs
``signal.default_int_handler`` itself.

Prints one JSON line: {"startup": {"sigint_at_start": name, ...}, "scenarios": {scenario:
{"points": distinct points, "occurrences": n, "interrupted_at": runs, "inconsistent": [...],
"not_interrupted": [...], "seconds": s}}}.
"""

from __future__ import annotations

import dis
import json
import os
import signal
import sys
import time
from typing import Any, Callable, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))  # the project root: test.helpers, test.testing

import torch  # noqa: E402

import torch_serial_testing  # noqa: E402
from torch_serial_testing import load as loading
from torch_serial_testing.case import SerializationRoundTripTestCase
from torch_serial_testing import engines, serialization as loader, registry

from test.helpers.isolation_fixtures import Gate, READS_FORCE_NO, clean_env, process_state, run_tests  # noqa: E402
from test.testing.test_interrupts import _interrupted_class  # noqa: E402

#: The package folder: the campaign's files are named relative to it (``testing/case.py``).
LIB = os.path.dirname(os.path.abspath(torch_serial_testing.__file__))


_CALLS = {"CALL", "CALL_KW", "CALL_FUNCTION", "CALL_FUNCTION_KW", "CALL_FUNCTION_EX", "CALL_METHOD", "PRECALL"}
_delivery_cache: dict[Any, frozenset[int]] = {}


def delivery_points(code: Any) -> frozenset[int]:
    """Offsets where CPython runs a pending signal handler: function entry (RESUME), a backward
    jump, and right after a call returns (attributed here to the instruction that follows it)."""
    points = _delivery_cache.get(code)
    if points is None:
        out: set[int] = set()
        after_call = False
        for ins in dis.get_instructions(code):
            if ins.opname == "CACHE":
                continue
            if after_call or ins.opname in ("RESUME", "JUMP_BACKWARD", "JUMP_ABSOLUTE") or (ins.offset == 0):
                out.add(ins.offset)
            after_call = ins.opname in _CALLS and ins.opname != "PRECALL"
        points = _delivery_cache[code] = frozenset(out)
    return points


class Injector:
    """Counts signal delivery points in library code while armed and raises a real SIGINT at
    number *target*.  Fed per instruction by :func:`_traced` (``sys.monitoring`` or
    ``sys.settrace``)."""

    def __init__(
        self, target: Optional[int], arm_on: Optional[Any] = None, files: Optional[tuple[str, ...]] = None
    ) -> None:
        self.target = target
        self.count = 0
        self.armed = arm_on is None
        self.arm_on = arm_on
        self.files = tuple(os.path.join(LIB, f) for f in files) if files else (LIB,)
        missing = [f for f in self.files if not os.path.exists(f)]
        if missing:  # a renamed module would silently be watched nowhere
            raise SystemExit(f"the campaign names library files that do not exist: {missing}")
        self.where = ""
        self.seen: list[tuple[Any, int]] = []  # every point reached, in order (a counting run)

    def enter(self, code: Any) -> bool:
        """A function starts: arm on *arm_on*; whether its instructions are watched."""
        if self.arm_on is not None and code is self.arm_on:
            self.armed = True
        return code.co_filename.startswith(self.files)

    def at(self, code: Any, offset: int) -> None:
        """Before the instruction at *offset* of *code* (a watched function)."""
        if self.armed and offset in delivery_points(code):
            if self.count == self.target:
                self.where = f"{os.path.basename(code.co_filename)}:{code.co_name}@{offset}"
                self.count += 1
                signal.raise_signal(signal.SIGINT)
            else:
                if self.target is None:
                    self.seen.append((code, offset))
                self.count += 1

    # sys.settrace (Python <= 3.11: CPython 3.12.1 delivers no opcode events to settrace)
    def __call__(self, frame: Any, event: str, arg: Any) -> Optional[Callable[..., Any]]:
        if not self.enter(frame.f_code):
            return None
        frame.f_trace_opcodes = True
        frame.f_trace_lines = False
        frame.f_trace = self.local
        return self.local

    def local(self, frame: Any, event: str, arg: Any) -> Optional[Callable[..., Any]]:
        if event == "opcode":
            self.at(frame.f_code, frame.f_lasti)
        return self.local


def _traced(injector: Injector, fn: Callable[[], None]) -> bool:
    """Run *fn* under *injector*; True when a KeyboardInterrupt came out."""
    monitoring = getattr(sys, "monitoring", None)
    if monitoring is None:
        sys.settrace(injector)
        try:
            fn()
        except KeyboardInterrupt:
            return True
        finally:
            sys.settrace(None)
        return False
    tool = next(i for i in range(6) if monitoring.get_tool(i) is None)
    watched: list[Any] = []

    def on_start(code: Any, offset: int) -> Any:
        if injector.enter(code):
            if code not in watched:
                watched.append(code)
                monitoring.set_local_events(tool, code, monitoring.events.INSTRUCTION)
            return None
        return monitoring.DISABLE if code is not injector.arm_on else None

    monitoring.use_tool_id(tool, "interrupt_campaign")
    try:
        monitoring.register_callback(tool, monitoring.events.PY_START, on_start)
        monitoring.register_callback(tool, monitoring.events.INSTRUCTION, injector.at)
        monitoring.set_events(tool, monitoring.events.PY_START)
        try:
            fn()
        except KeyboardInterrupt:
            return True
        finally:
            monitoring.set_events(tool, 0)
            for code in watched:
                monitoring.set_local_events(tool, code, 0)
    finally:
        monitoring.register_callback(tool, monitoring.events.PY_START, None)
        monitoring.register_callback(tool, monitoring.events.INSTRUCTION, None)
        monitoring.free_tool_id(tool)
        monitoring.restart_events()
    return False


def campaign(
    name: str,
    scenario: Callable[[], None],
    consistent: Callable[[], Optional[str]],
    arm_on: Any = None,
    files: Optional[tuple[str, ...]] = None,
) -> dict[str, Any]:
    started = time.monotonic()
    counter = Injector(None, arm_on, files)
    _traced(counter, scenario)
    problem = consistent()
    if problem:
        raise SystemExit(f"{name}: inconsistent without any interrupt: {problem}")
    # A point inside a loop recurs once per iteration (a restore walks hundreds of names): each
    # distinct point is interrupted at its first and its last occurrence, so every bytecode where
    # a signal can land is hit, in the first and in the last state its loop passes through.
    first: dict[tuple[Any, int], int] = {}
    last: dict[tuple[Any, int], int] = {}
    for k, key in enumerate(counter.seen):
        first.setdefault(key, k)
        last[key] = k
    targets = sorted(set(first.values()) | set(last.values()))
    inconsistent: list[str] = []
    not_interrupted: list[str] = []
    for k in targets:
        injector = Injector(k, arm_on, files)
        interrupted = _traced(injector, scenario)
        if injector.count <= k:
            continue  # this run took a shorter path; the point was not reached
        if not interrupted:
            not_interrupted.append(injector.where)
        problem = consistent()
        if problem:
            inconsistent.append(f"{injector.where}: {problem}")
    seconds = round(time.monotonic() - started, 1)
    return {
        "points": len(first),
        "occurrences": len(counter.seen),
        "interrupted_at": len(targets),
        "inconsistent": inconsistent,
        "not_interrupted": not_interrupted,
        "seconds": seconds,
    }


def _handler_name(handler: Any) -> str:
    if handler is signal.default_int_handler:
        return "default_int_handler"
    for name in ("SIG_IGN", "SIG_DFL"):
        if handler == getattr(signal, name):
            return name
    return "not installed from Python" if handler is None else repr(handler)


def main() -> None:
    before = process_state()
    saved_registry = registry.snapshot_registry()
    env = dict(os.environ)
    report: dict[str, Any] = {}

    def exactly_restored() -> Optional[str]:
        now = process_state()
        if now != before:
            diff = {k: (now.get(k), before.get(k)) for k in set(now) | set(before) if now.get(k) != before.get(k)}
            # Put it back by hand so the next point starts from the same state.
            registry.restore_registry(saved_registry)
            os.environ.clear()
            os.environ.update(env)
            engines.restore_engine_state((before["qengine"], before["allocator"]))
            return repr(diff)[:300]
        return None

    leaky = _interrupted_class()
    inherited = signal.getsignal(signal.SIGINT)
    startup: dict[str, Any] = {"sigint_at_start": _handler_name(inherited)}
    if inherited is not signal.default_int_handler:
        with clean_env():
            run_tests(leaky("test_leak_everything"))
            startup["restored"] = exactly_restored() is None
        startup["kept"] = _handler_name(signal.getsignal(signal.SIGINT)) == startup["sigint_at_start"]
        signal.signal(signal.SIGINT, signal.default_int_handler)

    with clean_env():
        report["cleanup"] = campaign(
            "cleanup",
            lambda: run_tests(leaky("test_leak_everything")),
            exactly_restored,
            arm_on=SerializationRoundTripTestCase._restore_global_state.__code__,
        )

    with clean_env():
        # Anywhere in the library while a test body round-trips (the scanner's generators in
        # checkpoint.py are left out: a signal during a generator's close at garbage collection
        # is reported by Python as "Exception ignored", whatever the library does).
        report["body"] = campaign(
            "body",
            lambda: run_tests(leaky("test_change_then_round_trip")),
            exactly_restored,
            files=(
                "testing/case.py",
                "testing/checked_loads.py",
                "testing/isolation.py",
                "loading/load.py",
                "torch_facts/engines.py",
                "torch_facts/registry.py",
                "torch_facts/loader.py",
                "core/interrupts.py",
            ),
        )

    if "qnnpack" in engines.supported_qengines():

        def switch() -> None:
            with engines.override_qengine("qnnpack"):
                pass

        def engine_consistent() -> Optional[str]:
            state = (torch.backends.quantized.engine, engines.allocator_installed())
            problem = None
            if state not in ((before["qengine"], before["allocator"]), ("qnnpack", True)):
                problem = f"engine/allocator {state}"
            engines.restore_engine_state((before["qengine"], before["allocator"]))
            try:
                switch()
            except Exception as e:  # noqa: BLE001 - the next switch must work
                problem = f"next override_qengine raised {type(e).__name__}: {e}"
            return problem

        report["engine"] = campaign("engine", switch, engine_consistent)

    if READS_FORCE_NO:

        def observe() -> None:
            loading.round_trip(Gate().state_dict(), "default")

        def warnings_consistent() -> Optional[str]:
            if loader.proxy_installed():
                return "torch.serialization.warnings is still the proxy"
            if getattr(loader._local, "stack", None):
                return "an observation is still open"
            if not loading.round_trip(Gate().state_dict(), "default").expectation.warns:
                return "the next round trip did not observe torch's warning"
            return None

        with clean_env(TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD="1"):
            report["warnings"] = campaign(
                "warnings", observe, warnings_consistent, files=("torch_facts/loader.py", "core/interrupts.py")
            )

    print(json.dumps({"startup": startup, "scenarios": report}))


if __name__ == "__main__":
    main()
