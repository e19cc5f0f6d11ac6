"""Serialization round-trip tests that know what ``torch.load`` should do.

Since torch 2.6 a bare ``torch.load`` is weights-only.  This library saves a
module to memory and reloads it in every load mode -- ``weights_only=False``,
``weights_only=True`` inside ``safe_globals``, and the bare default -- per
quantized engine and device, and asserts in each generated test exactly what
torch should do in the current environment.
"""

from .aggregation import import_round_trip_tests
from .allowlist import dangerous_reason, qualified_name, required_globals, safe_globals_snippet
from .snippet import refusal_notes
from .trust import UnsafeCallable, judge_global
from .case import CaseSpec, ExpectedRejection, SerializationRoundTripTestCase
from .checkpoint import Checkpoint, CheckpointInfo, scan_checkpoint
from .comparison import RoundTripMismatch, assert_round_trip_equal
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
from .load_modes import Expectation, LoadMode, LoadResult, load, predict, round_trip
from .scan_limits import ScanLimits, scan_limits

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
