"""Serialization round-trip tests that know what ``torch.load`` should do, in every load mode.

Since torch 2.6 a bare ``torch.load(f)`` is weights-only.  A test author subclasses
:class:`SerializationRoundTripTestCase`, says how to build the object, which globals its checkpoint legitimately
needs (``safe_globals``) and what must hold after loading.  This docstring is the design; each module's says what
it owns.

**A round trip.**  ``self.round_trip(obj)`` saves with ``torch.save`` into a private buffer (:mod:`.checkpoint`:
only such bytes are ever loaded with ``weights_only=False``), asks torch what ``torch.load`` decides for the load
mode here and now (:mod:`.modes`: argument, ``TORCH_FORCE_*`` switches, torch's default, read by a canary load)
and, where weights-only, walks the pickle without running it (:mod:`.walker`) to replay this torch's unpickler
checks (:mod:`.unpickler`, asked by probes) against what is allowed (:mod:`.prediction`).  It makes the mode's one
exact ``torch.load`` call (:mod:`.loading`) and asserts torch did what was predicted, for the predicted reason: a
predicted rejection is a pass that says why (:mod:`.outcomes`); what loaded is compared exactly (:mod:`.comparison`).

**The one rule.**  A global loads weights-only exactly when torch would allow it: its built-in allowlist, whatever is
registered process-wide (by torch's own modules such as ``torch.nested``, by the test's imports, by anyone) and, in
the ``safe_globals`` mode, the declared globals.  The declaration is judged by that same prediction
(:mod:`.declarations`): *missing* is what torch refuses, *unneeded* what no load needed; one error names both and the
declaration fixing them.  The author is trusted as torch trusts them: only what can never be a safe global (a module,
``eval``, ``os.system``, a name that does not resolve) is refused; judging what a class could do is for bytes from
strangers, in the tools (:mod:`torch_serial_testing.tools`), which this core never imports.

**Naming.**  ``instantiate_round_trip_tests(TestFoo, globals())`` replaces ``TestFoo`` by one class per device type
(``TestFooCPU``, ...) holding ``test_<name>[_<qengine>|_<save>_to_<load>][_<load_mode>]_<device>[_to_cpu]``:
pytorch's ``test_<name>_<device>`` with the library's dimensions (:mod:`.dimensions`) before the device
(:mod:`.instantiation`, :mod:`.variants`).  A case that cannot run here skips saying why: ids are the same everywhere.

**Around every test** (:mod:`.isolation`) the quantized engine and allocator, the safe-globals registry, the
switches and torch's serialization state are captured and put back: what the test's own code changed is reported;
what torch's own imports did is not the test's doing."""

from __future__ import annotations

import importlib
from typing import Any

from .errors import AllowlistError, CheckpointFormatError, ConflictingEnvironmentError, LeakedGlobalStateError
from .errors import RoundTripConfigError, UnexpectedLoadOutcome, UnsafeLoadRefused, qualified_name

# Imported on first use: ``import torch_serial_testing`` (which every pytest run does where the package is
# installed, for its plugins) imports neither torch nor the mixin.  Name -> its module.
_ON_FIRST_USE = {
    "SerializationRoundTripTestCase": "case",
    "UnsafeCallable": "declarations",
    **dict.fromkeys(("available_device_types", "override_qengine", "supported_qengines"), "dimensions"),
    **dict.fromkeys(("cross_engine", "import_round_trip_tests", "instantiate_round_trip_tests"), "instantiation"),
    **dict.fromkeys(("no_round_trip_dims", "round_trip_dims"), "instantiation"),
    "GlobalState": "isolation",
    "LoadMode": "modes",
    "ExpectedRejection": "outcomes",
    "CaseSpec": "variants",
    **dict.fromkeys(("Checkpoint", "CheckpointInfo", "scan_checkpoint"), "checkpoint"),
    **dict.fromkeys(("RoundTripMismatch", "assert_round_trip_equal"), "comparison"),
    **dict.fromkeys(("Expectation", "predict", "required_globals"), "prediction"),
    **dict.fromkeys(("LoadResult", "load", "round_trip"), "loading"),
    **dict.fromkeys(("ScanLimits", "scan_limits"), "model"),
}
#: Names that judge bytes from strangers: they live in the tools, which the core never imports.
_IN_THE_TOOLS = ("judge_global", "dangerous_reason", "refusal_notes", "safe_globals_snippet")


def __getattr__(name: str) -> Any:
    if (module := _ON_FIRST_USE.get(name)) is None:
        if name in _IN_THE_TOOLS:
            raise AttributeError(
                f"{name} judges checkpoints from strangers and lives in the tools since 0.2.0: "
                f"from {__name__}.tools import {name}"
            )
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value = getattr(importlib.import_module(f".{module}", __name__), name)  # cached
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_ON_FIRST_USE})


__version__ = "0.2.0"
__all__ = ["AllowlistError", "CheckpointFormatError", "ConflictingEnvironmentError", "LeakedGlobalStateError"]
__all__ += ["RoundTripConfigError", "UnexpectedLoadOutcome", "UnsafeLoadRefused", "qualified_name", *_ON_FIRST_USE]
