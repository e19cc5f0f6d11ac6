"""One check shared by the device tests: our env filters select exactly what pytorch's select."""

from __future__ import annotations

import json
import subprocess
import sys
import unittest
from typing import Any, Sequence

from torch_serial_testing.dimensions import EXCEPT_FOR, ONLY_FOR, resolve_devices
from torch_serial_testing.errors import RoundTripConfigError

from test.helpers.subprocess_env import child_env

#: Asked of pytorch's own filter in a fresh interpreter (renaming privateuse1 cannot be undone):
#: with a backend ``npu`` registered and available, which of a test base of device type
#: ``privateuse1`` does it keep for only_for=["npu"], except_for=["npu"], only_for=["privateuse1"]?
_PROBE = """
import json, types, torch
torch.utils.rename_privateuse1_backend("npu")
module = types.ModuleType("torch.npu")
module.is_available = lambda: True
torch._register_device_module("npu", module)
from torch.testing._internal import common_device_type as cdt  # pytorch's own filter

class Base:
    device_type = "privateuse1"

kept = [len(cdt.filter_desired_device_types([Base], None, ["npu"])),
        len(cdt.filter_desired_device_types([Base], ["npu"], None)),
        len(cdt.filter_desired_device_types([Base], None, ["privateuse1"]))]
print("KEPT", json.dumps(kept))
"""


def _pytorch_filters_alias_backend_name() -> bool:
    """Asked of pytorch's own filter: does it read the privateuse1 backend's name (``npu``) as
    ``privateuse1``?  Newer pytorch does (the name is replaced before comparing); torch 2.4
    compares names as written (its backend test base is ``privateuse1``), and the library
    follows the pytorch that runs.  Its behaviour is the answer, never its code."""
    env = child_env({"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}, drop=("TORCH_FORCE_", "PYTORCH_TESTING_DEVICE_"))
    proc = subprocess.run(
        [sys.executable, "-c", _PROBE], capture_output=True, text=True, env=env, stdin=subprocess.DEVNULL, timeout=300
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("KEPT ")]
    if proc.returncode != 0 or not lines:
        raise AssertionError(f"asking pytorch's filter_desired_device_types failed:\n{proc.stderr[-3000:]}")
    kept = json.loads(lines[-1][len("KEPT ") :])
    # the backend's name selects the base, does not exclude it; privateuse1 always selects it
    if kept == [1, 0, 1]:
        return True
    if kept == [0, 1, 1]:
        return False
    raise AssertionError(f"pytorch's filter read the backend's name neither way: kept {kept}")


_known: dict[str, bool] = {}


def __getattr__(name: str) -> Any:
    """``FILTERS_ALIAS_BACKEND``: whether ONLY_FOR/EXCEPT_FOR may name the backend (``npu``) for
    ``privateuse1`` on this pytorch -- asked on first use (a fresh interpreter: ~3 s)."""
    if name == "FILTERS_ALIAS_BACKEND":
        if name not in _known:
            _known[name] = _pytorch_filters_alias_backend_name()
        return _known[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def assert_filters_match_pytorch(
    case: unittest.TestCase, bases: Sequence[type], declared: tuple[str, ...], values: Sequence[str]
) -> None:
    """For every ONLY_FOR x EXCEPT_FOR pair of *values*: pytorch's ``filter_desired_device_types``
    over *bases* and our ``resolve_devices(declared)`` agree (both refuse, or both select the same)."""
    from torch.testing._internal import common_device_type as cdt  # pytorch's own filter

    for only in values:
        for excl in values:
            with case.subTest(only=only, excl=excl):
                try:
                    theirs = [
                        b.device_type
                        for b in cdt.filter_desired_device_types(
                            bases, excl.split(",") if excl else [], only.split(",") if only else []
                        )
                    ]
                except AssertionError:
                    theirs = None
                try:
                    ours = list(resolve_devices(declared, {ONLY_FOR: only, EXCEPT_FOR: excl}))
                except RoundTripConfigError:
                    ours = None
                case.assertEqual(ours, theirs)
