"""numpy in round trips: values compared exactly, and a checkpoint written under numpy 1 predicted and fixed right.

A checkpoint written under numpy 1 names ``numpy.core.multiarray.scalar`` (and ``_reconstruct``); under numpy 2
those objects live in ``numpy._core``, and torch keys a safe global by the object's own ``module.qualname``, so
allowlisting the live objects does nothing for such a checkpoint: only the ``(object, 'numpy.core...')`` form
does.  The checkpoint is the test's own: saved by ``torch.save`` while numpy's two functions carry their numpy 1
``__module__`` (restored at once), so every load mode, the full load included, runs on bytes the test produced.
Each printed fix is executed as pasted and must make torch load the checkpoint.
"""

from __future__ import annotations

import contextlib
import io
import re
import unittest
from typing import Any, Iterator

import torch

from test.helpers.roundtrip_fixtures import SAFE_GLOBALS_SKIP
from torch_serial_testing import AllowlistError, SerializationRoundTripTestCase, instantiate_round_trip_tests
from torch_serial_testing.checkpoint import Checkpoint
from torch_serial_testing.loading import load
from torch_serial_testing.prediction import required_globals

try:
    import numpy as np
except ImportError:  # pragma: no cover - the test extra installs numpy
    np = None  # type: ignore[assignment]

NUMPY2 = np is not None and hasattr(np, "_core")
NO_NUMPY2 = "needs numpy 2 (numpy._core), where numpy 1's names are a different spelling"
MULTIARRAY: Any = np._core.multiarray if NUMPY2 else None
OLD = "numpy.core.multiarray"


@contextlib.contextmanager
def numpy1_names() -> Iterator[None]:
    """numpy's scalar and array reconstructors pickled under numpy 1's names while it lasts."""
    saved = [(f, f.__module__) for f in (MULTIARRAY.scalar, MULTIARRAY._reconstruct)]
    try:
        for f, _ in saved:
            f.__module__ = OLD
        yield
    finally:
        for f, module in saved:
            f.__module__ = module


def state() -> dict[str, Any]:
    return {"step": np.float64(1.5), "stats": np.array([0.0, np.nan, 2.0])}


def fix_from(error: AllowlistError) -> tuple[str, str]:
    """(the class declaration's code, the torch.load code) of an AllowlistError's printed fix."""
    text = str(error)
    body = text.split("The exact declaration (declare only what you trust):\n\n", 1)[1]
    in_class, outside = body.split("\n\n(outside a test class, the same globals in a torch.load call:)\n", 1)
    return in_class, outside


def error_of(declared: tuple[Any, ...], obj: Any, names1: bool) -> AllowlistError:
    class Undeclared(SerializationRoundTripTestCase, unittest.TestCase):
        safe_globals = declared

        def runTest(self) -> None:  # noqa: N802
            pass

    probe = Undeclared()
    probe.setUp()
    try:
        with numpy1_names() if names1 else contextlib.nullcontext():  # only the save: torch loads with numpy as it is
            checkpoint = probe.save_checkpoint(obj)
        probe.load_checkpoint(checkpoint, mode="safe_globals")
    except AllowlistError as e:
        return e
    finally:
        probe.doCleanups()
    raise AssertionError("the round trip did not fail with an AllowlistError")


@unittest.skipIf(np is None, "needs numpy")
class TestNumpyValues(unittest.TestCase):
    def test_arrays_and_scalars_compare_exactly_with_their_path(self) -> None:
        from torch_serial_testing.comparison import RoundTripMismatch, assert_round_trip_equal

        assert_round_trip_equal(state(), state())  # NaN equal to NaN, as for tensors
        changed = state()
        changed["stats"][2] = 3.0
        with self.assertRaisesRegex(RoundTripMismatch, r"at \['stats'\]\.tolist\(\)\[2\]: 3\.0 != expected 2\.0$"):
            assert_round_trip_equal(state(), changed)
        for other, message in (
            (np.array([0.0, np.nan, 2.0], dtype=np.float32), "dtype float32 != expected float64"),
            (np.array([[0.0, np.nan, 2.0]]), r"shape \(1, 3\) != expected \(3,\)"),
            ([0.0, np.nan, 2.0], "type list != expected ndarray"),
        ):
            with self.subTest(other=other), self.assertRaisesRegex(RoundTripMismatch, message):
                assert_round_trip_equal(state(), {**state(), "stats": other})
        with self.assertRaisesRegex(RoundTripMismatch, "type float32 != expected float64"):
            assert_round_trip_equal(np.float64(1.5), np.float32(1.5))
        assert_round_trip_equal(np.array([0.0, np.nan]), np.array([-0.0, -np.nan]))  # other bytes, equal values
        with self.assertRaisesRegex(RoundTripMismatch, r"at \.tolist\(\)\[0\]: 1\.000000001 != expected 1\.0"):
            assert_round_trip_equal(np.array([1.0]), np.array([1.000000001]))  # exactly
        objects = np.array([{"a": 1}, None], dtype=object)
        with self.assertRaisesRegex(RoundTripMismatch, r"at \.tolist\(\)\[0\]\['a'\]: 2 != expected 1"):
            assert_round_trip_equal(objects, np.array([{"a": 2}, None], dtype=object))

    def test_module_state_holding_an_array_round_trips_in_every_mode(self) -> None:
        class Stats(torch.nn.Module):  # the state a user's module keeps beside its tensors
            def __init__(self) -> None:
                super().__init__()
                self.register_buffer("w", torch.ones(2))
                self.stats = np.arange(3.0)

            def get_extra_state(self) -> Any:
                return {"stats": self.stats}

            def set_extra_state(self, extra: Any) -> None:
                self.stats = extra["stats"]

        class TestStats(SerializationRoundTripTestCase, unittest.TestCase):
            state_dict_safe_globals = tuple(
                [MULTIARRAY._reconstruct, np.ndarray, np.dtype, type(np.dtype("float64"))] if NUMPY2 else []
            )

            def test_state(self, device: str) -> None:
                module = Stats()
                fresh, loaded = self.round_trip_state_dict(module, factory=Stats, return_state=True)
                self.assertRoundTripEqual(module.state_dict(), loaded)
                module.stats[0] = 7.0
                with self.assertRaisesRegex(
                    AssertionError, r"\['_extra_state'\]\['stats'\]\.tolist\(\)\[0\]: 0\.0 != expected 7\.0"
                ):
                    self.assertRoundTripEqual(module.state_dict(), loaded)

        if not NUMPY2:
            self.skipTest(NO_NUMPY2)
        scope: dict[str, Any] = {}
        instantiate_round_trip_tests(TestStats, scope)
        result = unittest.TestResult()
        unittest.defaultTestLoader.loadTestsFromTestCase(scope["TestStatsCPU"]).run(result)
        self.assertEqual(result.testsRun, 3)
        self.assertEqual((result.failures, result.errors), ([], []))


@unittest.skipUnless(NUMPY2, NO_NUMPY2)
class TestNumpy1Checkpoint(unittest.TestCase):
    def checkpoint(self) -> Checkpoint:
        with numpy1_names():
            return Checkpoint.save(state())

    def test_the_checkpoint_names_numpy1_paths(self) -> None:
        needed = required_globals(self.checkpoint())
        self.assertIn(f"{OLD}.scalar", needed)
        self.assertIn(f"{OLD}._reconstruct", needed)
        self.assertNotIn("numpy._core.multiarray.scalar", needed)

    def test_prediction_matches_torch_for_each_declaration_form(self) -> None:
        if SAFE_GLOBALS_SKIP:
            self.skipTest(SAFE_GLOBALS_SKIP)
        classes = [np.dtype, np.ndarray, type(np.dtype("float64"))]
        live = [MULTIARRAY.scalar, MULTIARRAY._reconstruct, *classes]
        named = [(MULTIARRAY.scalar, f"{OLD}.scalar"), (MULTIARRAY._reconstruct, f"{OLD}._reconstruct"), *classes]
        for declared, loads in ((live, False), (named, True)):
            with self.subTest(form="live objects" if loads is False else "(object, name)"):
                result = load(self.checkpoint(), "safe_globals", declared)  # raises if torch does otherwise
                self.assertIs(result.loaded, loads, result.summary)
                # torch itself, on the same bytes
                buffer = io.BytesIO()
                with numpy1_names():
                    torch.save(state(), buffer)
                buffer.seek(0)
                with torch.serialization.safe_globals(declared):
                    if loads:
                        torch.load(buffer, weights_only=True)
                    else:
                        with self.assertRaisesRegex(Exception, re.escape(f"{OLD}.")):
                            torch.load(buffer, weights_only=True)

    def test_the_printed_fix_pasted_makes_torch_load_it(self) -> None:
        if SAFE_GLOBALS_SKIP:
            self.skipTest(SAFE_GLOBALS_SKIP)
        for names1 in (True, False):
            with self.subTest(numpy1_names=names1):
                error = error_of((), state(), names1)
                in_class, outside = fix_from(error)
                if names1:  # the form torch keys by the checkpoint's own spelling
                    self.assertIn(f"(scalar, '{OLD}.scalar')", outside)
                    self.assertIn(f"(_reconstruct, '{OLD}._reconstruct')", outside)
                buffer = io.BytesIO()
                with numpy1_names() if names1 else contextlib.nullcontext():
                    torch.save(state(), buffer)
                buffer.seek(0)
                scope: dict[str, Any] = {"f": buffer}
                exec(outside, scope)  # noqa: S102 - the library's own printed line, run as a user pastes it
                from torch_serial_testing.comparison import assert_round_trip_equal

                assert_round_trip_equal(state(), scope["obj"])
                # the class declaration, pasted into a test class: the round trip now loads in its mode
                head, declaration = in_class.split("\nclass Undeclared(...):\n    safe_globals = ", 1)
                scope = {}
                exec(f"{head}\nsafe_globals = {declaration}", scope)  # noqa: S102 - as above
                declared = scope["safe_globals"]

                class Fixed(SerializationRoundTripTestCase, unittest.TestCase):
                    safe_globals = declared

                    def runTest(self) -> None:  # noqa: N802
                        pass

                probe = Fixed()
                probe.setUp()
                try:
                    with numpy1_names() if names1 else contextlib.nullcontext():
                        checkpoint = probe.save_checkpoint(state())
                    loaded = probe.load_checkpoint(checkpoint, mode="safe_globals")
                    self.assertTrue(probe.round_trip_outcomes[-1].startswith("safe_globals: loaded as expected"))
                finally:
                    probe.doCleanups()
                assert_round_trip_equal(state(), loaded)


@unittest.skipUnless(NUMPY2, NO_NUMPY2)
class TestNumpyRecipeSnippet(unittest.TestCase):
    """The tools' snippet for a numpy checkpoint: the recipe opts in to numpy's reconstructor, saying so, and the
    snippet, executed as pasted, makes torch load the checkpoint; the refusal note says the opt-in once."""

    def test_the_recipe_snippet_loads_the_checkpoint(self) -> None:
        if SAFE_GLOBALS_SKIP:
            self.skipTest(SAFE_GLOBALS_SKIP)
        from torch_serial_testing.tools.policy.snippet import numpy_recipe, refusal_notes, safe_globals_snippet

        buffer = io.BytesIO()
        torch.save(state(), buffer)
        names = required_globals(Checkpoint.from_bytes(buffer.getvalue()))
        recipe = numpy_recipe(names)
        self.assertEqual(recipe, ["numpy._core.multiarray._reconstruct"])
        snippet = safe_globals_snippet(names, opt_in=recipe)
        self.assertIn("import _reconstruct  # not a class: the pickle calls it (numpy arrays need it", snippet)
        buffer.seek(0)
        scope: dict[str, Any] = {"f": buffer}
        exec(snippet, scope)  # noqa: S102 - the library's own snippet, run as a user pastes it
        from torch_serial_testing.comparison import assert_round_trip_equal

        assert_round_trip_equal(state(), scope["obj"])
        (note,) = refusal_notes(names)
        self.assertEqual(note.count("UnsafeCallable("), 1, note)


@unittest.skipUnless(NUMPY2, NO_NUMPY2)
class TestNumpy1RoundTrip(SerializationRoundTripTestCase, unittest.TestCase):
    """The mixin on a numpy 1 checkpoint in every load mode, declared in the form that works."""

    safe_globals = (
        (MULTIARRAY.scalar, f"{OLD}.scalar") if NUMPY2 else "builtins.set",
        (MULTIARRAY._reconstruct, f"{OLD}._reconstruct") if NUMPY2 else "builtins.complex",
        *((np.dtype, np.ndarray, type(np.dtype("float64"))) if NUMPY2 else ()),
    )

    def test_numpy1_state(self, device: str) -> None:
        with numpy1_names():
            checkpoint = self.save_checkpoint(state())
        loaded = self.load_checkpoint(checkpoint)  # in this test's mode
        self.assertRoundTripEqual(state(), loaded)


if NUMPY2:
    instantiate_round_trip_tests(TestNumpy1RoundTrip, globals())
else:
    del TestNumpy1RoundTrip

if __name__ == "__main__":
    unittest.main()
