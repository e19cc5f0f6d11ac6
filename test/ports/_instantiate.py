"""How the ports are instantiated: pytorch's ``instantiate_device_type_tests`` (the form a pytorch test
author writes), or -- with ``TORCH_SERIAL_TESTING_PORTS=library`` -- the library's own
``instantiate_round_trip_tests``; ``test_both_instantiations`` runs them both ways."""

import os

from torch.testing._internal.common_device_type import instantiate_device_type_tests

from torch_serial_testing import instantiate_round_trip_tests

ENV = "TORCH_SERIAL_TESTING_PORTS"


def instantiate(generic_cls, scope):
    if os.environ.get(ENV) == "library":
        instantiate_round_trip_tests(generic_cls, scope)
    else:
        instantiate_device_type_tests(generic_cls, scope, only_for="cpu")
