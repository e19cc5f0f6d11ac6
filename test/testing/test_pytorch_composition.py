"""Composition with pytorch's test idioms: generated classes subclass the author's, pytorch's
decorators are honoured or refused at class creation, declarations' errors name the author's class."""

import io
import pickle
import unittest

import torch
from torch.testing._internal.common_device_type import instantiate_device_type_tests, precisionOverride
from torch.testing._internal.common_utils import TestCase, parametrize, swap

from torch_serial_testing import (
    AllowlistError,
    RoundTripConfigError,
    SerializationRoundTripTestCase,
    instantiate_round_trip_tests,
    round_trip_dims,
)

from test.helpers.roundtrip_fixtures import MODE_SKIPS, SAFE_GLOBALS_SKIP
from test.ports._instantiate import PYTORCH_COPIES_METHODS, pytorch_subclasses_the_generic_class


class Settings:  # a checkpointed object that is not a module (its checkpoint never names builtins.set)
    def __init__(self):
        self.rate = 0.5


class TestAuthor(SerializationRoundTripTestCase, TestCase):
    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(2, 2)

    devices = ("cpu",)
    load_modes = ("weights_only_false", "safe_globals")
    safe_globals = (set,)  # misses Settings: its AllowlistError must name TestAuthor and keep set
    seen: list = []

    def setUp(self):
        super().setUp()  # zero-argument super(): the generated class is a TestAuthor
        self.ready = True

    @parametrize("width", [1, 2])
    @swap([True, False])
    def test_variants(self, device, width):
        self.assertTrue(self.ready)
        type(self).seen.append((self._testMethodName, torch.__future__.get_swap_module_params_on_conversion()))

    def test_nested_class_pickles(self, device):
        data = pickle.dumps(TestAuthor.Net())  # pickled as getattr(TestAuthor, 'Net'): needs TestAuthor
        self.assertIsInstance(pickle.loads(data), TestAuthor.Net)

    @round_trip_dims(load_modes=("safe_globals",))
    def test_declaration_error(self, device):
        with self.assertRaises(AllowlistError) as caught:
            self.round_trip(Settings())
        type(self).seen.append(str(caught.exception))

    @round_trip_dims(load_modes=("weights_only_false",))
    def test_each_mode_needs_no_mode_dimension(self, device):
        with self.assertRaisesRegex(RoundTripConfigError, r"round_trip_dims\(load_modes=\(\)\)"):
            self.round_trip_each_mode({"w": torch.ones(1)}, safe_globals=())


(TestAuthorCPU,) = instantiate_round_trip_tests(TestAuthor, globals())


def _run(cls):
    suite = unittest.defaultTestLoader.loadTestsFromTestCase(cls)
    return unittest.TextTestRunner(stream=io.StringIO(), verbosity=2).run(suite)


class TestGeneratedClasses(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        TestAuthor.seen.clear()
        cls.result = _run(TestAuthorCPU)

    def test_subclass_of_the_authors_class(self):
        self.assertTrue(issubclass(TestAuthorCPU, TestAuthor))
        self.assertIs(globals()["TestAuthor"], TestAuthor)  # still importable (its nested Net pickles)
        self.assertEqual(unittest.defaultTestLoader.loadTestsFromTestCase(TestAuthor).countTestCases(), 0)

    def test_all_pass(self):
        self.assertTrue(self.result.wasSuccessful(), self.result.failures + self.result.errors)
        # only the safe_globals mode's tests skip, and only on a torch without the context (< 2.5)
        skipped = sorted((test.id().rsplit(".", 1)[1], why) for test, why in self.result.skipped)
        self.assertTrue(all("_safe_globals_" in name and why == SAFE_GLOBALS_SKIP for name, why in skipped), skipped)
        self.assertEqual(len(skipped), 6 if SAFE_GLOBALS_SKIP else 0)

    def test_swap_and_parametrize_each_variant_ran(self):
        ran = sorted(entry for entry in TestAuthor.seen if isinstance(entry, tuple))
        expected = sorted(
            (f"test_variants_width_{w}_swap_{s}_{m}_cpu", s)
            for w in (1, 2)
            for s in (True, False)
            for m in ("weights_only_false", "safe_globals")
            if m not in MODE_SKIPS
        )
        self.assertEqual(ran, expected)  # the name's swap value is the one the body ran under

    @unittest.skipIf(SAFE_GLOBALS_SKIP, SAFE_GLOBALS_SKIP)
    def test_allowlist_error_names_the_authors_class_and_keeps_its_declaration(self):
        (message,) = [entry for entry in TestAuthor.seen if isinstance(entry, str)]
        self.assertTrue(message.startswith("TestAuthor.safe_globals misses 1 global(s)"), message)
        self.assertNotIn("TestAuthorCPU", message)
        self.assertIn("class TestAuthor(...):\n    safe_globals = (set, Settings)\n", message)


class TestRefusedDecorators(unittest.TestCase):
    def test_a_decorator_only_pytorch_applies_fails_at_instantiation_naming_it(self):
        class TestPrecise(SerializationRoundTripTestCase, TestCase):
            @precisionOverride({torch.float32: 1e-3})
            def test_x(self, device):
                pass

        with self.assertRaisesRegex(RoundTripConfigError, r"TestPrecise\.test_x is decorated with @precisionOverride"):
            instantiate_round_trip_tests(TestPrecise, {"__name__": __name__})


@unittest.skipIf(SAFE_GLOBALS_SKIP, SAFE_GLOBALS_SKIP)
class TestOneDeclarationForTwoModuleTypes(unittest.TestCase):
    def test_over_trust_is_judged_on_all_the_tests_round_trips(self):
        from test.helpers.roundtrip_fixtures import TinyNet

        class Both(SerializationRoundTripTestCase, unittest.TestCase):
            safe_globals = (TinyNet, torch.nn.Linear, set)

            def test_two_types(self):  # each checkpoint needs one of the two: together, both
                self.round_trip(TinyNet(), mode="safe_globals")
                self.round_trip(torch.nn.Linear(2, 1), mode="safe_globals")

            def test_one_type(self):  # Linear is never needed: over-trust, once the test is over
                self.round_trip(TinyNet(), mode="safe_globals")

        result = unittest.TextTestRunner(stream=io.StringIO()).run(
            unittest.defaultTestLoader.loadTestsFromTestCase(Both)
        )
        self.assertEqual(result.testsRun, 2)
        problems = [(test.id().rsplit(".", 1)[1], text) for test, text in result.failures + result.errors]
        self.assertEqual([name for name, _ in problems], ["test_one_type"], problems)
        self.assertIn(
            "Both.safe_globals over-trusts: the checkpoint does not need torch.nn.modules.linear.Linear", problems[0][1]
        )


class TestUnderPytorchsInstantiation(unittest.TestCase):
    def test_dimensions_and_parametrizations_are_generated_by_pytorch(self):
        if not pytorch_subclasses_the_generic_class():
            self.skipTest(PYTORCH_COPIES_METHODS)

        class TestPytorchStyle(SerializationRoundTripTestCase, TestCase):
            load_modes = ("default",)
            qengines = ("fbgemm",)

            def setUp(self):
                super().setUp()

            @parametrize("n", [1, 2])
            def test_y(self, device, n):
                self.assertEqual(self.load_mode.value, "default")
                self.assertEqual(self.qengine, "fbgemm")
                self.assertEqual(torch.backends.quantized.engine, "fbgemm")

        scope = {"TestPytorchStyle": TestPytorchStyle, "__name__": __name__}
        instantiate_device_type_tests(TestPytorchStyle, scope, only_for="cpu")
        cls = scope["TestPytorchStyleCPU"]
        names = sorted(n for n in dir(cls) if n.startswith("test_y"))
        self.assertEqual(names, ["test_y_n_1_fbgemm_default_cpu", "test_y_n_2_fbgemm_default_cpu"])
        if "fbgemm" in torch.backends.quantized.supported_engines:
            result = _run(cls)
            self.assertTrue(result.wasSuccessful(), result.failures + result.errors)
            self.assertEqual(result.testsRun, 2)


if __name__ == "__main__":
    unittest.main()
