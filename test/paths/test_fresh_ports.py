# Owner(s): ["module: serialization"]
"""Ports of the import-dependent loads, made in a fresh interpreter (:mod:`torch_serial_testing.paths.fresh`).

* pytorch's ``test_load_njt_weights_only`` (test/test_serialization.py): a jagged nested tensor loads weights-only
  only where ``torch._dynamo`` was imported (it registers ``_DimRange``); upstream runs ``python -c`` per case.
  torch 2.15 no longer registers the tensor's own two classes: they are declared, and a weights-only load the
  declaration does not reach is refused in every process (a predicted rejection, not an import's fault); its
  jagged tensors name no ``_DimRange``, so there they load without ``torch._dynamo``.
* A torchao-style subclass (:mod:`test.paths.aolike`): its package allowlists it at import, so a checkpoint
  holding one loads weights-only only where the package was imported.

What each load does is derived here from the load mode and the ``TORCH_FORCE_*`` switches alone."""

import os

import torch
from torch.testing._internal.common_utils import TestCase, parametrize, run_tests

from test.helpers.torch_trust import NJT_GLOBALS, pickled_globals, torch_trusts
from test.paths.aolike import ScaledTensor
from test.test_flagship_environments import effective_weights_only
from torch_serial_testing import SerializationRoundTripTestCase, instantiate_round_trip_tests
from torch_serial_testing.paths.fresh import FreshImportError, FreshInterpreterLoads


def weights_only(mode: str) -> bool:
    """torch.load's precedence: the force-on switch, the argument, the force-off switch, this torch's default."""
    return effective_weights_only(mode, {k: v for k, v in os.environ.items() if v not in ("", "0")})


def njt_refused_everywhere(mode: str) -> bool:
    """A weights-only load that the class's declaration does not reach (every mode but ``safe_globals``), on a torch
    that does not trust a jagged nested tensor's own classes itself (torch 2.4, torch 2.15)."""
    return weights_only(mode) and mode != "safe_globals" and not torch_trusts(*NJT_GLOBALS)


def names_a_dynamo_global(nt) -> bool:
    """Whether the tensor's pickle names a global of ``torch._dynamo`` (its ``_DimRange``, torch 2.6 to 2.14): then
    only an interpreter that imported torch._dynamo loads it weights-only."""
    return any(name.startswith("torch._dynamo.") for name in pickled_globals(nt))


def jagged():
    return torch.nested.nested_tensor([torch.randn(2, 3), torch.randn(4, 3)], layout=torch.jagged)


class TestFreshLoadNJT(FreshInterpreterLoads, SerializationRoundTripTestCase, TestCase):
    load_modes = ("weights_only_false", "safe_globals", "default")
    # The tensor's own classes, portably: torch 2.6 to 2.14 register them themselves (declared, they change
    # nothing there), torch 2.15 does not.  _DimRange stays undeclared: torch._dynamo registers it.
    safe_globals = NJT_GLOBALS

    def assertSameJagged(self, expected, loaded):  # noqa: N802
        self.assertIs(type(loaded), type(expected))
        self.assertIs(loaded.layout, torch.jagged)
        for a, b in zip(expected.unbind(), loaded.unbind(), strict=True):
            self.assertRoundTripEqual(a, b)

    @parametrize("should_import", [True, False])
    def test_load_njt_weights_only(self, device, should_import):
        nt = jagged()
        imports = ("torch", "torch._dynamo") if should_import else ("torch",)
        if njt_refused_everywhere(self.load_mode.value):
            # a weights-only load without the declaration, on a torch that trusts no NestedTensor itself: refused in
            # this process too, so not an import's fault; the rejection, asserted against torch's, ends the test
            self.round_trip_fresh(nt, imports=imports)
            self.fail("loaded weights-only without NestedTensor allowlisted")
        if should_import or not weights_only(self.load_mode.value) or not names_a_dynamo_global(nt):
            self.assertSameJagged(nt, self.round_trip_fresh(nt, imports=imports))
            return
        # loads here (this process imported torch._dynamo), refused where only torch is imported
        with self.assertRaisesRegex(FreshImportError, r"_DimRange is allowed in this process because it imported "
                                    r"torch\._dynamo, which registers it") as caught:  # fmt: skip
            self.round_trip_fresh(nt, imports=imports)
        self.assertIn("imports=('torch', 'torch._dynamo')", str(caught.exception))
        # and what torch itself said there, naming torch._dynamo as upstream asserts it (torch 2.6 to 2.14: "``torch.nested``
        # and ``torch._dynamo`` must be imported to load nested jagged tensors (NJTs)"; 2.15: the unsupported _DimRange)
        said = str(caught.exception).split("torch.load raised there: ", 1)[1]
        self.assertIn("torch._dynamo", said)
        self.assertSameJagged(nt, self.round_trip(nt))


class TestFreshLoadPackageSubclass(FreshInterpreterLoads, SerializationRoundTripTestCase, TestCase):
    load_modes = ("weights_only_false", "safe_globals", "default")
    fresh_imports = ("torch", "test.paths.aolike")

    def assertSameScaled(self, expected, loaded):  # noqa: N802
        self.assertIs(type(loaded), ScaledTensor)
        self.assertEqual(loaded.scale, expected.scale)
        self.assertTrue(torch.equal(loaded.as_subclass(torch.Tensor), expected.as_subclass(torch.Tensor)))

    def test_subclass_loads_where_its_package_is_imported(self, device):
        t = ScaledTensor.of(torch.arange(4.0), 0.5)
        self.assertSameScaled(t, self.round_trip_fresh(t))

    def test_subclass_refused_without_its_package(self, device):
        t = ScaledTensor.of(torch.arange(4.0), 0.25)
        if not weights_only(self.load_mode.value):  # a full load imports the class's module, and the package with it
            self.assertSameScaled(t, self.round_trip_fresh(t, imports=("torch",)))
            return
        with self.assertRaisesRegex(FreshImportError, r"ScaledTensor is allowed in this process because it imported "
                                    r"test\.paths\.aolike, which registers it") as caught:  # fmt: skip
            self.round_trip_fresh(t, imports=("torch",))
        self.assertIn("imports=('torch', 'test.paths.aolike')", str(caught.exception))
        self.assertSameScaled(t, self.round_trip(t))  # in this process it loads


instantiate_round_trip_tests(TestFreshLoadNJT, globals())
instantiate_round_trip_tests(TestFreshLoadPackageSubclass, globals())

if __name__ == "__main__":
    run_tests()
