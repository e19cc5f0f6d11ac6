"""Serialization round-trip tests that know what ``torch.load`` should do.

Since torch 2.6 a bare ``torch.load`` is weights-only.  This library saves a
module to memory and reloads it in every load mode -- ``weights_only=False``,
``weights_only=True`` inside ``safe_globals``, and the bare default -- per
quantized engine and device, and asserts in each generated test exactly what
torch should do in the current environment.
"""

from __future__ import annotations

import importlib
from typing import Any

from .aggregation import import_round_trip_tests
from .allowlist import dangerous_reason, qualified_name, required_globals, safe_globals_snippet
from .snippet import refusal_notes
from .trust import UnsafeCallable, judge_global
from .case import CaseSpec, ExpectedRejection, SerializationRoundTripTestCase
from .devices import available_device_types
from .engines import override_qengine, supported_qengines
from .errors import (
    AllowlistError,
    CheckpointFormatError,
    ConflictingEnvironmentError,
    LeakedGlobalStateError,
    RoundTripConfigError,
    UnexpectedLoadOutcome,
    UnsafeLoadRefused,
)
from .instantiation import cross_engine, instantiate_round_trip_tests, no_round_trip_dims, round_trip_dims
from .isolation import GlobalState
from .modes import LoadMode
# Eager although only a scan needs it: importing the submodule later would rebind the package's
# ``scan_limits`` (the function) to the module of the same name.
from .scan_limits import ScanLimits, scan_limits

# What only a round trip or a scan needs (the opcode walk, the unpickler model, the prediction,
# the loader, the comparison) is imported on first use, here or by the mixin's first round trip:
# ``import torch_serial_testing`` and defining test classes stay cheap.  Name -> its module.
_ON_FIRST_USE = {
    "Checkpoint": "checkpoint",
    "CheckpointInfo": "checkpoint",
    "scan_checkpoint": "checkpoint",
    "RoundTripMismatch": "comparison",
    "assert_round_trip_equal": "comparison",
    "Expectation": "load_modes",
    "LoadResult": "load_modes",
    "load": "load_modes",
    "predict": "load_modes",
    "round_trip": "load_modes",
}

#: Submodules the package imported eagerly before, still reachable as attributes
#: (``torch_serial_testing.load_modes``) without importing them first.
_SUBMODULES_ON_FIRST_USE = frozenset([
    "checkpoint", "comparison", "load_modes", "pickle_scan", "prediction", "replaced_loader", "switches",
    "thread_warnings", "torch_source", "torch_unpickler_rules", "unpickler_model",
])


def __getattr__(name: str) -> Any:
    module = _ON_FIRST_USE.get(name)
    if module is None:
        if name in _SUBMODULES_ON_FIRST_USE:
            return importlib.import_module(f".{name}", __name__)  # binds the package attribute too
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value  # later lookups are plain attribute reads
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_ON_FIRST_USE})


__version__ = "0.1.0"

__all__ = [
    "AllowlistError",
    "CaseSpec",
    "Checkpoint",
    "CheckpointFormatError",
    "CheckpointInfo",
    "ConflictingEnvironmentError",
    "Expectation",
    "ExpectedRejection",
    "GlobalState",
    "LeakedGlobalStateError",
    "LoadMode",
    "LoadResult",
    "RoundTripConfigError",
    "RoundTripMismatch",
    "ScanLimits",
    "SerializationRoundTripTestCase",
    "UnexpectedLoadOutcome",
    "UnsafeCallable",
    "UnsafeLoadRefused",
    "assert_round_trip_equal",
    "available_device_types",
    "cross_engine",
    "dangerous_reason",
    "import_round_trip_tests",
    "instantiate_round_trip_tests",
    "judge_global",
    "load",
    "no_round_trip_dims",
    "override_qengine",
    "predict",
    "qualified_name",
    "refusal_notes",
    "required_globals",
    "round_trip",
    "round_trip_dims",
    "safe_globals_snippet",
    "scan_checkpoint",
    "scan_limits",
    "supported_qengines",
]
