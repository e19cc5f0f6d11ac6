"""Import a test file's generated classes into an aggregator such as pytorch's ``test_ao_sparsity.py``.

pytorch's aggregators import test classes by name (``from ao.sparsity.test_x
import TestX  # noqa: F401``).  That cannot work for round-trip tests: the
generic class is replaced by generated ones, and which ones exist depends on
the machine and on ``PYTORCH_TESTING_DEVICE_ONLY_FOR`` / ``..._EXCEPT_FOR``, so
naming ``TestXCPU`` turns a device filter into an ImportError that takes every
other test of the aggregator down.  ``import_round_trip_tests`` binds whatever
the module generated here -- possibly nothing -- and never fails because of a
filter; it fails, saying why, only for a wrong module or generic name.
"""

from __future__ import annotations

import importlib
import inspect
import types
import unittest
from typing import Any, MutableMapping, Union

from ..core.errors import RoundTripConfigError
from .instantiation import generated_class_names

__all__ = ["import_round_trip_tests"]


def _module(module: Union[str, types.ModuleType]) -> types.ModuleType:
    if isinstance(module, types.ModuleType):
        return module
    if not isinstance(module, str) or not module:
        raise RoundTripConfigError(
            f"import_round_trip_tests needs a module or its dotted name, got {module!r}; "
            'e.g. import_round_trip_tests("ao.sparsity.test_qlinear_packed_params", globals())'
        )
    # An ImportError here is a real one (a typo, a broken file): it propagates unchanged.
    return importlib.import_module(module)


def import_round_trip_tests(
    module: Union[str, types.ModuleType], scope: MutableMapping[str, Any], *generic_names: str
) -> list[type]:
    """Bind into *scope* (an aggregator's ``globals()``) the test classes *module* defines here.

    Without *generic_names*: every ``unittest.TestCase`` class defined in *module*
    (its own ``__module__``), i.e. what running the file itself collects --
    the classes generated for this machine and filter, and plain test classes.
    With *generic_names* (``"TestQlinearPackedParams"``): only the classes
    generated from those.  Returns the classes bound, in the module's order.

    Raises :class:`RoundTripConfigError` if a generic name was never passed to
    ``instantiate_round_trip_tests`` in *module*, if *module* defines no test
    class and instantiated nothing, or if *scope* already holds a different
    object under one of the names.
    """
    mod = _module(module)
    generated = generated_class_names(mod.__name__)
    if generic_names:
        unknown = [g for g in generic_names if g not in generated]
        if unknown:
            known = ", ".join(sorted(generated)) or "none"
            raise RoundTripConfigError(
                f"{mod.__name__} never passed {', '.join(unknown)} to instantiate_round_trip_tests "
                f"(instantiated there: {known}); check the generic class name"
            )
        wanted = {name for g in generic_names for name in generated[g]}
        classes = [getattr(mod, name) for name in wanted if hasattr(mod, name)]
    else:
        classes = [
            obj for obj in vars(mod).values()
            if inspect.isclass(obj) and issubclass(obj, unittest.TestCase) and obj.__module__ == mod.__name__
        ]
        if not classes and not generated:
            raise RoundTripConfigError(
                f"{mod.__name__} defines no unittest.TestCase class and instantiated no round-trip tests; "
                "is it the right module?"
            )
    order = list(vars(mod))
    classes.sort(key=lambda c: order.index(c.__name__) if c.__name__ in order else len(order))
    for cls in classes:
        existing = scope.get(cls.__name__)
        if existing is not None and existing is not cls:
            raise RoundTripConfigError(
                f"{cls.__name__} from {mod.__name__} would replace {existing!r} already in the aggregator; "
                "rename one of the test classes"
            )
    for cls in classes:
        scope[cls.__name__] = cls
    return classes
