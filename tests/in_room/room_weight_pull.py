"""Inside a room (run by tests/test_hosts.py): a spot host pulling a version over a link too slow to
carry it within Ray's pull timeout (10 s) receives each byte once. Fetched all at once, every bucket
was still arriving when Ray asked for it again, and the sender then sent each one a second time, most
of it after the pull had returned (the next refresh behind a 100 Mbit/s link took twice as long)."""

from __future__ import annotations

import time

import numpy as np
import pytest
import ray
import torch

from hybrid_util import patience
from rlboost.cluster import weights as ws
from rlboost.cluster.config import ClusterConfig
from rlboost.cluster.hosts import HostEntry, in_room
from rlboost.cluster.ray_cluster import Cluster

LINK = "20mbit"
BUCKET_MB = 12
BUCKETS = 4
"""48 MiB: 20 s over the link; one bucket alone takes 5 s, half of Ray's pull timeout."""


@pytest.fixture
def cluster():
    assert in_room(), "these tests run inside a room: tests/test_hosts.py starts them"
    hosts = [HostEntry(kind="reserved", name="res-0", cpus=1), HostEntry(kind="preemptible", count=1, link=LINK)]
    cluster = Cluster(ClusterConfig(hosts=hosts), "hosts")
    yield cluster
    cluster.shutdown()


def sent_to(host) -> int:
    """Bytes the room has sent into `host`'s link (its bridge port's transmit counter)."""
    with open("/proc/self/net/dev") as f:
        for line in f:
            name, _, counters = line.partition(":")
            if name.strip() == host.port:
                return int(counters.split()[8])
    raise LookupError(f"no port {host.port}")


@ray.remote(num_cpus=0, resources={"probe": 1})
def pull_there(manifest, timeout_s: float) -> int:
    return sum(a.nbytes for a in ws.pull(manifest, manifest.fingerprint, timeout_s).arrays)


def test_a_slow_link_carries_each_byte_of_a_pull_once(cluster):
    node = cluster.start_node({"probe": 1})
    rng = np.random.default_rng(0)
    state = {f"t{i}": torch.from_numpy(rng.integers(0, 256, BUCKET_MB * 2**20, dtype=np.uint8)) for i in range(BUCKETS)}
    manifest = ws.publish(state, 1, bucket_mb=BUCKET_MB)
    assert len(manifest.buckets) == BUCKETS
    ray.get(pull_there.remote(ws.publish({"x": torch.zeros(8, dtype=torch.uint8)}, 0), patience(60)))  # the worker is up
    before = sent_to(node.host)
    assert ray.get(pull_there.remote(manifest, patience(120))) == manifest.nbytes
    # what a late resend would still carry: wait until the link is quiet for 3 s
    deadline, quiet, last = time.monotonic() + patience(60), 0, sent_to(node.host)
    while quiet < 3 and time.monotonic() < deadline:
        time.sleep(1.0)
        now = sent_to(node.host)
        quiet, last = (quiet + 1 if now - last < 50_000 else 0), now
    carried = last - before
    assert carried < manifest.nbytes * 1.1, f"{carried / 2**20:.1f} MiB crossed the link for a {manifest.nbytes / 2**20:.0f} MiB pull"
    node.end()
