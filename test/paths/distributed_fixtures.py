"""Multi-rank test classes that fail, hang, leak or skip on purpose: :mod:`test.paths.test_distributed` runs them
(in its own process, each spawning its ranks) and checks what their parent test reports.  Not collected."""

import os
import time
import unittest

import torch
import torch.distributed as dist

from torch_serial_testing import SerializationRoundTripTestCase
from torch_serial_testing.paths.distributed import MultiRankRoundTrips

PID_DIR_ENV = "TST_TEST_PID_DIR"  # where a rank writes its pid, for the no-orphan check


def note_pid(rank):
    if folder := os.environ.get(PID_DIR_ENV):
        with open(os.path.join(folder, f"rank{rank}.pid"), "w") as fh:
            fh.write(str(os.getpid()))


class Ranks(MultiRankRoundTrips, SerializationRoundTripTestCase, unittest.TestCase):
    rank_timeout = 8

    def test_rank_one_fails(self):
        self.assertEqual(self.rank, 0, "only rank 0 passes")

    def test_rank_one_hangs(self):
        note_pid(self.rank)
        if self.rank == 1:
            time.sleep(600)

    def test_rank_zero_fails_rank_one_waits(self):
        note_pid(self.rank)
        if self.rank == 0:
            raise ValueError("rank 0 broke")
        time.sleep(600)

    def test_leaks_a_safe_global(self):
        torch.serialization.add_safe_globals([time.sleep])

    def test_skips_everywhere(self):
        self.skipTest("nothing to do here")

    def test_skips_in_rank_one(self):
        if self.rank == 1:
            self.skipTest("rank 1 has no GPU")

    def test_loads_and_sockets(self):
        """A load in every rank; the rank's sockets (its gloo pairs) listen and connect on 127.0.0.1 only."""
        self.assertEqual((dist.get_rank(), dist.get_world_size()), (self.rank, 2))
        loaded = self.round_trip({"rank": torch.tensor([self.rank])}, mode="default")
        self.assertEqual(loaded["rank"].item(), self.rank)
        dist.barrier()
        self.assertTrue(os.environ.get("GLOO_SOCKET_IFNAME", "").startswith("lo"), "gloo on the loopback interface")
        addresses = tcp_addresses()
        if addresses is not None:
            self.assertTrue(addresses, "no TCP socket found for the gloo pairs")
            self.assertEqual({a for a in addresses if not a.startswith("127.")}, set())


def tcp_addresses():
    """Local IPv4 addresses of this process's TCP sockets (Linux /proc), or None elsewhere."""
    try:
        inodes = {os.readlink(f"/proc/self/fd/{fd}")[8:-1] for fd in os.listdir("/proc/self/fd")}
        rows = [line.split() for line in open("/proc/net/tcp").read().splitlines()[1:]]
        rows6 = [line.split() for line in open("/proc/net/tcp6").read().splitlines()[1:]]
    except OSError:
        return None
    found = set()
    for row in rows:
        if row[9] in inodes:
            found.add(".".join(str(b) for b in reversed(bytes.fromhex(row[1].split(":")[0]))))
    for row in rows6:
        if row[9] in inodes:
            found.add("ipv6:" + row[1].split(":")[0])
    return found
