"""A test that mutates torch's built-in allowlist or another torch-owned table its loads read fails
as a leak; the table is restored, so the next test's weights-only load of foreign bytes refuses them.

torch caches ``_get_allowed_globals()`` (``functools.lru_cache``): the dict it returns is the one
every weights-only load reads, so a mutation outlives the test unless it is undone.
"""

from __future__ import annotations

import unittest
from typing import Any

import torch

from test.helpers import hostile_tests as ht
from test.helpers.isolation_fixtures import run_tests
from test.testing.test_replaced_serialization import HostileCase, hostile_class

WOU = torch._weights_only_unpickler


class AllowlistCase(HostileCase):
    def setUp(self) -> None:
        super().setUp()
        self.allowlist = ht.allowlist_copy()
        self.packages = list(torch.serialization._package_registry)

    def tearDown(self) -> None:
        super().tearDown()
        self.assertEqual(ht.allowlist_copy(), self.allowlist, "torch's allowlist was not restored")
        self.assertEqual(torch.serialization._package_registry, self.packages)


class TestMutatedAllowlist(AllowlistCase):
    def test_payload_added(self) -> None:
        def hostile(case: Any) -> None:
            WOU._get_allowed_globals()[ht.PAYLOAD_NAME] = ht.payload

        self.check_leak(
            r"torch's built-in allowlist \(torch\._weights_only_unpickler\._get_allowed_globals\(\)\) changed: "
            r"added \['test\.helpers\.hostile_tests\.payload'\], removed \[\], replaced \[\]",
            hostile,
        )

    def test_entry_removed(self) -> None:
        def hostile(case: Any) -> None:
            del WOU._get_allowed_globals()["torch.Size"]

        self.check_leak(r"added \[\], removed \['torch\.Size'\]", hostile)

    def test_entry_replaced_by_a_payload(self) -> None:
        def hostile(case: Any) -> None:
            WOU._get_allowed_globals()["collections.OrderedDict"] = ht.payload

        self.check_leak(r"replaced \['collections\.OrderedDict'\]", hostile)

    def test_dict_updated_with_many(self) -> None:
        def hostile(case: Any) -> None:
            WOU._get_allowed_globals().update({"builtins.eval": eval, "builtins.exec": exec})

        self.check_leak(r"added \['builtins\.eval', 'builtins\.exec'\]", hostile)

    def test_rebuild_function_rebound_and_the_cache_refilled(self) -> None:
        def hostile(case: Any) -> None:
            torch._utils._rebuild_tensor_v2 = ht.payload
            WOU._get_allowed_globals.cache_clear()
            WOU._get_allowed_globals()  # now holds the payload under torch's own name

        message = self.check_leak(
            r"torch\._utils\._rebuild_tensor_v2 is test\.helpers\.hostile_tests\.payload", hostile
        )
        # torch keys a rebuild function by its __name__: the payload appears under its own
        self.assertRegex(
            message,
            r"added \['torch\._utils\.payload'\], removed \['torch\._utils\._rebuild_tensor_v2'\], replaced \[\]",
        )

    def test_cache_refilled_unchanged_is_clean(self) -> None:
        seen: list[Any] = []
        cls = hostile_class(seen, hostile=lambda case: WOU._get_allowed_globals.cache_clear())
        result = run_tests(cls("test_hostile"), cls("test_z_next_loads_foreign_bytes"))
        self.assertTrue(result.wasSuccessful(), result.failures + result.errors)
        self.assertEqual(seen, [(False, [], None)])

    def test_rebuild_function_replaced_in_the_cached_table_only(self) -> None:
        def hostile(case: Any) -> None:
            WOU._get_allowed_globals()["torch._utils._rebuild_tensor_v2"] = ht.payload

        self.check_leak(r"replaced \['torch\._utils\._rebuild_tensor_v2'\]", hostile)

    def test_getter_replaced(self) -> None:
        def hostile(case: Any) -> None:
            real = WOU._get_allowed_globals
            WOU._get_allowed_globals = lambda: {**real(), ht.PAYLOAD_NAME: ht.payload}

        self.check_leak(r"torch\._weights_only_unpickler\._get_allowed_globals is ", hostile)

    def test_mutation_undone_in_the_test_is_clean(self) -> None:
        seen: list[Any] = []

        def fn(case: Any) -> None:
            table = WOU._get_allowed_globals()
            table[ht.PAYLOAD_NAME] = ht.payload
            del table[ht.PAYLOAD_NAME]

        cls = hostile_class(seen, hostile=fn)
        result = run_tests(cls("test_hostile"), cls("test_z_next_loads_foreign_bytes"))
        self.assertTrue(result.wasSuccessful(), result.failures + result.errors)
        self.assertEqual(seen, [(False, [], None)])


def _tag(obj: Any) -> None:
    return None


def _deserialize(obj: Any, location: str) -> Any:
    ht.payload(f"deserializer saw {location}")
    return None


class TestStorageLocationRegistry(AllowlistCase):
    """``register_package``'s deserializers run for every storage, weights-only loads included."""

    def test_registered_deserializer_is_a_leak(self) -> None:
        def hostile(case: Any) -> None:
            torch.serialization.register_package(0, _tag, _deserialize)

        self.check_leak(r"storage-location registry \(register_package\) changed: added deserializers \[", hostile)

    def test_registry_emptied(self) -> None:
        def hostile(case: Any) -> None:
            torch.serialization._package_registry.clear()

        self.check_leak(r"storage-location registry \(register_package\) changed", hostile)


if __name__ == "__main__":
    unittest.main()
