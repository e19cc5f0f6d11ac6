"""Small modules shared by the library's own tests (imported as ``test.helpers.roundtrip_fixtures``).

Also the facts about the running torch that the tests' expectations depend on, each derived from
torch itself (its allowlist, or what a real ``torch.load`` does here), never from a version string.
"""

from __future__ import annotations

import functools
import io
import os
import pickle
import warnings
from unittest import mock

import torch
from torch._weights_only_unpickler import _get_allowed_globals


class TinyNet(torch.nn.Module):
    """A float module whose full checkpoint needs one global of its own beyond torch's allowlist.

    Like every module checkpoint it also names ``builtins.set`` (``_non_persistent_buffers_set``),
    which torch's allowlist has only since torch 2.6 (see :data:`MODULE_GLOBALS`).
    """

    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.arange(6, dtype=torch.float32).reshape(2, 3))
        self.register_buffer("steps", torch.tensor([3], dtype=torch.int64))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x @ self.weight.t()


class Wrapper(torch.nn.Module):
    """Needs TinyNet, Wrapper and torch.nn.Linear (to exercise multi-global messages)."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = TinyNet()
        self.head = torch.nn.Linear(2, 1)


#: Globals every full nn.Module checkpoint needs beyond torch's allowlist, whatever the module:
#: ``builtins.set`` (the module's ``_non_persistent_buffers_set``) where torch does not allow it.
MODULE_GLOBALS = [] if "builtins.set" in _get_allowed_globals() else ["builtins.set"]
#: The objects for MODULE_GLOBALS, as a ``safe_globals`` declaration takes them.
MODULE_SAFE_GLOBALS = (set,) if MODULE_GLOBALS else ()

TINY_GLOBALS = sorted(["test.helpers.roundtrip_fixtures.TinyNet", *MODULE_GLOBALS])
#: The minimal safe globals a full TinyNet checkpoint needs here.
TINY_SAFE_GLOBALS = (TinyNet, *MODULE_SAFE_GLOBALS)
WRAPPER_GLOBALS = sorted(
    [
        "test.helpers.roundtrip_fixtures.TinyNet",
        "test.helpers.roundtrip_fixtures.Wrapper",
        "torch.nn.modules.linear.Linear",
        *MODULE_GLOBALS,
    ]
)


def clean_env(**extra: str):
    """``os.environ`` without any TORCH_FORCE_* switch, plus *extra*, for a ``with`` block."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCH_FORCE_")}
    env.update(extra)
    return mock.patch.dict(os.environ, env, clear=True)


def tiny_qlinear(bias: float = 1.0):
    """The seed module: a sparse dynamic quantized Linear (needs three globals), packed by qnnpack."""
    from torch.ao.nn.sparse.quantized.dynamic.linear import Linear

    from torch_serial_testing import override_qengine

    with override_qengine("qnnpack"):
        w = torch.quantize_per_tensor(torch.tensor([[0.0, 0, 0, 0, 2, 2, 2, 2]] * 3), 2.0, 0, torch.qint8)
        lin = Linear(3, 8, 1, 4, bias=True, dtype=torch.qint8)
        lin.set_weight_bias(w, torch.full((3,), bias), 1, 4)
    return lin


SEED_GLOBALS = sorted(
    [
        "torch.ScriptObject",
        "torch.ao.nn.sparse.quantized.dynamic.linear.Linear",
        "torch.ao.nn.sparse.quantized.linear.LinearPackedParams",
        *MODULE_GLOBALS,
    ]
)


# -- what a real torch.load does here, observed once ------------------------------------------

FORCE_WO = "TORCH_FORCE_WEIGHTS_ONLY_LOAD"
FORCE_NO_WO = "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD"


def _bare_load(data: bytes, **env: str) -> tuple[str, list[str]]:
    """A bare ``torch.load`` of *data* with exactly *env* as the TORCH_FORCE_* switches.

    Returns the outcome ("loaded", "rejected" or "refused" for a RuntimeError) and the warnings.
    """
    clean = {k: v for k, v in os.environ.items() if not k.startswith("TORCH_FORCE_")}
    clean.update(env)
    with mock.patch.dict(os.environ, clean, clear=True), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            torch.load(io.BytesIO(data))
            outcome = "loaded"
        except pickle.UnpicklingError:
            outcome = "rejected"
        except RuntimeError:
            outcome = "refused"
    return outcome, [str(w.message) for w in caught]


def _observe() -> tuple[bool, bool, bool]:
    buf = io.BytesIO()
    torch.save(TinyNet(), buf)  # needs a global beyond torch's allowlist
    data = buf.getvalue()
    default_weights_only = _bare_load(data)[0] == "rejected"
    _, messages = _bare_load(data, **{FORCE_NO_WO: "1"})
    reads_force_no = any(FORCE_NO_WO in m for m in messages)
    refuses_both = _bare_load(data, **{FORCE_WO: "1", FORCE_NO_WO: "1"})[0] == "refused"
    return default_weights_only, reads_force_no, refuses_both


#: Whether a bare torch.load is weights-only here (torch >= 2.6), observed on a real load.
#: Whether torch.load reads TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD (it warns when it does; torch >= 2.6).
#: Whether torch.load raises RuntimeError when both TORCH_FORCE_* switches are set (torch >= 2.6).
DEFAULT_WEIGHTS_ONLY, READS_FORCE_NO_WEIGHTS_ONLY, REFUSES_BOTH_SWITCHES = _observe()

#: The library's wording of why a bare torch.load has DEFAULT_WEIGHTS_ONLY here.
if DEFAULT_WEIGHTS_ONLY:
    DEFAULT_WHY = "since torch 2.6"
elif hasattr(torch.serialization, "_default_to_weights_only"):
    DEFAULT_WHY = "this torch build (fbcode) keeps the old default"
else:
    DEFAULT_WHY = f"the default before torch 2.6 (torch {torch.__version__})"
DEFAULT_REASON = f"weights_only={DEFAULT_WEIGHTS_ONLY} {DEFAULT_WHY}"

#: This torch's release as (major, minor), for tests of what torch's own modules do in newer releases.
TORCH_RELEASE = tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2])
#: Why a test of torch's own registrations (DTensor's classes at ``import torch.distributed.tensor``,
#: the jagged nested tensor's at ``import torch._dynamo``) cannot run here, or None.
NO_TORCH_REGISTRATIONS = (
    f"torch {torch.__version__}: torch's own registrations (DTensor's classes at import "
    "torch.distributed.tensor, the jagged nested tensor's at import torch._dynamo) are checked from torch 2.6 "
    "on; torch 2.4 makes none"
    if TORCH_RELEASE < (2, 6)
    else None
)
#: An environment in which a bare torch.load is weights-only (empty where that is the default).
WEIGHTS_ONLY_BARE_ENV = {} if DEFAULT_WEIGHTS_ONLY else {FORCE_WO: "1"}


def default_outcome(missing) -> str:
    """The summary of a bare load, in a clean environment, of a checkpoint needing *missing*."""
    if DEFAULT_WEIGHTS_ONLY and missing:
        return f"default: rejected as expected ({DEFAULT_REASON}; {', '.join(missing)} not allowlisted)"
    return f"default: loaded as expected ({DEFAULT_REASON})"


# -- which load modes run here ----------------------------------------------------------------
#
# Derived from the library's own mode_skip_reason (the safe_globals mode needs
# torch.serialization.safe_globals, torch >= 2.5).  Computed on first access (PEP 562), so this
# module still imports without torch_serial_testing (the vendoring test copies it next to a
# renamed copy of the library):
#
# MODE_SKIPS: load mode value -> the library's exact skip reason, for every mode this torch
#     cannot run; empty where every mode runs.
# SAFE_GLOBALS_SKIP: why the safe_globals mode skips here (the exact SkipTest reason), or None.
# RUNNABLE_MODES: the LoadMode members that run here, in LoadMode order.


def _mode_facts() -> dict:
    from torch_serial_testing.modes import LoadMode
    from torch_serial_testing.loading import mode_skip_reason

    skips = {mode.value: reason for mode in LoadMode if (reason := mode_skip_reason(mode)) is not None}
    return {
        "MODE_SKIPS": skips,
        "SAFE_GLOBALS_SKIP": skips.get(LoadMode.SAFE_GLOBALS.value),
        "RUNNABLE_MODES": tuple(mode for mode in LoadMode if mode.value not in skips),
    }


def __getattr__(name: str):
    if name in ("MODE_SKIPS", "SAFE_GLOBALS_SKIP", "RUNNABLE_MODES"):
        globals().update(_mode_facts())
        return globals()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def assert_mode_skips_here(test, mode, call) -> bool:
    """If *mode* cannot run here, assert *call* raises SkipTest with exactly its reason and return True.

    Returns False (without calling *call*) where the mode runs, so the caller goes on to check
    what the load does.
    """
    import unittest

    from torch_serial_testing.modes import LoadMode

    reason = _mode_facts()["MODE_SKIPS"].get(LoadMode.parse(mode).value)
    if reason is None:
        return False
    with test.assertRaises(unittest.SkipTest) as cm:
        call()
    test.assertEqual(str(cm.exception), reason)
    return True


class SwitchProbe:
    """A class no allowlist has: loading it weights-only fails, so torch.load says how it read a switch."""


@functools.cache
def torch_sets(name: str, value: str) -> bool:
    """Whether the running torch treats ``name=value`` as set -- asked of ``torch.load`` itself.

    torch 2.13 lower-cases the value, 2.6 to 2.12 compare it as written, torch < 2.6 does not read
    TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD at all: tests take their expectations from this probe, never
    from an assumed spelling rule.
    """
    import io as _io
    import os as _os
    import pickle as _pickle
    import warnings as _warnings
    from unittest import mock as _mock

    buf = _io.BytesIO()
    torch.save(SwitchProbe(), buf)
    env = {k: v for k, v in _os.environ.items() if not k.startswith("TORCH_FORCE_")}
    env[name] = value
    with _mock.patch.dict(_os.environ, env, clear=True), _warnings.catch_warnings():
        _warnings.simplefilter("ignore")
        buf.seek(0)
        try:
            if name == "TORCH_FORCE_WEIGHTS_ONLY_LOAD":
                torch.load(buf, weights_only=False)  # our own bytes, this process's class
                return False
            loaded_bare = True
            torch.load(buf)
        except _pickle.UnpicklingError:
            if name == "TORCH_FORCE_WEIGHTS_ONLY_LOAD":
                return True
            loaded_bare = False
    if not loaded_bare:
        return False
    # Loaded bare: set, unless this torch's bare load is a full load anyway (before 2.6).
    buf.seek(0)
    with (
        _mock.patch.dict(_os.environ, {k: v for k, v in env.items() if k != name}, clear=True),
        _warnings.catch_warnings(),
    ):
        _warnings.simplefilter("ignore")
        try:
            torch.load(buf)
            return False  # the bare load loads without the switch too: the switch decided nothing
        except _pickle.UnpicklingError:
            return True
