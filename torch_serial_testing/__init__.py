"""Serialization round-trip tests that know what ``torch.load`` should do.

Since torch 2.6 a bare ``torch.load`` is weights-only.  The library saves a module to memory,
reloads it in every load mode (``weights_only=False``, ``weights_only=True`` inside
``safe_globals``, the bare default) per quantized engine and device, and asserts what torch
should do here.  Layers, each importing only those before it: ``core``, ``torch_facts`` (the
only one touching torch's private API), ``scan`` and ``policy``, ``loading``, ``testing``, ``cli``.
"""

from __future__ import annotations

import importlib
from typing import Any

from .case import SerializationRoundTripTestCase
from .declarations import UnsafeCallable
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
    qualified_name,
)
from .instantiation import (
    cross_engine,
    import_round_trip_tests,
    instantiate_round_trip_tests,
    no_round_trip_dims,
    round_trip_dims,
)
from .isolation import GlobalState
from .model import ScanLimits, scan_limits
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
    "import_round_trip_tests",
    "instantiate_round_trip_tests",
    "load",
    "no_round_trip_dims",
    "override_qengine",
    "predict",
    "qualified_name",
    "required_globals",
    "round_trip",
    "round_trip_dims",
    "scan_checkpoint",
    "scan_limits",
    "supported_qengines",
]
