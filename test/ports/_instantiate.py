"""How the ports are instantiated: pytorch's ``instantiate_device_type_tests`` (the form a pytorch test
author writes), or -- with ``TORCH_SERIAL_TESTING_PORTS=library`` -- the library's own
``instantiate_round_trip_tests``; ``test_both_instantiations`` runs them both ways.

pytorch's instantiation makes the generic class a base of the classes it generates only since torch
2.5; before, it copies the generic class's methods onto classes that do not inherit from it, and a
``super().setUp()`` in the generic class (as the ports write) cannot work there.  Under such a torch
the ports use the library's instantiation, and the checks of pytorch's skip, saying so."""

import functools
import os

from torch.testing._internal.common_device_type import instantiate_device_type_tests
from torch.testing._internal.common_utils import TestCase

from torch_serial_testing import instantiate_round_trip_tests

ENV = "TORCH_SERIAL_TESTING_PORTS"


@functools.cache
def pytorch_subclasses_the_generic_class() -> bool:
    """Whether this torch's ``instantiate_device_type_tests`` generates subclasses of the generic class."""

    class Probe(TestCase):
        def test_probe(self, device):
            pass

    scope = {"Probe": Probe}
    instantiate_device_type_tests(Probe, scope, only_for="cpu")
    return issubclass(scope["ProbeCPU"], Probe)


PYTORCH_COPIES_METHODS = (
    "this torch's instantiate_device_type_tests copies the generic class's methods onto classes that do "
    "not inherit from it (before torch 2.5), so the ports' super().setUp() cannot work there"
)


def instantiate(generic_cls, scope):
    if os.environ.get(ENV) == "library" or not pytorch_subclasses_the_generic_class():
        instantiate_round_trip_tests(generic_cls, scope)
    else:
        instantiate_device_type_tests(generic_cls, scope, only_for="cpu")
