"""Preemptible instances as Ray nodes of their own: a preemption removes the node (and kills its
processes, as a vanished VM would). Removing a node while its worker process lives on is the case
DESIGN.md 2.7 warns of: the manager must notice from the cluster's node table and fence it."""

from __future__ import annotations

import random
import threading
import time

import psutil
import pytest

from hybrid_util import check_invariants, reference, run_step, start_fleet
from rlboost.hybrid.manager import PREEMPTIBLE


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("hybrid_nodes")
    fleet, weights = start_fleet(tmp, num_preemptible=2, instances="nodes", preempt_with="node")
    fleet.weights, fleet.tmp = weights, tmp
    yield fleet
    fleet.shutdown()


def test_removed_nodes_lose_no_sample(fleet):
    ref = reference()
    rng = random.Random(7)
    out, run = run_step(fleet, kills=[(rng.uniform(0.35, 0.9), 0)], how="node")
    check_invariants(out, run, ref, fleet.tmp / "ledgers")
    assert run.stats.preemptions == 1 and run.stats.migrated["preempted"] > 0

    fleet.replenish()  # a new node joins at a step boundary
    fleet.wait_ready()
    assert len(fleet.manager.alive(PREEMPTIBLE)) == 2 and fleet.joins == 3

    # the node goes, its worker process stays: only the node table says it is gone
    victim = fleet.manager.alive(PREEMPTIBLE)[0]
    node = psutil.Process(fleet.nodes.pop(victim.name).pid)

    def remove_node_only():  # early: found out in 1-2 s, while the step (about 2 s) still runs
        time.sleep(0.3)
        for proc in [node, *node.children(recursive=True)]:
            if proc.pid != victim.pid:
                proc.kill()

    threading.Thread(target=remove_node_only, daemon=True).start()
    out, run = run_step(fleet)
    check_invariants(out, run, ref)
    assert [name for _, name, _ in run.stats.deaths] == [victim.name], run.stats.deaths
    assert run.stats.deaths[0][0] < 0.3 + 5.0, run.stats.deaths  # found out promptly, not at the heartbeat timeout


def test_pulled_buckets_can_be_served_by_the_nodes_that_pulled_them(fleet):
    """Peer to peer: after instances on their own nodes pulled a version, Ray's object directory lists
    their nodes as holders of every bucket, so a later joiner can fetch from them, not only from the
    trainer's node."""
    import ray

    fleet.replenish()
    fleet.wait_ready()
    fleet.publish(fleet.weights, version=1)  # a new version every live instance pulls
    fleet.wait_ready()
    holders = {h.node_id for h in fleet.manager.alive(PREEMPTIBLE)}
    assert len(holders) == 2
    refs = [b.ref for b in fleet.manifest.buckets]
    locations = ray.experimental.get_object_locations(refs)
    for ref in refs:
        assert holders <= set(locations[ref]["node_ids"]), locations[ref]
