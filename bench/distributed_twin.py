"""What the world-size dimension (:mod:`torch_serial_testing.paths.distributed`) costs, against plain-torch twins.

Two test files of the same multi-rank tests at world size 2 on gloo, written to a temporary folder and run
each as ``python -m unittest`` in a new process, interleaved round by round:

* **library**: ``MultiRankRoundTrips`` + ``SerializationRoundTripTestCase``: ``test_dtensor_save_load`` in its
  three load modes (a test each) and an FSDP2 model's and optimizer's state dicts in the three modes (one
  test), every load predicted and asserted per rank, compared with ``assertDTensorEqual``;
* **twin**: pytorch's own ``DTensorTestBase`` with ``@with_comms`` (``MultiProcessTestCase`` spawning the
  ranks), the same four tests making the same saves and loads by hand (``torch.load`` with
  ``weights_only=False``, ``True``, and the default) and the same comparisons.

Wall clock (``time.perf_counter``) and CPU time (user + system of the run and of every process it started:
``RUSAGE_CHILDREN``) of each whole run; medians over the rounds, and the median of each round's own ratio.  Run from the
repository root:

    PYTHONPATH=$PWD python bench/distributed_twin.py [rounds]
"""

from __future__ import annotations

import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

import torch

LIBRARY = """
import unittest

import torch
from torch.testing._internal.common_utils import TestCase

from torch_serial_testing import SerializationRoundTripTestCase, instantiate_round_trip_tests, round_trip_dims
from torch_serial_testing.paths.distributed import MultiRankRoundTrips
from common import check_state, sharded_model, step_state


class TestRanks(MultiRankRoundTrips, SerializationRoundTripTestCase, TestCase):
    devices = ("cpu",)

    def test_dtensor_save_load(self, device):
        from torch.distributed.tensor import DTensor, Shard

        torch.manual_seed(self.rank)
        sharded = DTensor.from_local(torch.randn(3, 3), self.device_mesh(), [Shard(0)])
        self.assertDTensorEqual(sharded, self.round_trip(sharded))

    @round_trip_dims(load_modes=())
    def test_state_dict(self, device):
        model, state = step_state(self.device_mesh(), self.rank)
        self.round_trip_each_mode(state, lambda loaded, mode: check_state(self, state, loaded))


instantiate_round_trip_tests(TestRanks, globals())
"""

TWIN = """
import io

import torch
from torch.testing._internal.distributed._tensor.common_dtensor import DTensorTestBase, with_comms

from common import check_state, step_state

LOADS = {"weights_only_false": dict(weights_only=False), "safe_globals": dict(weights_only=True), "default": {}}


def same_dtensor(test, expected, actual):
    from torch.distributed.tensor import DTensor

    test.assertIs(type(actual), DTensor)
    test.assertEqual(actual.device_mesh.mesh.tolist(), expected.device_mesh.mesh.tolist())
    test.assertEqual(tuple(actual.placements), tuple(expected.placements))
    test.assertEqual(actual.to_local(), expected.to_local(), atol=0, rtol=0)
    test.assertEqual(actual.full_tensor(), expected.full_tensor(), atol=0, rtol=0)


def round_trip(obj, mode):
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    buffer.seek(0)
    return torch.load(buffer, **LOADS[mode])


class TestRanks(DTensorTestBase):
    @property
    def world_size(self):
        return 2

    def dtensor_save_load(self, mode):
        from torch.distributed.tensor import DTensor, Shard

        torch.manual_seed(self.rank)
        sharded = DTensor.from_local(torch.randn(3, 3), self.build_device_mesh(), [Shard(0)])
        same_dtensor(self, sharded, round_trip(sharded, mode))

    @with_comms
    def test_dtensor_save_load_default(self):
        self.dtensor_save_load("default")

    @with_comms
    def test_dtensor_save_load_safe_globals(self):
        self.dtensor_save_load("safe_globals")

    @with_comms
    def test_dtensor_save_load_weights_only_false(self):
        self.dtensor_save_load("weights_only_false")

    @with_comms
    def test_state_dict(self):
        model, state = step_state(self.build_device_mesh(), self.rank)
        for mode in LOADS:
            with self.subTest(load_mode=mode):
                check_state(self, state, round_trip(state, mode), same_dtensor)
"""

COMMON = """
import torch


def sharded_model(mesh):
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    for layer in (model[0], model[2], model):
        fully_shard(layer, mesh=mesh)
    return model


def step_state(mesh, rank):
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

    model = sharded_model(mesh)
    optim = torch.optim.Adam(model.parameters(), lr=0.1)
    model(torch.randn(3, 4) + rank).sum().backward()
    optim.step()
    return model, {"model": get_model_state_dict(model), "optim": get_optimizer_state_dict(model, optim)}


def check_state(test, state, loaded, same=None):
    same = same or (lambda t, e, a: t.assertDTensorEqual(e, a))
    for key, value in state["model"].items():
        same(test, value, loaded["model"][key])
    for key, per_param in state["optim"]["state"].items():
        for name, value in per_param.items():
            if type(value).__name__ == "DTensor":
                same(test, value, loaded["optim"]["state"][key][name])
            else:
                test.assertEqual(value, loaded["optim"]["state"][key][name], atol=0, rtol=0)
    test.assertEqual(loaded["optim"]["param_groups"], state["optim"]["param_groups"])
"""


def run(folder: str, module: str) -> tuple[float, float]:
    """Wall time and CPU time (user + system of the run and every process it started and reaped) of one run."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([folder, os.environ.get("PYTHONPATH", "")])}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "unittest", module], cwd=folder, env=env, capture_output=True, text=True
    )
    elapsed = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0 or "Ran 4 tests" not in proc.stderr:
        raise SystemExit(f"{module} did not run its 4 tests green:\n{proc.stderr[-3000:]}")
    return elapsed, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    print(f"torch {torch.__version__}, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}, {rounds} rounds")
    times: dict[str, list[tuple[float, float]]] = {"library": [], "twin": []}
    with tempfile.TemporaryDirectory() as folder:
        for name, text in (("common", COMMON), ("library_file", LIBRARY), ("twin_file", TWIN)):
            with open(os.path.join(folder, f"{name}.py"), "w", encoding="utf-8") as fh:
                fh.write(text)
        for n in range(rounds):
            order = (("twin", "twin_file"), ("library", "library_file"))
            for label, module in order if n % 2 else order[::-1]:
                times[label].append(run(folder, module))
                wall, cpu = times[label][-1]
                print(f"  round {n + 1} {label}: {wall:.2f} s wall, {cpu:.2f} s CPU", flush=True)
    print(f"{'':38}{'wall':>9}{'CPU':>9}")
    for label, title in (("twin", "plain-torch twin (DTensorTestBase)"), ("library", "library (MultiRankRoundTrips)")):
        walls, cpus = zip(*times[label])
        print(f"{title:38}{statistics.median(walls):8.2f}s{statistics.median(cpus):8.2f}s")
    for i, what in ((0, "wall"), (1, "CPU")):
        ratios = [lib[i] / twin[i] for lib, twin in zip(times["library"], times["twin"])]
        print(f"library / twin, {what}: median of the round ratios {statistics.median(ratios):.2f}x "
              f"(rounds: {', '.join(f'{r:.2f}' for r in ratios)})")  # fmt: skip


if __name__ == "__main__":
    main()
