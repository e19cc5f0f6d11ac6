"""One check shared by the device tests: our env filters select exactly what pytorch's select."""

from __future__ import annotations

import unittest
from typing import Sequence

from torch_serial_testing.torch_facts.devices import EXCEPT_FOR, ONLY_FOR, resolve_devices
from torch_serial_testing.core.errors import RoundTripConfigError


def _pytorch_filters_alias_backend_name() -> bool:
    """Asked of pytorch's own filter: does it read the privateuse1 backend's name (``npu``) as
    ``privateuse1``?  Newer pytorch does (2.15 through a helper, ``_get_device_type_normalizer``);
    torch 2.4 compares names as written (its backend test base is ``privateuse1``), and the library
    follows the pytorch that runs.  Looks at the filter and at the module's functions its code
    names -- by code object, unlike the library, which reads the file's text."""
    import inspect

    from torch.testing._internal import common_device_type as cdt  # tests may import it, the library never

    fn = cdt.filter_desired_device_types
    helpers = [getattr(cdt, n) for n in fn.__code__.co_names if inspect.isfunction(getattr(cdt, n, None))]
    return any("_get_privateuse1_backend_name" in inspect.getsource(f) for f in [fn, *helpers])


#: Whether ONLY_FOR/EXCEPT_FOR may name the backend (``npu``) for ``privateuse1`` on this pytorch.
FILTERS_ALIAS_BACKEND = _pytorch_filters_alias_backend_name()


def assert_filters_match_pytorch(case: unittest.TestCase, bases: Sequence[type], declared: tuple[str, ...],
                                 values: Sequence[str]) -> None:
    """For every ONLY_FOR x EXCEPT_FOR pair of *values*: pytorch's ``filter_desired_device_types``
    over *bases* and our ``resolve_devices(declared)`` agree (both refuse, or both select the same)."""
    from torch.testing._internal import common_device_type as cdt  # tests may import it, the library never

    for only in values:
        for excl in values:
            with case.subTest(only=only, excl=excl):
                try:
                    theirs = [b.device_type for b in cdt.filter_desired_device_types(
                        bases, excl.split(",") if excl else [], only.split(",") if only else [])]
                except AssertionError:
                    theirs = None
                try:
                    ours = list(resolve_devices(declared, {ONLY_FOR: only, EXCEPT_FOR: excl}))
                except RoundTripConfigError:
                    ours = None
                case.assertEqual(ours, theirs)
