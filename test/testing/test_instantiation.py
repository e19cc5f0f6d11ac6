"""instantiate_round_trip_tests: names, dimensions, skips, restores, runners, composition, vendoring."""

import io
import os
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap
import unittest
from unittest import mock

import torch

from test.helpers.python_compat import verbose_ids
from test.helpers.roundtrip_fixtures import DEFAULT_WEIGHTS_ONLY, MODE_SKIPS, TINY_SAFE_GLOBALS, TinyNet
from test.helpers.subprocess_env import child_env, import_path
from torch_serial_testing import (
    RoundTripConfigError,
    SerializationRoundTripTestCase,
    cross_engine,
    instantiate_round_trip_tests,
    no_round_trip_dims,
    round_trip_dims,
)
from torch_serial_testing import dimensions
from torch_serial_testing.dimensions import resolve_devices

HERE = os.path.dirname(os.path.abspath(__file__))
TEST_DIR = os.path.dirname(HERE)
ROOT = os.path.dirname(TEST_DIR)
#: How a full TinyNet checkpoint's bare load ends here: rejected where a bare torch.load is weights-only.
DEFAULT_TINYNET = "default: rejected as expected" if DEFAULT_WEIGHTS_ONLY else "default: loaded as expected"


def make_generic(name="TestThing", body=None, **attrs):
    def test_rt(self, device):
        self.round_trip(TinyNet().to(device))

    def test_nodevice(self):
        pass

    namespace = {"safe_globals": TINY_SAFE_GLOBALS, "test_rt": test_rt, "test_nodevice": test_nodevice}
    namespace.update(body or {})
    namespace.update(attrs)
    return type(name, (SerializationRoundTripTestCase, unittest.TestCase), namespace)


def run(classes):
    stream = io.StringIO()
    suite = unittest.TestSuite(unittest.defaultTestLoader.loadTestsFromTestCase(c) for c in classes)
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCH_FORCE_")}
    with mock.patch.dict(os.environ, env, clear=True):
        return unittest.TextTestRunner(stream=stream, verbosity=2).run(suite), stream.getvalue()


class TestNames(unittest.TestCase):
    def test_pytorch_style_names(self):
        @cross_engine
        def test_cross(self, device):
            pass

        generic = make_generic(qengines=("fbgemm", "qnnpack"), devices=("cpu", "cuda"), body={"test_cross": test_cross})
        scope = {"__name__": "fake_module", "TestThing": generic}
        classes = instantiate_round_trip_tests(generic, scope)
        # The generic class stays (what it holds resolves under its name) with no test left to collect
        self.assertEqual(sorted(scope), ["TestThing", "TestThingCPU", "TestThingCUDA", "__name__"])
        self.assertIs(scope["TestThing"], generic)
        self.assertEqual(unittest.defaultTestLoader.loadTestsFromTestCase(generic).countTestCases(), 0)
        self.assertEqual([c.__name__ for c in classes], ["TestThingCPU", "TestThingCUDA"])
        cpu = sorted(n for n in dir(scope["TestThingCPU"]) if n.startswith("test"))
        expected_cpu = sorted(
            [
                f"test_rt_{e}_{m}_cpu"
                for e in ("fbgemm", "qnnpack")
                for m in ("weights_only_false", "safe_globals", "default")
            ]
            + [
                f"test_nodevice_{e}_{m}_cpu"
                for e in ("fbgemm", "qnnpack")
                for m in ("weights_only_false", "safe_globals", "default")
            ]
            + [
                f"test_cross_{a}_to_{b}_{m}_cpu"
                for a, b in (("fbgemm", "qnnpack"), ("qnnpack", "fbgemm"))
                for m in ("weights_only_false", "safe_globals", "default")
            ]
        )
        self.assertEqual(cpu, expected_cpu)
        cuda = sorted(n for n in dir(scope["TestThingCUDA"]) if n.startswith("test"))
        self.assertEqual(len(cuda), 2 * len(expected_cpu))
        self.assertIn("test_rt_qnnpack_default_cuda_to_cpu", cuda)
        self.assertIn("test_cross_qnnpack_to_fbgemm_safe_globals_cuda", cuda)
        self.assertEqual(scope["TestThingCPU"].__module__, "fake_module")

    def test_no_engine_dimension_and_narrowed_modes(self):
        generic = make_generic(load_modes=("default",), devices=("cpu",))
        scope = {}
        (cls,) = instantiate_round_trip_tests(generic, scope)
        self.assertEqual(
            sorted(n for n in dir(cls) if n.startswith("test")), ["test_nodevice_default_cpu", "test_rt_default_cpu"]
        )

    def test_names_identical_across_processes(self):
        code = (
            "import sys; sys.path.insert(0, %r); import unittest, test.testing.test_example_roundtrip as m; "
            "print(sorted(c + '.' + n for c, v in vars(m).items() if isinstance(v, type) and issubclass(v, unittest.TestCase) "
            "for n in unittest.defaultTestLoader.getTestCaseNames(v)))"
        ) % ROOT
        outs = {
            subprocess.run(
                [sys.executable, "-c", code],
                capture_output=True,
                text=True,
                check=True,
                env=child_env({"PYTHONHASHSEED": str(seed)}, drop=()),
            ).stdout
            for seed in (1, 2)
        }
        self.assertEqual(len(outs), 1)


class TestDimensions(unittest.TestCase):
    def test_unavailable_device_and_unsupported_engine_skip_with_reason(self):
        generic = make_generic(qengines=("fbgemm", "qnnpack"), devices=("cpu", "cuda"))
        scope = {}
        classes = instantiate_round_trip_tests(generic, scope)
        with mock.patch.object(dimensions, "supported_qengines", lambda: ("fbgemm",)):
            result, out = run(classes)
        self.assertTrue(result.wasSuccessful(), out)
        reasons = {reason for _, reason in result.skipped}
        if not torch.cuda.is_available():
            self.assertIn("CUDA is not available", reasons)
        self.assertTrue(
            any(r.startswith("quantized engine 'qnnpack' is not supported by this torch build") for r in reasons)
        )
        skipped_ids = {t.id().rsplit(".", 1)[1] for t, _ in result.skipped}
        self.assertIn("test_rt_qnnpack_default_cpu", skipped_ids)
        self.assertNotIn("test_rt_fbgemm_default_cpu", skipped_ids)

    def test_engine_and_allocator_set_during_test_and_restored(self):
        seen = {}

        def test_engine(self, device):
            seen[self.id().rsplit(".", 1)[1]] = (torch.backends.quantized.engine, dimensions.allocator_installed())

        generic = make_generic(
            qengines=("fbgemm", "qnnpack"), devices=("cpu",), load_modes=("default",), body={"test_engine": test_engine}
        )
        before = torch.backends.quantized.engine
        (cls,) = instantiate_round_trip_tests(generic, {})
        result, out = run([cls])
        self.assertTrue(result.wasSuccessful(), out)
        self.assertEqual(seen["test_engine_fbgemm_default_cpu"], ("fbgemm", False))
        # the body: the engine set, the allocator as found (pytorch's override_cpu_allocator_for_qnnpack may
        # install it there); the library's own qnnpack loads install it (test_qnnpack_allocator.py)
        self.assertEqual(seen["test_engine_qnnpack_default_cpu"], ("qnnpack", False))
        self.assertEqual(torch.backends.quantized.engine, before)
        self.assertIs(dimensions.allocator_installed(), False)

    def test_restored_after_failure(self):
        def test_boom(self):
            raise ValueError("boom")

        generic = make_generic(
            qengines=("qnnpack",), devices=("cpu",), load_modes=("default",), body={"test_boom": test_boom}
        )
        before = torch.backends.quantized.engine
        (cls,) = instantiate_round_trip_tests(generic, {})
        result, _ = run([cls])
        self.assertEqual(len(result.errors), 1)
        self.assertEqual(torch.backends.quantized.engine, before)
        self.assertIs(dimensions.allocator_installed(), False)

    def test_cross_engine_loads_under_second_engine(self):
        seen = []

        @cross_engine
        def test_x(self, device):
            built = torch.backends.quantized.engine
            with self.loading_engine():
                seen.append((built, torch.backends.quantized.engine, self.qengine, self.load_qengine))

        generic = make_generic(
            qengines=("fbgemm", "qnnpack"), devices=("cpu",), load_modes=("default",), body={"test_x": test_x}
        )
        (cls,) = instantiate_round_trip_tests(generic, {})
        result, out = run([cls])
        self.assertTrue(result.wasSuccessful(), out)
        self.assertIn(("fbgemm", "qnnpack", "fbgemm", "qnnpack"), seen)
        self.assertIn(("qnnpack", "fbgemm", "qnnpack", "fbgemm"), seen)

    def test_env_device_filters(self):
        self.assertEqual(resolve_devices(("cpu", "cuda"), {"PYTORCH_TESTING_DEVICE_ONLY_FOR": "cuda"}), ("cuda",))
        self.assertEqual(resolve_devices(("cpu", "cuda"), {"PYTORCH_TESTING_DEVICE_EXCEPT_FOR": "cuda, xpu"}), ("cpu",))
        self.assertEqual(resolve_devices(None, {}), ("cpu",) + (("cuda",) if torch.cuda.is_available() else ()))
        # Both filters together, as pytorch allows (#13.4); only a device named in both is refused.
        self.assertEqual(
            resolve_devices(
                ("cpu",), {"PYTORCH_TESTING_DEVICE_ONLY_FOR": "cpu", "PYTORCH_TESTING_DEVICE_EXCEPT_FOR": "cuda"}
            ),
            ("cpu",),
        )
        with self.assertRaisesRegex(RoundTripConfigError, r"\['cpu'\] appear in both PYTORCH_TESTING_DEVICE_ONLY_FOR"):
            resolve_devices(
                ("cpu",), {"PYTORCH_TESTING_DEVICE_ONLY_FOR": "cpu", "PYTORCH_TESTING_DEVICE_EXCEPT_FOR": "cpu"}
            )

    def test_privateuse1_backend_naming_and_aliases(self):
        # Renaming privateuse1 is irreversible, so it runs in a subprocess.  Whether the env filters
        # read the backend's name (npu) as privateuse1 is asked of pytorch's filter by the library, in
        # this process (pytorch's test module is imported for it, only then).  The child also asks
        # the real filter itself; both answers must equal it.
        code = textwrap.dedent("""
            import sys, torch, types
            from torch_serial_testing import dimensions
            def out(*args):  # marked: pytorch's test modules print notices of their own
                print("OUT", *args)
            out(dimensions.class_suffix("privateuse1"))
            torch.utils.rename_privateuse1_backend("npu")
            mod = types.ModuleType("torch.npu"); mod.is_available = lambda: True; torch._register_device_module("npu", mod)
            out(dimensions.class_suffix("privateuse1"), dimensions.available_device_types())
            out(dimensions.resolve_devices(("cpu", "npu"), {"PYTORCH_TESTING_DEVICE_ONLY_FOR": "privateuse1"}))
            out("fresh" if "torch.testing._internal.common_device_type" not in sys.modules else "imported")
            out(dimensions.resolve_devices(("cpu", "privateuse1"), {"PYTORCH_TESTING_DEVICE_EXCEPT_FOR": "npu"}))
            from torch.testing._internal import common_device_type as cdt
            class Base:
                device_type = "privateuse1"
            out("pytorch drops it" if Base not in list(cdt.filter_desired_device_types([Base], ["npu"], None))
                  else "pytorch keeps it")
            dimensions._aliasing.clear()  # ask again, now in this process
            out(dimensions.resolve_devices(("cpu", "privateuse1"), {"PYTORCH_TESTING_DEVICE_EXCEPT_FOR": "npu"}))
        """)
        out = subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            check=True,
            env=child_env(drop=("PYTORCH_TESTING_DEVICE_",)),
        ).stdout.split("\n")
        out = [line[len("OUT ") :] for line in out if line.startswith("OUT ")]
        self.assertEqual(out[0], "PRIVATEUSE1")
        self.assertEqual(out[1], "NPU ('cpu', 'npu')")
        self.assertEqual(out[2], "('npu',)")
        self.assertEqual(out[3], "imported")  # asked of pytorch's filter in this process
        # excluding the backend by its name: exactly as pytorch's own filter reads that name
        # (torch 2.4's compares names as written and keeps the privateuse1 base)
        self.assertIn(out[5], ("pytorch drops it", "pytorch keeps it"))
        expected = "('cpu',)" if out[5] == "pytorch drops it" else "('cpu', 'privateuse1')"
        self.assertEqual(out[4], expected)
        self.assertEqual(out[6], expected)

    def test_filter_aliasing_is_asked_of_pytorchs_filter(self):
        # The shapes pytorch's filter has had, as behaviours: names compared as written (2.4), the
        # backend's name replaced inside the filter (2.5-2.14), replaced by a helper the filter calls
        # (2.15).  Only the last two make ``npu`` and ``privateuse1`` one name in the env filters;
        # the library's probe calls whichever filter is there and reads what it does.
        from torch.testing._internal import common_device_type as cdt  # tests may import it, the library never

        backend = "npu"
        calls = []

        def plain(bases, except_for=None, only_for=None):
            calls.append((list(bases), except_for, only_for))
            return [
                b
                for b in bases
                if b.device_type not in (except_for or []) and (not only_for or b.device_type in only_for)
            ]

        def inline(bases, except_for=None, only_for=None):
            calls.append((list(bases), except_for, only_for))
            excl = [x.replace(backend, "privateuse1") for x in (except_for or [])]
            only = [x.replace(backend, "privateuse1") for x in (only_for or [])]
            return [b for b in bases if b.device_type not in excl and (not only or b.device_type in only)]

        def normalizer():
            return lambda name: name.replace(backend, "privateuse1")

        def helper(bases, except_for=None, only_for=None):
            calls.append((list(bases), except_for, only_for))
            rename = normalizer()
            excl = [rename(x) for x in (except_for or [])]
            only = [rename(x) for x in (only_for or [])]
            return [
                b for b in bases if rename(b.device_type) not in excl and (not only or rename(b.device_type) in only)
            ]

        for fn, aliases in ((plain, False), (inline, True), (helper, True)):
            with (
                self.subTest(filter=fn.__name__),
                mock.patch.dict(dimensions._aliasing, clear=True),
                mock.patch.object(cdt, "filter_desired_device_types", fn),
            ):
                calls.clear()
                self.assertIs(dimensions._filters_alias_backend_name(backend), aliases)
                # asked once, of the filter that is there: a privateuse1 test base, the backend's name
                self.assertEqual(len(calls), 1)
                ((bases, except_for, only_for),) = calls
                self.assertEqual([b.device_type for b in bases], ["privateuse1"])
                self.assertIn(backend, list(except_for or []) + list(only_for or []))
                # remembered: a second question does not call the filter again
                self.assertIs(dimensions._filters_alias_backend_name(backend), aliases)
                self.assertEqual(len(calls), 1)

        # and pytorch's real filter here, asked the same way by the test itself
        class Base:
            device_type = "privateuse1"

        with mock.patch.dict(dimensions._aliasing, clear=True):
            self.assertIs(
                dimensions._filters_alias_backend_name(backend),
                Base in list(cdt.filter_desired_device_types([Base], None, [backend])),
            )

    def test_filter_aliasing_that_cannot_be_asked_says_so(self):
        # The library asks pytorch's filter in this process (never a child interpreter); where pytorch's
        # test module cannot be imported, instantiation stops saying why and what to do -- never a
        # guessed rule.
        modules = dict(sys.modules)
        modules["torch.testing._internal"] = None  # a torch without its test helpers: importing them fails
        with (
            mock.patch.dict(dimensions._aliasing, clear=True),
            mock.patch.dict(sys.modules, modules, clear=True),
            mock.patch.object(subprocess, "run", side_effect=AssertionError("a child interpreter")) as ran,
            mock.patch.object(subprocess, "Popen", side_effect=AssertionError("a child interpreter")) as popen,
        ):
            with self.assertRaisesRegex(
                RoundTripConfigError,
                r"^cannot tell how pytorch's filter_desired_device_types reads PYTORCH_TESTING_DEVICE_ONLY_FOR/"
                r"PYTORCH_TESTING_DEVICE_EXCEPT_FOR for the npu backend: "
                r"torch\.testing\._internal\.common_device_type cannot be imported \(ModuleNotFoundError: import "
                r"of torch\.testing\._internal halted; None in sys\.modules\); unset the filters$",
            ):
                dimensions._filters_alias_backend_name("npu")
            self.assertNotIn("npu", dimensions._aliasing)  # a failed question is not remembered
        self.assertEqual((ran.call_count, popen.call_count), (0, 0))


class TestBadInput(unittest.TestCase):
    def test_errors(self):
        cases = [
            (dict(qengines=("fbgemm", "tpu")), "unknown quantized engine 'tpu'"),
            (dict(qengines=()), "qengines is empty"),
            (dict(qengines="fbgemm"), "qengines must be a tuple, got 'fbgemm'; write qengines = ("),
            (dict(devices=("gpu",)), "unknown device type 'gpu'"),
            (dict(devices=()), "devices is empty"),
            (dict(load_modes=()), "load_modes is empty"),
            (dict(qengines=("fbgemm", "fbgemm")), "qengines lists fbgemm more than once"),
            (dict(devices=("cpu", "cpu")), "devices lists cpu more than once"),
        ]
        for attrs, message in cases:
            with self.subTest(attrs=attrs), self.assertRaisesRegex(RoundTripConfigError, re.escape(message)):
                instantiate_round_trip_tests(make_generic(**attrs), {})

    def test_no_test_methods(self):
        generic = type("TestEmpty", (SerializationRoundTripTestCase, unittest.TestCase), {})
        with self.assertRaisesRegex(RoundTripConfigError, "TestEmpty has no test methods"):
            instantiate_round_trip_tests(generic, {})

    def test_name_clash(self):
        generic = make_generic(devices=("cpu",))
        with self.assertRaisesRegex(RoundTripConfigError, "TestThingCPU already exists"):
            instantiate_round_trip_tests(generic, {"TestThingCPU": object()})

    def test_cross_engine_needs_two(self):
        generic = make_generic(qengines=("fbgemm",), body={"test_c": cross_engine(lambda self: None)})
        with self.assertRaisesRegex(RoundTripConfigError, "@cross_engine but the class declares 1 qengine"):
            instantiate_round_trip_tests(generic, {})

    def test_not_a_mixin_class(self):
        with self.assertRaisesRegex(RoundTripConfigError, "must subclass SerializationRoundTripTestCase"):
            instantiate_round_trip_tests(unittest.TestCase, {})


def _python(args, cwd=HERE, env=None):
    full = child_env(path_first=(ROOT,))
    full.update(env or {})  # an explicit PYTHONPATH (the vendoring test's "") is kept as given
    return subprocess.run([sys.executable, *args], cwd=cwd, env=full, capture_output=True, text=True)


def _ids_from_unittest(output):
    return sorted(re.findall(r"^(test_\w+) \(", output, re.M))


def _ids_from_pytest(output):
    return sorted(re.findall(r"::(test_\w+)", output))


def _mode_skip(test_name):
    """The library's skip reason for a generated test whose load mode this torch cannot run, or None."""
    reasons = [r for mode, r in MODE_SKIPS.items() if test_name.endswith(f"_{mode}_cpu")]
    return reasons[0] if reasons else None


def _passed_from_pytest(output):
    """Test ids of the ``-rA`` summary's PASSED lines (the warnings summary names tests too); with the
    plugin loaded (installed: its entry point) a rejection's line reads ``PASSED (rejected ...) <nodeid>``."""
    return sorted(re.findall(r"^PASSED(?: \(.*\))? \S*::(test_\w+)$", output, re.M))


class TestInheritedTests(unittest.TestCase):
    """Tests from a shared base class or a plain mixin are generated; the bases are never collected."""

    SOURCE = textwrap.dedent("""
        import unittest
        from test.helpers.roundtrip_fixtures import TinyNet, Wrapper
        from torch_serial_testing import SerializationRoundTripTestCase, instantiate_round_trip_tests

        class RoundTripChecks:  # a plain mixin (pattern of model-tester suites): not a TestCase
            def test_from_mixin(self, device):
                module = self.make_module()
                self.assertRoundTripEqual(module, self.round_trip(module))

        class SharedBase(SerializationRoundTripTestCase, unittest.TestCase):  # a generic TestCase base
            devices = ("cpu",)
            load_modes = ("weights_only_false", "default")

            def test_from_base(self, device):
                self.round_trip(self.make_module())

            def test_overridden(self, device):
                if isinstance(self.make_module(), TinyNet):
                    raise AssertionError("TestTiny overrides this")

            def test_hidden(self, device):
                if isinstance(self.make_module(), TinyNet):
                    raise AssertionError("TestTiny hides this")

        class TestTiny(RoundTripChecks, SharedBase):
            def make_module(self):
                return TinyNet()

            def test_overridden(self, device):
                self.assertEqual(device, "cpu")

            test_hidden = None

            def test_own(self, device):
                pass

        class TestWrapper(RoundTripChecks, SharedBase):
            def make_module(self):
                return Wrapper()

        instantiate_round_trip_tests(TestTiny, globals())
        instantiate_round_trip_tests(TestWrapper, globals())
    """)

    def expected_ids(self):
        modes = ("weights_only_false", "default")
        tiny = [
            f"TestTinyCPU.test_{n}_{m}_cpu" for n in ("from_mixin", "from_base", "overridden", "own") for m in modes
        ]
        wrapper = [
            f"TestWrapperCPU.test_{n}_{m}_cpu"
            for n in ("from_mixin", "from_base", "overridden", "hidden")
            for m in modes
        ]
        return sorted(tiny + wrapper)

    def test_generated_and_collected_by_every_runner(self):
        with tempfile.TemporaryDirectory() as d:
            with open(os.path.join(d, "test_inherited.py"), "w") as fh:
                fh.write(self.SOURCE)
            env = {"PYTHONPATH": import_path(ROOT)}  # the suite's own path too: the library may be only there
            proc = _python(["-m", "unittest", "test_inherited", "-v"], cwd=d, env=env)
            collected = _python(
                ["-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "test_inherited.py"], cwd=d, env=env
            )
        self.assertEqual(proc.returncode, 0, proc.stderr)
        ran = sorted(i.split(".", 1)[1] for i in verbose_ids(proc.stderr) if i.startswith("test_inherited."))
        self.assertEqual(ran, self.expected_ids(), proc.stderr)
        self.assertIn("Ran 16 tests", proc.stderr)
        self.assertNotIn("SharedBase", proc.stderr)  # the generic base is not collected
        pytest_ids = sorted(
            line.split("::", 1)[1].replace("::", ".") for line in collected.stdout.splitlines() if "::" in line
        )
        self.assertEqual(pytest_ids, self.expected_ids(), collected.stdout)

    def test_scope_keeps_only_generated_classes(self):
        class Mixin:
            def test_m(self, device):
                pass

        class Base(SerializationRoundTripTestCase, unittest.TestCase):
            devices = ("cpu",)
            load_modes = ("default",)

            def test_b(self, device):
                pass

        class TestA(Mixin, Base):
            pass

        scope = {"Mixin": Mixin, "Base": Base, "TestA": TestA, "__name__": "m"}
        (cls,) = instantiate_round_trip_tests(TestA, scope)
        self.assertEqual(sorted(scope), ["Mixin", "TestA", "TestACPU", "__name__"])  # Mixin: not a TestCase
        # the generic class stays (what it holds resolves under its name), with no test left to collect
        self.assertEqual(unittest.defaultTestLoader.loadTestsFromTestCase(TestA).countTestCases(), 0)
        names = sorted(n for n in dir(cls) if n.startswith("test") and callable(getattr(cls, n)))
        self.assertEqual(names, ["test_b_default_cpu", "test_m_default_cpu"])


class TestRoundTripDims(unittest.TestCase):
    """@round_trip_dims / @no_round_trip_dims narrow or drop one method's dimensions."""

    def generated(self, body, **attrs):
        generic = make_generic(qengines=("fbgemm", "qnnpack"), devices=("cpu",), body=body, **attrs)
        (cls,) = instantiate_round_trip_tests(generic, {})
        return cls, sorted(n for n in dir(cls) if n.startswith("test") and callable(getattr(cls, n)))

    def test_no_dims(self):
        seen = []

        @no_round_trip_dims
        def test_required_globals(self, device):
            seen.append((device, self.load_mode, self.qengine))

        cls, names = self.generated({"test_required_globals": test_required_globals})
        self.assertIn("test_required_globals_cpu", names)
        self.assertEqual([n for n in names if n.startswith("test_required_globals")], ["test_required_globals_cpu"])
        self.assertEqual(len([n for n in names if n.startswith("test_rt_")]), 6)  # the others keep theirs
        result, out = run([cls])
        self.assertTrue(result.wasSuccessful(), out)
        self.assertEqual(seen, [("cpu", None, None)])

    def test_narrowed(self):
        @round_trip_dims(load_modes=("default",), qengines=("qnnpack",))
        def test_narrow(self, device):
            pass

        @round_trip_dims(qengines=None)
        def test_no_engine(self, device):
            pass

        _, names = self.generated({"test_narrow": test_narrow, "test_no_engine": test_no_engine})
        self.assertEqual([n for n in names if n.startswith("test_narrow")], ["test_narrow_qnnpack_default_cpu"])
        self.assertEqual(
            [n for n in names if n.startswith("test_no_engine")],
            ["test_no_engine_default_cpu", "test_no_engine_safe_globals_cpu", "test_no_engine_weights_only_false_cpu"],
        )

    def test_round_trip_without_a_mode_says_why(self):
        @no_round_trip_dims
        def test_loads(self, device):
            self.round_trip(TinyNet())

        cls, _ = self.generated({"test_loads": test_loads})
        result, out = run([cls])
        (error,) = [text for test, text in result.errors if "test_loads" in test.id()]
        self.assertIn("this test has no load mode", error)
        self.assertIn("no_round_trip_dims", error)

    def test_devices_narrowed_skip_visibly_elsewhere(self):
        @round_trip_dims(devices=("cuda",))
        def test_cuda_only(self, device):
            raise AssertionError("must not run in the cpu class")

        cls, names = self.generated({"test_cuda_only": test_cuda_only}, load_modes=("default",))
        self.assertIn("test_cuda_only_fbgemm_default_cpu", names)
        result, out = run([cls])
        self.assertTrue(result.wasSuccessful(), out)
        self.assertIn("skipped 'test_cuda_only runs only on cuda (round_trip_dims(devices=...))'", out)

    def test_bad_input(self):
        with self.assertRaisesRegex(RoundTripConfigError, "must be a tuple"):
            round_trip_dims(load_modes="default")
        with self.assertRaisesRegex(RoundTripConfigError, "unknown quantized engine"):
            round_trip_dims(qengines=("fbgemmm",))
        with self.assertRaisesRegex(RoundTripConfigError, "unknown device type 'gpu'"):
            round_trip_dims(devices=("gpu",))
        with self.assertRaisesRegex(RoundTripConfigError, "lists default more than once"):
            round_trip_dims(load_modes=("default", "default"))

        @cross_engine
        @round_trip_dims(qengines=None)
        def test_cross(self, device):
            pass

        with self.assertRaisesRegex(RoundTripConfigError, "@cross_engine but its round_trip_dims give 0 qengine"):
            self.generated({"test_cross": test_cross})


class TestExtraGridDimensions(unittest.TestCase):
    def test_parameterized_expand_composes_with_the_generated_dimensions(self):
        from parameterized import parameterized

        seen = []

        class TestGrid(SerializationRoundTripTestCase, unittest.TestCase):
            safe_globals = TINY_SAFE_GLOBALS
            devices = ("cpu",)
            qengines = ("fbgemm", "qnnpack")
            load_modes = ("weights_only_false", "default")

            @parameterized.expand([("small", 1), ("large", 300)])
            def test_grid(self, device, name, scale):
                module = TinyNet()
                with torch.no_grad():
                    module.weight.mul_(scale)
                seen.append((name, self.qengine, self.load_mode.value, device))
                self.assertRoundTripEqual(module, self.round_trip(module))

        (cls,) = instantiate_round_trip_tests(TestGrid, {})
        names = sorted(n for n in dir(cls) if n.startswith("test") and callable(getattr(cls, n)))
        self.assertEqual(
            names,
            sorted(
                f"test_grid_{i}_{name}_{e}_{m}_cpu"
                for i, name in enumerate(("small", "large"))
                for e in ("fbgemm", "qnnpack")
                for m in ("weights_only_false", "default")
            ),
        )
        result, out = run([cls])
        self.assertTrue(result.wasSuccessful(), out)
        self.assertEqual(
            sorted(seen),
            sorted(
                (name, e, m, "cpu")
                for name in ("small", "large")
                for e in ("fbgemm", "qnnpack")
                for m in ("weights_only_false", "default")
            ),
        )
        self.assertEqual(out.count(DEFAULT_TINYNET), 4, out)


class TestRunners(unittest.TestCase):
    """unittest discovery, explicit ids, pytest, -k and xdist all see the same generated tests."""

    def test_runners_agree(self):
        discover = _python(["-m", "unittest", "discover", "-s", ".", "-p", "test_example_roundtrip.py", "-v"])
        self.assertEqual(discover.returncode, 0, discover.stderr)
        ids = _ids_from_unittest(discover.stderr)
        self.assertEqual(len(ids), 12)
        self.assertNotIn("TestTinyNetSerialization ", discover.stderr)  # generic class never collected

        one = _python(
            [
                "-m",
                "unittest",
                "test_example_roundtrip.TestTinyNetSerializationCPU.test_round_trip_qnnpack_default_cpu",
                "-v",
            ]
        )
        self.assertEqual(one.returncode, 0, one.stderr)
        self.assertIn(DEFAULT_TINYNET, one.stderr)
        self.assertIn("Ran 1 test", one.stderr)

        collected = _python(
            ["-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "test_example_roundtrip.py"]
        )
        self.assertEqual(_ids_from_pytest(collected.stdout), ids, collected.stdout)

        selected = _python(
            [
                "-m",
                "pytest",
                "-q",
                "-p",
                "no:cacheprovider",
                "-rA",
                "-k",
                "qnnpack and default",
                "test_example_roundtrip.py",
            ]
        )
        self.assertEqual(selected.returncode, 0, selected.stdout)
        self.assertEqual(
            _passed_from_pytest(selected.stdout),
            ["test_round_trip_qnnpack_default_cpu", "test_state_dict_qnnpack_default_cpu"],
            selected.stdout,
        )

        xdist = _python(["-m", "pytest", "-n", "2", "-p", "no:cacheprovider", "-rA", "-q", "test_example_roundtrip.py"])
        self.assertEqual(xdist.returncode, 0, xdist.stdout)
        # A test whose load mode this torch cannot run (safe_globals before torch 2.5) skips with the
        # library's reason in every runner; every other one passes.
        skips = {i: _mode_skip(i) for i in ids if _mode_skip(i)}
        passed = [i for i in ids if i not in skips]
        self.assertEqual(_passed_from_pytest(xdist.stdout), passed, xdist.stdout)
        self.assertIn(f"{len(passed)} passed, {len(skips)} skipped" if skips else "12 passed", xdist.stdout)
        for reason in set(skips.values()):
            count = sum(r == reason for r in skips.values())
            # pytest groups skips by the line that raised them: one line per skipping location
            lines = re.findall(rf"(?m)^SKIPPED \[(\d+)\] \S+: {re.escape(reason)}$", xdist.stdout)
            self.assertEqual(sum(map(int, lines)), count, xdist.stdout)
        for test_id, reason in skips.items():
            self.assertIn(
                f"{test_id} (test_example_roundtrip.TestTinyNetSerializationCPU.{test_id}) ... skipped {reason!r}\n",
                discover.stderr,
            )
        self.assertIn(f"OK (skipped={len(skips)})" if skips else "\nOK\n", discover.stderr)


class TestComposition(unittest.TestCase):
    SOURCE = textwrap.dedent("""
        import unittest, sys
        {imports}
        from test.helpers.roundtrip_fixtures import TinyNet
        from torch_serial_testing import SerializationRoundTripTestCase, instantiate_round_trip_tests

        class TestComposed(SerializationRoundTripTestCase, {base}):
            safe_globals = (TinyNet, set)  # set: allowlisted by torch only since 2.6
            devices = ("cpu",)

            def test_rt(self, device):
                loaded = self.round_trip(TinyNet())
                self.assertRoundTripEqual(TinyNet(), loaded)
                {extra}

        instantiate_round_trip_tests(TestComposed, globals())
    """)

    def _run(self, imports, base, extra="pass"):
        with tempfile.TemporaryDirectory() as d:
            with open(os.path.join(d, "test_composed.py"), "w") as fh:
                fh.write(self.SOURCE.format(imports=imports, base=base, extra=extra))
            proc = _python(["-m", "unittest", "test_composed", "-v"], cwd=d, env={"PYTHONPATH": import_path(ROOT)})
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertIn("Ran 3 tests", proc.stderr)
        self.assertIn(DEFAULT_TINYNET, proc.stderr)
        return proc

    def test_expecttest_testcase(self):
        self._run("import expecttest", "expecttest.TestCase", 'self.assertExpectedInline("x", """x""")')

    def test_pytorch_common_utils_testcase(self):
        # The library never imports torch.testing._internal; composing with it must still work.
        self._run(
            "from torch.testing._internal.common_utils import TestCase",
            "TestCase",
            "self.assertEqual(loaded.weight, TinyNet().weight)",
        )

    def test_library_does_not_import_internal_or_numpy(self):
        code = "import torch_serial_testing, sys; print(sorted(m for m in sys.modules if m.startswith(('numpy', 'torch.testing._internal', 'parameterized'))))"
        proc = _python(["-c", code])
        self.assertEqual(proc.stdout.strip(), "[]", proc.stderr)


class TestVendoring(unittest.TestCase):
    def test_copied_folder_works_without_pip(self):
        with tempfile.TemporaryDirectory() as d:
            shutil.copytree(
                os.path.join(ROOT, "torch_serial_testing"),
                os.path.join(d, "vendored_tst"),
                ignore=shutil.ignore_patterns("__pycache__"),
            )
            shutil.copy(os.path.join(TEST_DIR, "helpers", "roundtrip_fixtures.py"), d)
            with open(os.path.join(HERE, "test_example_roundtrip.py")) as fh:
                source = fh.read().replace("from torch_serial_testing import", "from vendored_tst import")
            source = source.replace("from test.helpers.roundtrip_fixtures import", "from roundtrip_fixtures import")
            with open(os.path.join(d, "test_vendored.py"), "w") as fh:
                fh.write(
                    source
                    + textwrap.dedent("""
                    import sys as _sys
                    assert "torch_serial_testing" not in _sys.modules, "vendored copy imported the installed package"
                """)
                )
            proc = _python(["-m", "unittest", "test_vendored", "-v"], cwd=d, env={"PYTHONPATH": ""})
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertIn("Ran 12 tests", proc.stderr)


if __name__ == "__main__":
    unittest.main()
