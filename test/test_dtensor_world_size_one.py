"""A DTensor round trip on a gloo process group of one rank, in all three modes, declaring nothing.

``torch.distributed.tensor`` registers DTensor's classes (``DTensor``, ``DeviceMesh``, ``Shard``,
private layout classes...) with ``add_safe_globals`` when it is imported: torch then loads a DTensor
weights-only with nothing allowlisted by the test, and the mixin must agree (issue 37).  The import
happens inside the first test's body: what torch's own modules register is torch's doing, never a
leak of the test that triggered the import.  In a fresh interpreter that test is the first to import
it (checked), so the order that used to fail is the one run.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import unittest

import torch

from torch_serial_testing import SerializationRoundTripTestCase, instantiate_round_trip_tests

from test.helpers.roundtrip_fixtures import NO_TORCH_REGISTRATIONS
from test.helpers.subprocess_env import child_env

try:
    import torch.distributed as dist

    DIST_MISSING = None if dist.is_available() else "torch.distributed is not available in this build"
except ImportError as e:  # pragma: no cover - a torch without distributed
    DIST_MISSING = f"torch.distributed cannot be imported ({e})"


class TestDTensorWorldSizeOne(SerializationRoundTripTestCase, unittest.TestCase):
    devices = ("cpu",)  # gloo on CPU; nothing is declared: torch allowlists DTensor's classes itself

    def setUp(self) -> None:
        if DIST_MISSING or NO_TORCH_REGISTRATIONS:
            self.skipTest(DIST_MISSING or NO_TORCH_REGISTRATIONS)
        super().setUp()
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        self.addCleanup(dist.destroy_process_group)

    def test_dtensor(self, device: str) -> None:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor

        mesh = init_device_mesh(device, (1,))
        for placement in (Shard(0), Replicate()):
            with self.subTest(placement=str(placement)):
                original = distribute_tensor(torch.arange(8.0).reshape(2, 4), mesh, [placement])
                loaded = self.round_trip(original)
                self.assertIs(type(loaded), DTensor)
                self.assertEqual(loaded.placements, original.placements)
                self.assertEqual(loaded.device_mesh.mesh.tolist(), mesh.mesh.tolist())
                self.assertRoundTripEqual(original.to_local(), loaded.to_local())
                self.assertRoundTripEqual(original.full_tensor(), loaded.full_tensor())


instantiate_round_trip_tests(TestDTensorWorldSizeOne, globals())


@unittest.skipIf(DIST_MISSING, DIST_MISSING or "")
class TestFirstImportInsideATest(unittest.TestCase):
    def test_the_test_that_imports_torch_distributed_tensor_passes(self) -> None:
        if DIST_MISSING or NO_TORCH_REGISTRATIONS:
            self.skipTest(DIST_MISSING or NO_TORCH_REGISTRATIONS)
        code = textwrap.dedent(
            """
            import sys, unittest
            import torch
            assert "torch.distributed.tensor" not in sys.modules, "imported before the tests"
            from test.test_dtensor_world_size_one import TestDTensorWorldSizeOneCPU
            assert "torch.distributed.tensor" not in sys.modules, "imported by the test module"
            suite = unittest.defaultTestLoader.loadTestsFromTestCase(TestDTensorWorldSizeOneCPU)
            result = unittest.TextTestRunner(verbosity=2).run(suite)
            assert "torch.distributed.tensor" in sys.modules
            sys.exit(0 if result.wasSuccessful() and result.testsRun == 3 else 1)
            """
        )
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        proc = subprocess.run(
            [sys.executable, "-c", code], cwd=root, env=child_env(), capture_output=True, text=True, timeout=600
        )
        self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
        # each mode loaded, as torch loads it: nothing declared, nothing leaked
        for mode in ("default", "safe_globals", "weights_only_false"):
            self.assertRegex(proc.stderr, rf"test_dtensor_{mode}_cpu .*{mode}: loaded as expected .*\.\.\. ok")
        self.assertNotIn("leaked", proc.stderr)


if __name__ == "__main__":
    unittest.main()
