"""What the tools ask torch beyond what a round trip needs: how it spells its switches, which
safe globals its own modules register (a fresh interpreter), the legacy tar format's storages.
"""

from __future__ import annotations

import io
import os
import sys
from dataclasses import dataclass
from typing import Any, Mapping, Optional

from ..errors import torch_key
from ..modes import FORCE_NO_WO, FORCE_WO, _ask, conflict_message, is_truthy, switch_values
from ..errors import ProbeFailed

# Set in the environment of every fresh interpreter the tools start to ask torch something, to the
# question's name ("own_registrations"): such a process is a probe, not a test run.
FRESH_PROBE_ENV = "TORCH_SERIAL_TESTING_FRESH_PROBE"

#: Spellings :func:`truthy_spellings` asks torch about (what people write for "on").
CANDIDATE_SPELLINGS = ("1", "y", "yes", "true", "t", "on")


def truthy_spellings(name: str) -> tuple[tuple[str, ...], bool, bool]:
    """(the :data:`CANDIDATE_SPELLINGS` this torch reads as set for *name*, whether it ignores
    their case, whether it ignores surrounding spaces): what ``doctor`` says about a spelling."""
    found = tuple(s for s in CANDIDATE_SPELLINGS if is_truthy(s, name))
    any_case = bool(found) and all(is_truthy(s.upper(), name) for s in found)
    strips = bool(found) and is_truthy(f" {found[0]} ", name)
    return found, any_case, strips


def describe_spellings(name: str) -> str:
    """``1, y, yes, true (any case)``: the spellings torch counts as set, for messages."""
    found, any_case, strips = truthy_spellings(name)
    if not found:
        return "none of " + ", ".join(CANDIDATE_SPELLINGS)
    how = "any case" if any_case else "exactly as written, case-sensitive"
    return f"{', '.join(found)} ({how}{', surrounding spaces ignored' if strips else ''})"


def torch_reads_force_no_weights_only() -> bool:
    """Whether this torch's ``torch.load`` acts on TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD at all (torch >= 2.6)."""
    return any(is_truthy(s, FORCE_NO_WO) for s in CANDIDATE_SPELLINGS)


_CHILD = """
import json, sys
import torch
failed = []
devices = json.loads(sys.argv[1])
def within(name, top):
    return name == top or name.startswith(top + ".")
for name in json.loads(sys.argv[2]):
    try:
        __import__(name)
    except ModuleNotFoundError as e:  # a backend's device module (torch.npu) is none of torch's
        if not any(within(name, d) and within(e.name or "", d) for d in devices):
            failed.append(f"{name}: {type(e).__name__}")
    except Exception as e:
        failed.append(f"{name}: {type(e).__name__}")
def key(g):
    if isinstance(g, tuple) and len(g) == 2 and isinstance(g[1], str):
        return g[1]
    return f"{getattr(g, '__module__', '?')}.{getattr(g, '__qualname__', '?')}"
print(json.dumps({"names": sorted(key(g) for g in torch.serialization.get_safe_globals()), "failed": failed}))
"""


def _device_modules(modules: frozenset[str]) -> list[str]:
    """The ``torch.<device>`` modules among *modules* that are a device's runtime module, as
    ``torch._register_device_module`` puts an out-of-tree backend's (``torch.npu``) there."""
    import torch

    found = []
    for top in sorted({n.split(".")[1] for n in modules if "." in n}):
        module = sys.modules.get(f"torch.{top}")
        try:
            if module is None or vars(torch).get(top) is not module or torch.device(top).type != top:
                continue
        except (RuntimeError, ValueError, TypeError):  # not a device type
            continue
        found.append(f"torch.{top}")
    return found


def fresh_interpreter() -> list[str]:
    """The command of a fresh interpreter for a probe: never with the caller's folder first on ``sys.path``
    (a ``json.py`` or ``torch.py`` there would be imported in torch's place): ``-P`` (Python >= 3.11),
    and the probe runs in an empty folder, so the ``''`` an older Python puts first holds nothing."""
    return [sys.executable, "-P"] if sys.version_info >= (3, 11) else [sys.executable]


_own: dict[frozenset[str], frozenset[str]] = {}


def torch_own_registrations() -> frozenset[str]:
    """The names torch itself registers for the ``torch.*`` modules imported here: reported by a fresh
    interpreter (backend autoload off) importing the same ones, remembered per set of modules.  A
    backend's device module it cannot find is none of torch's; any other it cannot import: ProbeFailed."""
    modules = frozenset(
        n for n, m in list(sys.modules.items()) if m is not None and (n == "torch" or n.startswith("torch."))
    )
    known = _own.get(modules)
    if known is not None:
        return known
    import json
    import subprocess
    import tempfile

    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("TORCH_FORCE_WEIGHTS_ONLY_LOAD", "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD")
    }
    env["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"
    if env.get("PYTHONPATH"):  # the caller's named folders, as the caller means them ('' would be the cwd)
        env["PYTHONPATH"] = os.pathsep.join(os.path.abspath(p) for p in env["PYTHONPATH"].split(os.pathsep) if p)
    env[FRESH_PROBE_ENV] = "own_registrations"
    try:
        with tempfile.TemporaryDirectory(prefix="tst-probe-") as empty:  # not the caller's folder
            proc = subprocess.run(
                [*fresh_interpreter(), "-c", _CHILD, json.dumps(_device_modules(modules)), json.dumps(sorted(modules))],
                capture_output=True,
                text=True,
                env=env,
                timeout=300,
                stdin=subprocess.DEVNULL,
                cwd=empty,
            )
        lines = proc.stdout.strip().splitlines()
        if not lines:
            last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
            raise ValueError(f"exit status {proc.returncode}: {last}")
        report = json.loads(lines[-1])
    except (OSError, subprocess.SubprocessError, ValueError) as e:
        raise ProbeFailed(
            f"a fresh interpreter could not report torch's own registrations ({type(e).__name__}: {e})"
        ) from None
    if report["failed"]:
        raise ProbeFailed(
            "a fresh interpreter could not import "
            + ", ".join(report["failed"][:3])
            + " to report torch's own registrations"
        )
    known = _own[modules] = frozenset(report["names"])
    return known


_confirmed_own: dict[Any, bool] = {}


def torch_registers_itself(entry: Any) -> bool:
    """For judging a registry from outside a test (the tools): whether *entry* is one torch's own modules
    register, as a fresh interpreter importing the same ``torch.*`` modules reports
    (:func:`torch_own_registrations`): a ``torch.*`` object registered under its own name, resolving
    to that very object here.  Cannot tell: :class:`ProbeFailed`."""
    obj, name = entry if isinstance(entry, tuple) and len(entry) == 2 else (entry, None)
    real = torch_key(obj)
    if real is None or not real.startswith("torch.") or (name is not None and name != real):
        return False
    try:
        if _confirmed_own.get(entry):
            return True
    except TypeError:  # unhashable: never registered by torch
        return False
    module_name, _, qualname = real.rpartition(".")
    module = sys.modules.get(module_name)
    while module is None and "." in module_name:  # a nested qualname: Outer.Inner
        module_name, _, outer = module_name.rpartition(".")
        qualname = f"{outer}.{qualname}"
        module = sys.modules.get(module_name)
    target: Any = module
    for part in qualname.split("."):
        target = vars(target).get(part) if hasattr(target, "__dict__") else None
    if target is not obj or real not in torch_own_registrations():
        return False
    _confirmed_own[entry] = True
    return True


#: torch's reason for refusing the legacy tar format weights-only (torch/serialization.py).
TAR_REFUSAL = "Cannot use ``weights_only=True`` with files saved in the legacy .tar format."


def storage_element_size(storage_type: Optional[str]) -> int:
    """Bytes per element of a legacy storage type (``FloatStorage``); KeyError for an unknown one."""
    import torch

    if storage_type is None:
        raise KeyError(storage_type)
    try:
        dtype = torch.storage._get_dtype_from_pickle_storage_type(storage_type)  # type: ignore[attr-defined]
        return int(torch._utils._element_size(dtype))
    except (KeyError, AttributeError, TypeError, RuntimeError):
        raise KeyError(storage_type) from None


@dataclass(eq=False)
class WeightsOnlySwitches:
    """The two TORCH_FORCE_* switches as this torch reads them (for ``doctor`` and the tests)."""

    force_weights_only: bool
    force_no_weights_only: bool
    raw: Mapping[str, Optional[str]]
    #: torch raises RuntimeError on every load (both set, as torch reads them).
    conflict: bool

    @classmethod
    def from_environ(cls, environ: Optional[Mapping[str, str]] = None) -> WeightsOnlySwitches:
        wo, no = switch_values(environ)
        conflict = wo is not None and no is not None and _ask(None, wo, no)[0] is None
        return cls(is_truthy(wo, FORCE_WO), is_truthy(no, FORCE_NO_WO), {FORCE_WO: wo, FORCE_NO_WO: no}, conflict)

    def conflict_message(self) -> str:
        return conflict_message(self.raw.get(FORCE_WO), self.raw.get(FORCE_NO_WO))


_torchscript_refusal: list[Optional[str]] = []


def torchscript_refusal() -> Optional[str]:
    """torch's message refusing a TorchScript archive weights-only, or None when it hands it to
    ``torch.jit.load`` whatever ``weights_only`` says (torch 2.4): asked once, with a tiny archive."""
    if not _torchscript_refusal:
        import torch

        from ..serialization import genuine, observe_serialization_warnings, raiser

        buf = io.BytesIO()
        writer = torch._C.PyTorchFileWriter(buf)
        for name in ("data.pkl", "constants.pkl"):
            writer.write_record(name, b"\x80\x02).", 4)
        writer.write_end_of_file()
        del writer
        buf.seek(0)
        with observe_serialization_warnings(consume_all=True):  # torch warns that it dispatches to jit
            try:
                genuine("load")(buf, weights_only=True)
                error: Optional[BaseException] = None
            except Exception as e:  # noqa: BLE001 - where it was raised is the answer
                error = e
        where = raiser(error) if error is not None else "nowhere"
        if where.startswith("torch.jit"):
            _torchscript_refusal.append(None)
        elif where.startswith("torch.serialization") and isinstance(error, RuntimeError):
            message = str(error).strip()
            unsafe = getattr(torch.serialization, "UNSAFE_MESSAGE", "")
            if unsafe and message.endswith(unsafe):
                message = message[: -len(unsafe)].strip()
            _torchscript_refusal.append(message)
        else:
            raise ProbeFailed(
                f"torch.load of a TorchScript archive with weights_only=True raised in {where}: "
                f"{type(error).__name__}: {error}"
            )
    return _torchscript_refusal[0]
