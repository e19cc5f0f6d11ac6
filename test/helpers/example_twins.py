"""Plain-torch twins of the documentation's examples (docs/examples/): the same test classes and
names, the same saves and loads, written without the library (test/test_readme.py compares the
warnings each shows)."""

import textwrap

# What ``unittest -v`` shows of warnings must be the same for both
# (issue 25: the library quiets nothing and never makes Python forget a warning it showed once).
_TWIN_HELPERS = textwrap.dedent("""
    import io, pickle, unittest, warnings
    import torch

    DEFAULT_WEIGHTS_ONLY = {default_weights_only!r}

    def engine(name):
        class Engine:
            def __enter__(self):
                if name not in torch.backends.quantized.supported_engines:
                    raise unittest.SkipTest(f"quantized engine {{name}} is not supported here")
                self.previous = torch.backends.quantized.engine
                torch.backends.quantized.engine = name

            def __exit__(self, *exc):
                torch.backends.quantized.engine = self.previous
        return Engine()

    def round_trip(test, obj, mode, safe_globals, rejected_by_default):
        '''The library's three torch.load calls; None where the bare load rejects, as predicted.'''
        buf = io.BytesIO()
        torch.save(obj, buf)
        buf.seek(0)
        if mode == "weights_only_false":
            return torch.load(buf, weights_only=False)
        if mode == "safe_globals":
            if not hasattr(torch.serialization, "safe_globals"):
                test.skipTest("torch.serialization.safe_globals is missing")
            with torch.serialization.safe_globals(list(safe_globals)):
                return torch.load(buf, weights_only=True)
        if rejected_by_default and DEFAULT_WEIGHTS_ONLY:
            with test.assertRaises(pickle.UnpicklingError):
                torch.load(buf)
            return None
        return torch.load(buf)

    def generate(cls, name, body, engines=("fbgemm", "qnnpack"), modes=("weights_only_false", "safe_globals", "default")):
        for e in engines:
            for mode in modes:
                def test(self, e=e, mode=mode):
                    with engine(e):
                        body(self, mode)
                setattr(cls, f"{{name}}_{{e}}_{{mode}}_cpu", test)
""")

TINYNET_TWIN = _TWIN_HELPERS + textwrap.dedent("""
    class TinyNet(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.ones(2, 3))

    class TestTinyNetCPU(unittest.TestCase):
        def test_required_globals_cpu(self):
            pass  # never loads

    def full_module(self, mode):
        original = TinyNet()
        loaded = round_trip(self, original, mode, [TinyNet, set], rejected_by_default=True)
        if loaded is not None:
            self.assertTrue(torch.equal(original.weight, loaded.weight))

    def state_dict(self, mode):
        original = TinyNet()
        state = round_trip(self, original.state_dict(), mode, [], rejected_by_default=False)
        fresh = TinyNet()
        fresh.load_state_dict(state)
        self.assertTrue(torch.equal(original.weight, fresh.weight))

    generate(TestTinyNetCPU, "test_round_trip", full_module)
    generate(TestTinyNetCPU, "test_state_dict", state_dict)
""")

QDYNAMIC_TWIN = _TWIN_HELPERS + textwrap.dedent("""
    from torch.ao.nn.quantized.dynamic import Linear as DynamicLinear
    from torch.ao.nn.quantized.modules.linear import LinearPackedParams

    def setUpModule():  # the example's ignore_warnings, for every test of the file (its only class)
        warnings.filterwarnings("ignore", r".*quantized tensor creation functions.*")

    class TestDynamicLinearCPU(unittest.TestCase):
        pass

    def make_module():
        float_linear = torch.nn.Linear(4, 3)
        float_linear.qconfig = torch.ao.quantization.default_dynamic_qconfig
        return DynamicLinear.from_float(float_linear)

    def module(self, mode):
        original = make_module()
        loaded = round_trip(self, original, mode, [DynamicLinear, LinearPackedParams, torch.ScriptObject, set],
                            rejected_by_default=True)
        if loaded is not None:
            self.assertIs(type(loaded), DynamicLinear)
            weight, bias = original._weight_bias()
            weight2, bias2 = loaded._weight_bias()
            self.assertTrue(torch.equal(weight.dequantize(), weight2.dequantize()) and torch.equal(bias, bias2))

    generate(TestDynamicLinearCPU, "test_round_trip", module)
""")
