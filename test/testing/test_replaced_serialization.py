"""A test that replaces torch.load / torch.save or the functions they call through fails as a leak,
and the next test is safe: foreign bytes never reach a replacement, and the replacement is gone.

Each hostile test runs through an inner unittest runner, followed by a probe test that loads a
foreign checkpoint whose pickle calls :func:`test.helpers.hostile_tests.payload` (harmless: it
records that it ran).  Also: foreign bytes go to torch's own ``load`` even while a shim is
installed, and a ``functools.wraps`` shim is told apart from torch's own function.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import unittest
from typing import Any, Callable
from unittest import mock

import torch

from torch_serial_testing import Checkpoint, LeakedGlobalStateError, SerializationRoundTripTestCase
from torch_serial_testing.loading import load
from torch_serial_testing.unpickler import ProbeFailed
from torch_serial_testing.serialization import genuine, torch_load_replacement

from test.helpers import hostile_tests as ht
from test.helpers.roundtrip_fixtures import WEIGHTS_ONLY_BARE_ENV
from test.helpers.isolation_fixtures import run_tests
from test.helpers.subprocess_env import child_env

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FIX = r"unittest\.mock\.patch as a context manager"


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.arange(4.0))


def _probe(seen: list[Any]) -> Callable[[Any], None]:
    def test_z_next_loads_foreign_bytes(self: Any) -> None:
        result = foreign_default_load()
        seen.append((result.loaded, list(ht.RAN), torch_load_replacement()))

    return test_z_next_loads_foreign_bytes


def foreign_default_load() -> Any:
    """A bare load (``default`` mode) of the payload's foreign bytes, weights-only as since torch 2.6 (before,
    TORCH_FORCE_WEIGHTS_ONLY_LOAD makes it so: a full load of foreign bytes is refused before any loader)."""
    with mock.patch.dict(os.environ, WEIGHTS_ONLY_BARE_ENV):
        return load(Checkpoint.from_bytes(ht.payload_checkpoint()), "default")


def hostile_class(seen: list[Any], **tests: Callable[[Any], None]) -> type:
    """A mixin class with the hostile ``test_<name>`` methods and the probe, run after them."""
    body: dict[str, Any] = {f"test_{name}": fn for name, fn in tests.items()}
    body["test_z_next_loads_foreign_bytes"] = _probe(seen)
    return type("Hostile", (SerializationRoundTripTestCase, unittest.TestCase), body)


class HostileCase(unittest.TestCase):
    def setUp(self) -> None:
        ht.RAN.clear()
        self.before = ht.serialization_ids()
        self.kwdefaults = dict(torch.serialization.load.__kwdefaults__ or {})

    def tearDown(self) -> None:
        self.assertEqual(ht.serialization_ids(), self.before, "torch's serialization functions were not restored")
        self.assertEqual(dict(torch.serialization.load.__kwdefaults__ or {}), self.kwdefaults)
        self.assertEqual(ht.RAN, [], "the payload ran")

    def check_leak(self, pattern: str, fn: Callable[[Any], None]) -> str:
        """Run *fn* as a hostile test, then the probe: the first fails naming *pattern*, the second is safe."""
        seen: list[Any] = []
        cls = hostile_class(seen, hostile=fn)
        result = run_tests(cls("test_hostile"), cls("test_z_next_loads_foreign_bytes"))
        self.assertEqual(result.testsRun, 2)
        self.assertEqual(result.errors, [])
        self.assertEqual(len(result.failures), 1, result.failures)
        test, message = result.failures[0]
        self.assertTrue(test.id().endswith("test_hostile"), test.id())
        self.assertIn(LeakedGlobalStateError.__name__, message)
        self.assertIn("test_hostile leaked global state (now restored)", message)
        self.assertRegex(message, pattern)
        self.assertRegex(message, FIX)
        self.assertEqual(seen, [(False, [], None)], "the next test did not load foreign bytes safely")
        return message


class TestReplacedLoad(HostileCase):
    def test_force_full_load_shim_on_torch_load(self) -> None:
        def hostile(case: Any) -> None:
            torch.load = ht.force_full_load_shim(torch.load)

        self.check_leak(r"torch\.load is test\.helpers\.hostile_tests\.force_full_load_shim\.<locals>\.load", hostile)

    def test_functools_wraps_shim_does_not_pass_for_torch_own(self) -> None:
        def hostile(case: Any) -> None:
            torch.load = ht.wrapped_force_full_load_shim(torch.load)

        self.check_leak(r"torch\.load is torch\.serialization\.load \(functools\.wraps of torch's\)", hostile)

    def test_shim_on_torch_serialization_load_only(self) -> None:
        def hostile(case: Any) -> None:
            torch.serialization.load = ht.force_full_load_shim(torch.serialization.load)

        self.check_leak(r"torch\.serialization\.load is test\.helpers\.hostile_tests\.", hostile)

    def test_shim_on_both(self) -> None:
        def hostile(case: Any) -> None:
            shim = ht.wrapped_force_full_load_shim(torch.serialization.load)
            torch.load = torch.serialization.load = shim

        message = self.check_leak(r"torch\.load is ", hostile)
        self.assertIn("torch.serialization.load is ", message)

    def test_kwdefaults_changed_in_place(self) -> None:
        def hostile(case: Any) -> None:
            torch.load.__kwdefaults__["weights_only"] = False  # a bare torch.load becomes a full load

        self.check_leak(r"torch\.serialization\.load was changed in place \(__code__", hostile)

    def test_internal_function_replaced(self) -> None:
        def hostile(case: Any) -> None:
            torch.serialization._load = ht.force_full_load_shim(torch.serialization._load)

        self.check_leak(r"torch\.serialization\._load is ", hostile)

    def test_replaced_by_an_equal_object(self) -> None:
        # Told by identity, not equality: an equal copy put in place of torch's own is still a change.
        def hostile(case: Any) -> None:
            torch.serialization.__all__ = list(torch.serialization.__all__)

        self.check_leak(r"torch\.serialization\.__all__ is ", hostile)

    def test_weights_only_unpickler_method_replaced(self) -> None:
        def hostile(case: Any) -> None:
            torch._weights_only_unpickler.Unpickler.persistent_load = lambda self, pid: pid

        self.check_leak(r"torch\._weights_only_unpickler\.Unpickler had persistent_load changed", hostile)

    def test_foreign_bytes_never_reach_the_shim_in_the_same_test(self) -> None:
        calls: list[Any] = []
        outcomes: list[Any] = []

        def hostile(case: Any) -> None:
            real = torch.load

            def shim(*args: Any, **kwargs: Any) -> Any:
                calls.append(kwargs)
                kwargs["weights_only"] = False
                return real(*args, **kwargs)

            torch.load = shim
            result = foreign_default_load()
            outcomes.append((result.loaded, list(ht.RAN), result.summary))

        self.check_leak(r"torch\.load is ", hostile)
        self.assertEqual(calls, [])
        ((loaded, ran, summary),) = outcomes
        self.assertEqual((loaded, ran), (False, []))
        self.assertIn("loaded with torch's own torch.serialization.load, not the replaced torch.load", summary)


class TestReplacedSave(HostileCase):
    def test_save_shim_is_a_leak_and_never_writes_what_a_round_trip_trusts(self) -> None:
        loaded: list[Any] = []

        def hostile(case: Any) -> None:
            torch.save = ht.payload_writing_save(torch.save)
            # the shim would hand the round trip payload bytes it then fully unpickles
            loaded.append(type(case.round_trip(Net(), mode="weights_only_false")).__name__)

        self.check_leak(r"torch\.save is torch\.serialization\.save \(functools\.wraps of torch's\)", hostile)
        self.assertEqual(loaded, ["Net"])

    def test_serialization_save_replaced(self) -> None:
        def hostile(case: Any) -> None:
            torch.serialization.save = ht.payload_writing_save(torch.serialization.save)

        self.check_leak(r"torch\.serialization\.save is ", hostile)


class TestRestoredWithinTheTest(HostileCase):
    """Patching for a block, or undoing it in the test, is no leak."""

    def check_clean(self, fn: Callable[[Any], None]) -> None:
        seen: list[Any] = []
        cls = hostile_class(seen, hostile=fn)
        result = run_tests(cls("test_hostile"), cls("test_z_next_loads_foreign_bytes"))
        self.assertTrue(result.wasSuccessful(), result.failures + result.errors)
        self.assertEqual(seen, [(False, [], None)])

    def test_mock_patch_as_a_context(self) -> None:
        def fn(case: Any) -> None:
            with mock.patch.object(torch, "load", ht.force_full_load_shim(torch.load)):
                case.assertIsNotNone(torch_load_replacement())

        self.check_clean(fn)

    def test_undone_in_a_finally(self) -> None:
        def fn(case: Any) -> None:
            real = torch.serialization.load
            torch.serialization.load = ht.force_full_load_shim(real)
            try:
                pass
            finally:
                torch.serialization.load = real

        self.check_clean(fn)

    def test_undone_with_add_cleanup(self) -> None:
        def fn(case: Any) -> None:
            case.addCleanup(setattr, torch, "load", torch.load)  # runs before the library's check
            torch.load = ht.force_full_load_shim(torch.load)

        self.check_clean(fn)

    def test_kwdefaults_changed_in_place_never_make_foreign_bytes_load_fully(self) -> None:
        # torch's load changed in place (a bare torch.load made a full load): the library will not call
        # it, so foreign bytes are not loaded at all, and their payload never runs.
        outcomes: list[Any] = []

        def fn(case: Any) -> None:
            kwdefaults = torch.serialization.load.__kwdefaults__
            case.addCleanup(kwdefaults.__setitem__, "weights_only", kwdefaults["weights_only"])
            kwdefaults["weights_only"] = False  # a bare torch.load becomes a full load
            try:
                load(Checkpoint.from_bytes(ht.payload_checkpoint()), "default")
            except ProbeFailed as e:
                outcomes.append((str(e).split(";")[0], list(ht.RAN)))

        self.check_clean(fn)
        self.assertEqual(
            outcomes,
            [
                (
                    "torch.serialization.load was changed in place (its __code__ or __kwdefaults__: now "
                    "{'weights_only': False, 'mmap': None}, was {'weights_only': None, 'mmap': None})",
                    [],
                )
            ],
        )


class TestReplacedBeforeTheTest(unittest.TestCase):
    """A replacement already there when tests start (a backend's, torch_npu) is the process's: bytes
    the round trip saved go through it (judged by outcome); foreign bytes never do."""

    def test_owned_bytes_through_it_foreign_bytes_not(self) -> None:
        calls: list[str] = []
        real = torch.load

        def counting(f: Any, *args: Any, **kwargs: Any) -> Any:
            calls.append("called")
            return real(f, *args, **kwargs)

        class Uses(SerializationRoundTripTestCase, unittest.TestCase):
            def test_round_trip(self) -> None:
                self.round_trip(Net(), mode="weights_only_false")

            def test_foreign(self) -> None:
                result = foreign_default_load()
                self.assertFalse(result.loaded)

        with mock.patch.object(torch, "load", counting):
            result = run_tests(Uses("test_round_trip"))
            self.assertTrue(result.wasSuccessful(), result.failures + result.errors)
            self.assertEqual(calls, ["called"])
            result = run_tests(Uses("test_foreign"))
            self.assertTrue(result.wasSuccessful(), result.failures + result.errors)
            self.assertEqual(calls, ["called"])
        self.assertEqual(ht.RAN, [])

    def test_wraps_shim_is_reported_as_a_replacement(self) -> None:
        self.assertIsNone(torch_load_replacement())
        with mock.patch.object(torch, "load", ht.wrapped_force_full_load_shim(torch.load)):
            self.assertEqual(torch_load_replacement(), "torch.serialization.load (functools.wraps of torch's)")
        self.assertIs(genuine("load"), torch.serialization.load)


class TestReplacedBeforeTheLibraryRan(unittest.TestCase):
    """In a fresh interpreter: both names replaced before the library first needs torch's load."""

    def run_child(self, code: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-c", textwrap.dedent(code)],
            capture_output=True,
            text=True,
            cwd=ROOT,
            env=child_env(WEIGHTS_ONLY_BARE_ENV, path_first=(ROOT,)),  # a bare load is weights-only, as since 2.6
            timeout=300,
        )

    def test_both_replaced_is_a_loud_refusal_not_a_call(self) -> None:
        proc = self.run_child(
            """
            import torch
            from test.helpers import hostile_tests as ht
            shim = ht.wrapped_force_full_load_shim(torch.load)
            torch.load = torch.serialization.load = shim
            from torch_serial_testing import Checkpoint, load
            from torch_serial_testing.unpickler import ProbeFailed
            try:
                load(Checkpoint.from_bytes(ht.payload_checkpoint()), "default")
            except ProbeFailed as e:
                print("REFUSED", e)
            print("RAN", ht.RAN)
            """
        )
        self.assertEqual(proc.returncode, 0, proc.stderr[-3000:])
        self.assertIn("REFUSED", proc.stdout)
        self.assertIn("neither torch.serialization.load nor torch.load is torch's own function", proc.stdout)
        self.assertIn("RAN []", proc.stdout)

    def test_only_torch_load_replaced_torch_serialization_load_is_found(self) -> None:
        proc = self.run_child(
            """
            import torch
            from test.helpers import hostile_tests as ht
            torch.load = ht.wrapped_force_full_load_shim(torch.load)
            from torch_serial_testing import Checkpoint, load
            from torch_serial_testing.serialization import genuine
            result = load(Checkpoint.from_bytes(ht.payload_checkpoint()), "default")
            print("LOADED", result.loaded, "RAN", ht.RAN, "GENUINE", genuine("load") is torch.serialization.load)
            """
        )
        self.assertEqual(proc.returncode, 0, proc.stderr[-3000:])
        self.assertIn("LOADED False RAN [] GENUINE True", proc.stdout)


if __name__ == "__main__":
    unittest.main()
