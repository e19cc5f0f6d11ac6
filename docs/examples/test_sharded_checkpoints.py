"""Round trips across ranks: DTensor per rank in every load mode, a 2-D mesh, DCP.

    python test_sharded_checkpoints.py -v
"""

import unittest

import torch

from torch_serial_testing import SerializationRoundTripTestCase, instantiate_round_trip_tests
from torch_serial_testing import round_trip_dims
from torch_serial_testing.paths.distributed import MultiRankRoundTrips, at_world_sizes

try:  # public from torch 2.5 (torch.distributed._tensor before): without it, every test here skips, saying so
    from torch.distributed.tensor import DTensor  # noqa: F401

    NO_DTENSOR = None
except ImportError:
    NO_DTENSOR = f"torch {torch.__version__} has no public DTensor (torch.distributed.tensor.DTensor)"


@unittest.skipIf(NO_DTENSOR, NO_DTENSOR or "")
class TestShardedCheckpoints(MultiRankRoundTrips, SerializationRoundTripTestCase, unittest.TestCase):
    devices = ("cpu",)  # gloo
    world_sizes = (2,)  # every test runs in 2 ranks unless @at_world_sizes says otherwise

    def test_dtensor(self, device):
        from torch.distributed.tensor import DTensor, Shard

        local = torch.arange(6.0).reshape(2, 3) + 10 * self.rank  # each rank its own shard
        sharded = DTensor.from_local(local, self.device_mesh(), [Shard(0)])
        loaded = self.round_trip(sharded)  # torch.save/torch.load in this rank, in this test's mode
        self.assertDTensorEqual(sharded, loaded)

    @at_world_sizes(4)
    @round_trip_dims(load_modes=())
    def test_two_dimensional_mesh(self, device):
        from torch.distributed.tensor import Replicate, Shard, distribute_tensor

        mesh = self.device_mesh((2, 2), ("dp", "tp"))
        original = distribute_tensor(torch.arange(16.0).reshape(4, 4), mesh, [Shard(0), Replicate()])
        self.round_trip_each_mode(original, lambda loaded, mode: self.assertDTensorEqual(original, loaded))

    @round_trip_dims(load_modes=())
    def test_dcp(self, device):
        import torch.distributed.checkpoint as dcp
        from torch.distributed.tensor import Shard, distribute_tensor

        full = torch.arange(16.0).reshape(4, 4)
        state = {"w": distribute_tensor(full, self.device_mesh(), [Shard(0)])}
        dcp.save(state, storage_writer=dcp.FileSystemWriter(self.shared_dir))
        target = {"w": distribute_tensor(torch.zeros(4, 4), self.device_mesh(), [Shard(1)])}
        dcp.load(target, storage_reader=dcp.FileSystemReader(self.shared_dir))
        self.assertRoundTripEqual(target["w"].full_tensor(), full)


instantiate_round_trip_tests(TestShardedCheckpoints, globals())

if __name__ == "__main__":
    unittest.main()
