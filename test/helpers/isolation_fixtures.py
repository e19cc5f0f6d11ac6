"""Shared pieces for the thread and foreign-switch tests.

``Gate`` is a module whose ``__setstate__`` (which torch calls while loading, in
every mode) runs a hook: tests use it to act *inside* a load, deterministically.
``process_state()`` reads everything the library promises to restore, from torch.
"""

from __future__ import annotations

import io
import os
import unittest
import warnings
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Optional
from unittest import mock

import torch

from torch_serial_testing.errors import qualified_name
from torch_serial_testing.declarations import normalize_safe_globals
from torch_serial_testing import dimensions, modes as load_call, serialization as loader, registry
from torch_serial_testing.tools import facts

_hook: Optional[Callable[[], None]] = None


def recording_active() -> bool:
    """Whether the library's recorder stands in for torch's ``_add_safe_globals`` right now (only while a test runs)."""
    return torch._weights_only_unpickler._add_safe_globals is registry._recording_add


def proxy_installed() -> bool:
    """Whether torch.serialization's ``warnings`` is the library's proxy right now (never between loads)."""
    return isinstance(getattr(torch.serialization, "warnings", None), loader._SerializationWarnings)


class Gate(torch.nn.Module):
    """Runs the installed hook while torch loads it (from ``__setstate__``)."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.arange(4.0))

    def __setstate__(self, state: Any) -> None:
        super().__setstate__(state)
        if _hook is not None:
            _hook()


class LeakedGlobal:
    """What a leaking test registers."""


# set: needed where torch's allowlist lacks it (torch < 2.6)
GATE_SAFE_GLOBALS = normalize_safe_globals([Gate, set])
TORCH_DEFAULT_WO = load_call.torch_default_weights_only()[0]
READS_FORCE_NO = facts.torch_reads_force_no_weights_only()


@contextmanager
def hook(fn: Callable[[], None]) -> Iterator[None]:
    global _hook
    _hook = fn
    try:
        yield
    finally:
        _hook = None


@contextmanager
def clean_env(**env: str) -> Iterator[None]:
    """Exactly *env* as the TORCH_FORCE_* switches inside the block."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("TORCH_FORCE_")}
    clean.update(env)
    with mock.patch.dict(os.environ, clean, clear=True):
        yield


def process_state() -> dict[str, Any]:
    """Everything the library restores, read from torch and the interpreter."""
    state: dict[str, Any] = {
        "qengine": torch.backends.quantized.engine,
        "allocator": dimensions.allocator_installed(),
        "registry": sorted(qualified_name(g) for g in torch.serialization.get_safe_globals()),
        "env": {k: v for k, v in os.environ.items() if k.startswith("TORCH_FORCE_")},
        "recorder_installed": recording_active(),
        "filters": list(warnings.filters),
        "warnings_proxy_installed": proxy_installed(),
        "torch.load": torch.load,
        "torch.save": torch.save,
        "allowlist": sorted(torch._weights_only_unpickler._get_allowed_globals()),
    }
    try:
        from torch.utils.serialization import config

        state["config"] = config.get_config_copy()
    except ImportError:
        pass
    return state


def other_engine(current: Optional[str] = None) -> str:
    current = current or torch.backends.quantized.engine
    supported = [e for e in dimensions.supported_qengines() if e != current]
    if not supported:
        raise unittest.SkipTest("needs two quantized engines")
    return supported[0]


def run_tests(*tests: unittest.TestCase) -> unittest.TestResult:
    """Run *tests* in this order through an inner TextTestRunner (output discarded)."""
    runner = unittest.TextTestRunner(stream=io.StringIO(), verbosity=2, warnings=None)
    return runner.run(unittest.TestSuite(tests))


def import_registering_modules() -> None:
    """Import the torch modules that call add_safe_globals at import time, so that a lazy import
    in another thread cannot change the registry in the middle of a concurrency test."""
    import importlib

    for name in ("torch.distributed.tensor", "torch.nested._internal.nested_tensor", "torch._dynamo"):
        try:
            importlib.import_module(name)
        except ImportError:
            pass


def only_torchs_registrations(test: unittest.TestCase) -> None:
    """Start *test* with only torch's own safe-global registrations, and give back the others after it.

    Another test module of the run may have imported a package that allowlists its classes at import
    (``test/paths/aolike``, as torchao does): at collection, before any test.  A test that checks which
    registrations are reported starts from torch's own, whichever modules the run collected."""
    test.addCleanup(registry.restore_registry, registry.snapshot_registry())
    registry.restore_registry([e for e in registry.snapshot_registry() if registry.registered_by_torch(e)])
