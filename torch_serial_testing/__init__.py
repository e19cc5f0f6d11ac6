"""Serialization round-trip tests that know what ``torch.load`` should do, in every load mode.

Since torch 2.6 a bare ``torch.load(f)`` is weights-only.  A test author subclasses
:class:`SerializationRoundTripTestCase`, says how to build the object, which globals its checkpoint
legitimately needs (``safe_globals``) and what must hold after loading.  This docstring is the design;
each module's says what it owns.

**A round trip.**  ``self.round_trip(obj)`` saves with ``torch.save`` into a private buffer
(:mod:`.checkpoint`: only such bytes are ever loaded with ``weights_only=False``), asks torch what
``torch.load`` decides for the test's load mode here and now (:mod:`.modes`: the argument, the
``TORCH_FORCE_*`` switches, torch's default read by a canary load) and, where weights-only, walks the
pickle without running it (:mod:`.walker`) to replay this torch's weights-only unpickler checks
(:mod:`.unpickler`, asked by few-byte probes) against what is allowed (:mod:`.prediction`).  Then it
makes the mode's one exact ``torch.load`` call (:mod:`.loading`) and asserts torch did what was
predicted, for the predicted reason.  A predicted rejection ends the test as a pass that says why
(:mod:`.outcomes`); what loaded is compared exactly (:mod:`.comparison`).

**The one rule.**  A global loads weights-only exactly when torch would allow it: its built-in
allowlist, whatever is registered process-wide (by torch's own modules such as
``torch.distributed.tensor`` or ``torch.nested``, by the test's imports, by anyone) and, in the
``safe_globals`` mode, the declared globals.  The declaration is judged by that same prediction
(:mod:`.declarations`): *missing* is what torch refuses, *unneeded* what no load under it needed; one
error names both and the declaration fixing them.  The author is trusted as torch trusts them: only
what can never be a safe global (a module, ``eval``, ``os.system``, a name that does not resolve) is
refused.  Judging what a class could do is for bytes from strangers: the tools
(:mod:`torch_serial_testing.tools`), which this core never imports.

**Naming.**  ``instantiate_round_trip_tests(TestFoo, globals())`` replaces ``TestFoo`` by one class per
device type (``TestFooCPU``, ...) holding ``test_<name>[_<qengine>|_<save>_to_<load>][_<load_mode>]_<device>[_to_cpu]``:
pytorch's ``test_<name>_<device>`` with the library's dimensions (:mod:`.dimensions`) before the
device (:mod:`.instantiation`, :mod:`.variants`).  A case that cannot run here skips saying why, so
the ids are the same everywhere.

**Around every test** (:mod:`.isolation`) the quantized engine and allocator, the safe-globals
registry, the switches and torch's serialization state are captured and put back: what the test's own
code changed is reported; what torch's own imports did is not the test's doing.
"""

from __future__ import annotations

import importlib
from typing import Any

from .case import SerializationRoundTripTestCase
from .declarations import UnsafeCallable
from .dimensions import available_device_types, override_qengine, supported_qengines
from .errors import AllowlistError, CheckpointFormatError, ConflictingEnvironmentError, LeakedGlobalStateError
from .errors import RoundTripConfigError, UnexpectedLoadOutcome, UnsafeLoadRefused, qualified_name
from .instantiation import cross_engine, import_round_trip_tests, instantiate_round_trip_tests
from .instantiation import no_round_trip_dims, round_trip_dims
from .isolation import GlobalState
from .modes import LoadMode
from .outcomes import ExpectedRejection
from .variants import CaseSpec

# What only a round trip or a scan needs is imported on first use, so ``import
# torch_serial_testing`` and defining test classes stay cheap.  Name -> its module.
_ON_FIRST_USE = {
    **dict.fromkeys(("Checkpoint", "CheckpointInfo", "scan_checkpoint"), "checkpoint"),
    **dict.fromkeys(("RoundTripMismatch", "assert_round_trip_equal"), "comparison"),
    **dict.fromkeys(("Expectation", "predict", "required_globals"), "prediction"),
    **dict.fromkeys(("LoadResult", "load", "round_trip"), "loading"),
    **dict.fromkeys(("ScanLimits", "scan_limits"), "model"),
}
#: Names that judge bytes from strangers: they live in the tools, which the core never imports.
_IN_THE_TOOLS = ("judge_global", "dangerous_reason", "refusal_notes", "safe_globals_snippet")


def __getattr__(name: str) -> Any:
    module = _ON_FIRST_USE.get(name)
    if module is None:
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


__version__ = "0.1.0"

__all__ = ["SerializationRoundTripTestCase", "CaseSpec", "ExpectedRejection", "GlobalState", "LoadMode"]
__all__ += ["UnsafeCallable", "cross_engine", "import_round_trip_tests", "instantiate_round_trip_tests"]
__all__ += ["no_round_trip_dims", "round_trip_dims", "available_device_types", "override_qengine", "supported_qengines"]
__all__ += ["qualified_name", "AllowlistError", "CheckpointFormatError", "ConflictingEnvironmentError"]
__all__ += ["LeakedGlobalStateError", "RoundTripConfigError", "UnexpectedLoadOutcome", "UnsafeLoadRefused"]
# imported on first use
__all__ += ["Checkpoint", "scan_checkpoint", "RoundTripMismatch", "assert_round_trip_equal", "required_globals"]
__all__ += ["CheckpointInfo", "Expectation", "predict", "LoadResult", "load", "round_trip", "ScanLimits", "scan_limits"]
