# Owner(s): ["oncall: distributed"]
"""Multi-rank round trips on gloo (:mod:`torch_serial_testing.paths.distributed`), each body run in every rank.

* pytorch's ``test_dtensor_save_load`` (test/distributed/tensor/test_dtensor.py, a ``DTensorTestBase`` test under
  ``@with_comms``) at world size 2, in every load mode, declaring nothing: ``import torch.distributed.tensor``
  allowlists DTensor's classes.
* Every placement (``Shard``, ``Replicate``, ``Partial``, ``_StridedShard``) on a 1-D mesh, and on a 2-D mesh of
  four ranks, through ``torch.save``/``torch.load`` per rank in every mode.
* DCP's ``save``/``load`` with the file-system writer and reader, resharded: saved by two ranks, loaded by four
  and by one (without a process group), and its ``.metadata``, a plain pickle, scanned.
* An FSDP2-sharded model's and its optimizer's state dicts (``get_model_state_dict``/``get_optimizer_state_dict``)
  round-tripped in every mode and loaded back into a fresh sharded model.

Every load is predicted and asserted in its rank by the core; the comparisons are exact.  A test needing what this
torch lacks (a public DTensor, ``_StridedShard``, FSDP2's ``fully_shard``), asked of torch by importing it, is
skipped before any rank starts, the reason naming what is missing."""

import importlib
import pathlib
import unittest

import torch
import torch.distributed as dist
from torch.testing._internal.common_utils import TestCase, run_tests

from torch_serial_testing import SerializationRoundTripTestCase, instantiate_round_trip_tests, round_trip_dims
from torch_serial_testing.paths.distributed import MultiRankRoundTrips, at_world_sizes, scan_dcp_metadata, unavailable


def lacks(module, name, what):
    """Why a test needing ``module.name`` (*what*) cannot run on this torch, or None: asked by importing it."""
    try:
        getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError):
        return f"torch {torch.__version__} has no {what}: {module}.{name} cannot be imported"
    return None


#: Why each kind of test cannot run here, or None (the DTensor one is also the others' first need).
NO_DTENSOR = unavailable() or lacks("torch.distributed.tensor", "DTensor", "public DTensor")
NO_STRIDED_SHARD = NO_DTENSOR or lacks(
    "torch.distributed.tensor.placement_types", "_StridedShard", "_StridedShard placement"
)
NO_FSDP2 = NO_DTENSOR or lacks("torch.distributed.fsdp", "fully_shard", "FSDP2 fully_shard")


@unittest.skipIf(NO_DTENSOR, NO_DTENSOR or "")
class TestDTensorSaveLoad(MultiRankRoundTrips, SerializationRoundTripTestCase, TestCase):
    devices = ("cpu",)

    def test_dtensor_save_load(self, device):
        from torch.distributed.tensor import DTensor, Shard

        torch.manual_seed(self.rank)  # each rank its own shard
        sharded = DTensor.from_local(torch.randn(3, 3), self.device_mesh(), [Shard(0)])
        loaded = self.round_trip(sharded)
        self.assertDTensorEqual(sharded, loaded)
        self.assertEqual(loaded.shape, (3 * self.world_size, 3))


instantiate_round_trip_tests(TestDTensorSaveLoad, globals())


def placements_1d():
    from torch.distributed.tensor import Partial, Replicate, Shard
    from torch.distributed.tensor.placement_types import _StridedShard

    return [[Shard(0)], [Shard(1)], [Replicate()], [Partial()], [_StridedShard(0, split_factor=2)]]


@unittest.skipIf(NO_STRIDED_SHARD, NO_STRIDED_SHARD or "")
class TestDTensorPlacements(MultiRankRoundTrips, SerializationRoundTripTestCase, TestCase):
    devices = ("cpu",)

    def check_each_mode(self, mesh, placements):
        from torch.distributed.tensor import DTensor

        local = torch.arange(8.0).reshape(4, 2) + 100 * self.rank  # different on every rank
        original = DTensor.from_local(local, mesh, placements, run_check=False)
        with self.subTest(placements=str(placements)):
            self.round_trip_each_mode(original, lambda loaded, mode: self.assertDTensorEqual(original, loaded))

    @round_trip_dims(load_modes=())
    def test_every_placement_1d(self, device):
        for placements in placements_1d():
            self.check_each_mode(self.device_mesh(), placements)

    @at_world_sizes(4)
    @round_trip_dims(load_modes=())
    def test_placements_2d(self, device):
        from torch.distributed.tensor import Partial, Replicate, Shard
        from torch.distributed.tensor.placement_types import _StridedShard

        mesh = self.device_mesh((2, 2), ("dp", "tp"))
        for placements in (
            [Shard(0), Replicate()],
            [Replicate(), Shard(1)],
            [Shard(0), Partial()],
            [_StridedShard(0, split_factor=2), Shard(0)],  # FSDP over TP, as fully_shard makes it
        ):
            self.check_each_mode(mesh, placements)


instantiate_round_trip_tests(TestDTensorPlacements, globals())


@unittest.skipIf(NO_DTENSOR, NO_DTENSOR or "")
class TestDCPReshard(MultiRankRoundTrips, SerializationRoundTripTestCase, TestCase):
    """Saved by two ranks, loaded by four and by one: DCP reshards; torch.save is not involved."""

    @at_world_sizes(4)
    def test_saved_by_two_loaded_by_four_and_one(self):
        import torch.distributed.checkpoint as dcp
        from torch.distributed.device_mesh import DeviceMesh
        from torch.distributed.tensor import DTensor, Shard, distribute_tensor

        full = torch.arange(64.0).reshape(8, 8)
        path = self.shared_dir
        pair = dist.new_group([0, 1])  # every rank creates every group
        mesh_of_two = DeviceMesh("cpu", [0, 1])
        if self.rank < 2:
            saved = distribute_tensor(full, mesh_of_two, [Shard(0)])
            dcp.save({"w": saved}, storage_writer=dcp.FileSystemWriter(path), process_group=pair)
        dist.barrier()

        target = distribute_tensor(torch.zeros(8, 8), self.device_mesh(), [Shard(1)])  # another dim, 4 ranks
        dcp.load({"w": target}, storage_reader=dcp.FileSystemReader(path))
        self.assertIs(type(target), DTensor)
        self.assertRoundTripEqual(target.full_tensor(), full)
        self.assertRoundTripEqual(target.to_local(), full.chunk(4, dim=1)[self.rank])

        if self.rank == 0:  # world size 1: no process group at all
            alone = {"w": torch.zeros(8, 8)}
            dcp.load(alone, storage_reader=dcp.FileSystemReader(path), no_dist=True)
            self.assertRoundTripEqual(alone["w"], full)
            wo_names, full_names = scan_dcp_metadata(path)
            self.assertIn("torch.distributed.checkpoint.metadata.Metadata", full_names)
            # torch's own classes, and the path DCP was given (StorageMeta.checkpoint_id): a pathlib class
            own_path = f"pathlib.{type(pathlib.Path(path)).__name__}"
            self.assertEqual([n for n in full_names if not n.startswith("torch.")], [own_path])
            self.assertEqual(set(wo_names) - set(full_names), set())
        dist.barrier()


def sharded_model(mesh):
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)  # the same model on every rank, sharded
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    for layer in (model[0], model[2], model):
        fully_shard(layer, mesh=mesh)
    return model


@unittest.skipIf(NO_FSDP2, NO_FSDP2 or "")
class TestShardedStateDict(MultiRankRoundTrips, SerializationRoundTripTestCase, TestCase):
    devices = ("cpu",)

    @round_trip_dims(load_modes=())
    def test_model_and_optimizer_state_dict(self, device):
        from torch.distributed.checkpoint.state_dict import (
            get_model_state_dict,
            get_optimizer_state_dict,
            set_model_state_dict,
            set_optimizer_state_dict,
        )
        from torch.distributed.tensor import DTensor

        mesh = self.device_mesh()
        model = sharded_model(mesh)
        optim = torch.optim.Adam(model.parameters(), lr=0.1)
        model(torch.randn(3, 4) + self.rank).sum().backward()
        optim.step()
        state = {"model": get_model_state_dict(model), "optim": get_optimizer_state_dict(model, optim)}
        self.assertIsInstance(state["model"]["0.weight"], DTensor)

        def check(loaded, mode):
            for key, value in state["model"].items():
                self.assertDTensorEqual(value, loaded["model"][key])
            for key, per_param in state["optim"]["state"].items():
                for name, value in per_param.items():
                    if isinstance(value, DTensor):
                        self.assertDTensorEqual(value, loaded["optim"]["state"][key][name])
                    else:
                        self.assertRoundTripEqual(value, loaded["optim"]["state"][key][name])
            self.assertEqual(loaded["optim"]["param_groups"], state["optim"]["param_groups"])
            fresh = sharded_model(mesh)
            fresh_optim = torch.optim.Adam(fresh.parameters(), lr=0.1)
            set_model_state_dict(fresh, loaded["model"])
            set_optimizer_state_dict(fresh, fresh_optim, loaded["optim"])
            for (name, mine), theirs in zip(model.named_parameters(), fresh.parameters()):
                self.assertDTensorEqual(mine, theirs)

        self.round_trip_each_mode(state, check)


instantiate_round_trip_tests(TestShardedStateDict, globals())


if __name__ == "__main__":
    run_tests()
