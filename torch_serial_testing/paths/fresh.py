"""Loads in a fresh interpreter: ``torch.load`` as a user makes it, in a process that imported only *imports*.

A checkpoint may load in a test only thanks to something the test's process imported: ``torch._dynamo``
registers what a jagged nested tensor needs, a package its subclasses.  :func:`fresh_load` (and the mixin's
:meth:`FreshInterpreterLoads.round_trip_fresh`) loads the test's own bytes in a process that imported exactly
*imports*, predicted and asserted there by the core (:func:`torch_serial_testing.loading.load`: what is
imported there is what matters).  Where that process refuses what this one would load, the test fails naming
the import that registers each refused global in this process (found by importing, in a fresh process, the
modules this one imported and the fresh one did not, until the global is allowed), or saying that no import
does (the test's own ``add_safe_globals``).

**Fresh and exact** (:mod:`.forkserver`): one server per test process and set of imports, started on first
use with ``python -I`` plus the folders this process imports the requested packages (and the library) from;
it imports *imports*, then the library's core (checked to register no safe global), and forks one child per
load, which sets this process's ``TORCH_FORCE_*`` switches, makes the one load through the core and sends back
the outcome and the loaded object (``torch.save``-d again): no load sees what another changed.  The bytes are
the test's :class:`~torch_serial_testing.checkpoint.Checkpoint`, sent over the server's pipe; only a
``Checkpoint.save`` output is fully unpickled there too.  Bounded by :data:`TIMEOUT` seconds a load (the
failure names the imports and the load) and :data:`MEMORY_MIB` MiB of address space (Linux).  Where there is
no ``fork()`` (Windows), a skip saying so."""

from __future__ import annotations

import importlib
import io
import os
import sys
import unittest
from dataclasses import dataclass
from typing import Any, Optional, Sequence

from .. import errors
from ..errors import RoundTripConfigError, UnexpectedLoadOutcome
from .forkserver import MEMORY_MIB as MEMORY_MIB  # re-exported: the bound a fresh load runs under
from .forkserver import SWITCHES, TIMEOUT, _packages, _place, fork_unavailable, server

_CORE = ("checkpoint", "declarations", "loading", "modes", "prediction", "registry", "serialization")


class FreshImportError(UnexpectedLoadOutcome):
    """A fresh interpreter refuses what this process loads: an import this process made is missing there."""


def _check_imports(imports: Any) -> tuple[str, ...]:
    if isinstance(imports, str) or not imports or not all(isinstance(m, str) and m for m in imports):
        raise RoundTripConfigError(f"imports must be a tuple of module names such as ('torch',), got {imports!r}")
    if imports[0] != "torch":
        raise RoundTripConfigError(f"imports must start with 'torch' (a load needs it): ({', '.join(imports)})")
    return tuple(imports)


@dataclass(frozen=True)
class FreshResult:
    """One fresh load: what it imported, whether it loaded, why, and the loaded object (sent back for the
    test's own bytes only: a foreign checkpoint's object stays there, and *value* is None)."""

    imports: tuple[str, ...]
    mode: str
    loaded: bool
    weights_only: bool
    summary: str
    missing: tuple[str, ...]
    value: Any = None


def fresh_load(
    checkpoint: Any,
    mode: Any,
    imports: Sequence[str] = ("torch",),
    safe_globals: Sequence[Any] = (),
    map_location: Any = None,
    *,
    timeout: float = TIMEOUT,
) -> FreshResult:
    """Load *checkpoint* in *mode* in a fresh interpreter that imported only *imports*, asserting there what the
    core predicts there; :class:`FreshImportError` where it refuses what this process would load."""
    from ..checkpoint import Checkpoint
    from ..declarations import as_safe_globals, qualified_name
    from ..modes import LoadMode
    from ..prediction import predict

    if reason := fork_unavailable():
        raise unittest.SkipTest(reason)
    imports, mode = _check_imports(imports), LoadMode.parse(mode)
    if not isinstance(checkpoint, Checkpoint):
        raise TypeError(f"fresh_load() takes a Checkpoint (Checkpoint.save(obj)), got {type(checkpoint).__name__}")
    if map_location is not None and not isinstance(map_location, str):
        map_location = str(map_location)  # a torch.device; a function or a dict does not cross processes
    entries = as_safe_globals(safe_globals) if mode is LoadMode.SAFE_GLOBALS else ()
    declared = [[qualified_name(sg.obj), sg.name, sg.explicit_name] for sg in entries]
    here = predict(mode, checkpoint, entries)
    where = f"in a fresh interpreter importing {', '.join(imports)}"
    header = {
        "what": f"loading in the {mode.value} mode",
        "mode": mode.value,
        "owned": checkpoint.owned,
        "env": {name: os.environ.get(name) for name in SWITCHES},
        "declared": declared,
        "packages": _findable(checkpoint, entries),
        "map_location": map_location,
        "send_back": checkpoint.owned,
    }
    answer, payload = server(imports, __name__).ask(header, checkpoint.rewound().read(), timeout)
    if "skip" in answer:
        raise unittest.SkipTest(answer["skip"])
    if "raise" in answer:
        kind = getattr(errors, answer["raise"], None)
        kind = kind if isinstance(kind, type) and issubclass(kind, Exception) else UnexpectedLoadOutcome
        raise kind(f"{mode.value} {where}: {answer['message']}")
    if here.loads and not answer["loaded"]:  # it loads here only thanks to something this process did
        lacking = [n for n in answer["missing"] if n not in here.missing]
        message = _import_message(mode.value, imports, lacking, answer["summary"])
        raise FreshImportError(f"{message}\ntorch.load raised there: {_torch_said(answer['error'] or '')}")
    value = _value(payload) if answer["loaded"] and checkpoint.owned else None  # foreign: the outcome only
    summary, missing = f"{answer['summary']} {where}", tuple(answer["missing"])
    return FreshResult(imports, mode.value, answer["loaded"], answer["weights_only"], summary, missing, value)


def _torch_said(error: str) -> str:
    """The line of torch's rejection that says what failed (not its advice to load with weights_only=False)."""
    lines = [line.strip() for line in error.splitlines() if line.strip()]
    return next((line for line in lines if "WeightsUnpickler error:" in line), lines[0] if lines else error)


def _findable(checkpoint: Any, entries: Sequence[Any]) -> dict[str, str]:
    """Where this process finds the packages the checkpoint and the declaration name: the fresh interpreter finds
    them there too (found is not imported: what a full load or a declaration imports, it imports then)."""
    names = [getattr(sg.obj, "__module__", None) or sg.name for sg in entries]
    if checkpoint.format == "zip":
        names += checkpoint.info.full_load_globals
    found = {}
    for top in dict.fromkeys(n.partition(".")[0] for n in names if n):
        try:
            found.update(_packages([top]))
        except (RoundTripConfigError, ImportError, ValueError):
            continue  # not importable here either: the load says so
    return found


def _value(payload: bytes) -> Any:
    """The object the fresh interpreter loaded from the test's own bytes, ``torch.save``-d there: bytes this
    test's own process tree produced from them a moment ago and sent over its private pipe.  Loaded in full
    with the ``TORCH_FORCE_*`` switches lifted: they decided the test's load there, not this transfer (forced
    weights-only, it would refuse what only the child's declaration allowed)."""
    from ..modes import set_environ
    from ..registry import registry_lock
    from ..serialization import genuine

    with registry_lock:
        switches = {name: os.environ.get(name) for name in SWITCHES}
        set_environ(dict.fromkeys(switches))
        try:
            return genuine("load")(io.BytesIO(payload), weights_only=False)
        finally:
            set_environ(switches)


def _import_message(mode: str, imports: tuple[str, ...], lacking: list[str], summary: str) -> str:
    found = registering_imports(imports, lacking) if lacking else {}
    reasons, more = [], []
    for name in lacking:
        module = found.get(name)
        if module:
            reasons.append(f"{name} is allowed in this process because it imported {module}, which registers it")
            more.append(module)
        else:
            reasons.append(
                f"{name} is allowed in this process, but no module it imported registers it on import: the test's "
                "own torch.serialization.add_safe_globals (which a user's fresh interpreter does not run)"
            )
    fix = f"\nLoad it as a user would: import {', '.join(dict.fromkeys(more))} before torch.load" if more else ""
    fix += f" (imports=({', '.join(repr(m) for m in (*imports, *dict.fromkeys(more)))}))" if more else ""
    why = "; ".join(reasons) or "it refuses for a reason that names no global"
    return (
        f"{mode}: a fresh interpreter importing only {', '.join(imports)} refuses what this process loads: "
        f"{why}.\nThere: {summary}{fix}"
    )


def registering_imports(imports: Sequence[str], names: Sequence[str], timeout: float = TIMEOUT) -> dict[str, str]:
    """For each global in *names*: the module, imported by this process and not by a fresh interpreter importing
    *imports*, whose import there makes it allowed (the global's own package first, then by depth)."""
    fresh_server = server(imports, __name__)
    theirs = set(fresh_server.hello["modules"])
    ours = [m for m in list(sys.modules) if m not in theirs and not m.startswith(("__", "torch_serial_testing"))]
    owns = {m for n in names for m in ours if n.startswith(m + ".")}  # the global's own package and modules
    candidates = sorted(ours, key=lambda m: (m not in owns, m.count("."), m))
    packages = {}
    for m in candidates:
        try:
            packages.update(_packages([m]))
        except (RoundTripConfigError, ValueError, ImportError):
            continue
    header = {"what": "finding the imports that register " + ", ".join(names), "names": list(names)}
    answer = fresh_server.ask({**header, "candidates": candidates, "packages": packages}, timeout=timeout)[0]
    return dict(answer.get("found", {}))


class FreshInterpreterLoads:
    """Mixin for a :class:`~torch_serial_testing.SerializationRoundTripTestCase`: loads in a fresh interpreter,
    reported and ended (a predicted rejection is a pass) as its in-process round trips are."""

    #: What the fresh interpreter imports unless a call says otherwise.
    fresh_imports: Sequence[str] = ("torch",)

    def round_trip_fresh(
        self, obj: Any, *, imports: Optional[Sequence[str]] = None, mode: Any = None, safe_globals: Any = None,
        map_location: Any = None,
    ) -> Any:  # fmt: skip
        """Save *obj* here and load it in a fresh interpreter importing *imports*; the loaded object."""
        from ..outcomes import save

        return self.load_checkpoint_fresh(
            save(obj), imports=imports, mode=mode, safe_globals=safe_globals, map_location=map_location
        )

    def load_checkpoint_fresh(
        self, checkpoint: Any, *, imports: Optional[Sequence[str]] = None, mode: Any = None,
        safe_globals: Any = None, map_location: Any = None,
    ) -> Any:  # fmt: skip
        """Load *checkpoint* (:meth:`save_checkpoint`) in a fresh interpreter importing *imports*, in this
        test's mode (or *mode*), under the class's ``safe_globals`` unless given."""
        from ..modes import LoadMode
        from ..outcomes import ExpectedRejection, report

        test: Any = self
        resolved = LoadMode.parse(mode) if mode is not None else test.load_mode
        if resolved is None:
            raise RoundTripConfigError("this test has no load mode: pass mode=... or instantiate the tests")
        declared = test._declared(safe_globals, "load_checkpoint_fresh")
        imports = _check_imports(self.fresh_imports if imports is None else imports)
        result = fresh_load(checkpoint, resolved, imports, declared.entries, map_location)
        kind = f"torch.load in a fresh interpreter ({', '.join(imports)})"
        report(test, kind, result.mode, result.loaded, result.weights_only, result.summary)
        if result.loaded:
            return result.value
        if resolved is LoadMode.SAFE_GLOBALS and result.missing:  # as the in-process loads judge a declaration
            raise declared.error({sg.name for sg in declared.entries}, result.missing)
        test._tst_in_flight = rejection = ExpectedRejection(result.summary)
        raise rejection


# -- in the fresh interpreter ----------------------------------------------------------------------


def prepare() -> None:
    """In the server, after its imports: the library's core, its probes of torch asked once (no child asks
    them again), and a check that none of it registered a safe global (it would change what loads)."""
    import torch

    before = set(map(repr, torch.serialization.get_safe_globals()))
    for name in _CORE:
        importlib.import_module(f"torch_serial_testing.{name}")
    _warm()
    if set(map(repr, torch.serialization.get_safe_globals())) != before:
        raise RuntimeError("importing the library registered safe globals: it would change what loads")


def handle(header: dict, payload: bytes) -> tuple[dict, bytes]:
    """In a child of the server: one load, or the search for the imports that register globals."""
    return _diagnose(header) if "names" in header else _load(header, payload)


def _warm() -> None:
    """Ask the core's probes of torch once here, so that no child asks them again (each would, forgetting)."""
    import torch
    from torch_serial_testing.checkpoint import Checkpoint
    from torch_serial_testing.modes import LoadMode
    from torch_serial_testing.prediction import predict

    checkpoint = Checkpoint.save({"warm": torch.zeros(1)})
    for mode in LoadMode:
        predict(mode, checkpoint)


def _load(header: dict, payload: bytes) -> tuple[dict, bytes]:
    from torch_serial_testing import loading
    from torch_serial_testing.checkpoint import Checkpoint
    from torch_serial_testing.declarations import resolve_global
    from torch_serial_testing.modes import set_environ
    from torch_serial_testing.serialization import genuine

    set_environ(header["env"])
    _place(header["packages"])  # the declared globals' packages: a user declaring them imports them
    entries = [
        (resolve_global(real), name) if explicit else resolve_global(real)
        for real, name, explicit in header["declared"]
    ]
    buffer = io.BytesIO(payload)
    # bytes the test's Checkpoint.save produced and sent over the private pipe; foreign ones stay foreign
    checkpoint = Checkpoint(buffer, _owned=True) if header["owned"] else Checkpoint.from_bytes(payload)
    try:
        result = loading.load(checkpoint, header["mode"], entries, header["map_location"])
    except unittest.SkipTest as e:
        return {"skip": str(e)}, b""
    except Exception as e:  # the library's own errors cross as themselves
        if not isinstance(getattr(errors, type(e).__name__, None), type) or type(e).__module__ != errors.__name__:
            raise
        return {"raise": type(e).__name__, "message": str(e)}, b""
    exp = result.expectation
    answer = {
        "loaded": result.loaded,
        "weights_only": exp.weights_only,
        "summary": result.summary,
        "missing": list(exp.missing),
        "error": None if result.error is None else f"{type(result.error).__name__}: {result.error}",
    }
    data = b""
    if result.loaded and header["send_back"]:
        out = io.BytesIO()
        genuine("save")(result.value, out)
        data = out.getvalue()
    return answer, data


def _diagnose(header: dict) -> tuple[dict, bytes]:
    from torch_serial_testing.registry import registered_globals, torch_allowlist

    wanted, found = set(header["names"]), {}
    _place(header["packages"])
    for module in header["candidates"]:
        if not wanted:
            break
        try:
            importlib.import_module(module)
        except BaseException:  # noqa: BLE001 - a module that imports only in the test's process: not the one
            continue
        for name in wanted & (registered_globals() | torch_allowlist()):
            found[name] = module
        wanted -= set(found)
    return {"found": found}, b""
