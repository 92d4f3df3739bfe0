"""Preemptible instances as Ray nodes of their own: a preemption removes the node (and kills its
processes, as a vanished VM would). Removing a node while its worker process lives on is the case
DESIGN.md 2.7 warns of: the manager must notice from the cluster's node table and fence it."""

from __future__ import annotations

import random
import threading
import time

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
    node = fleet.nodes.pop(victim.name)
    def remove_node_only():
        time.sleep(0.6)
        fleet.cluster.remove_node(node, allow_graceful=False)

    threading.Thread(target=remove_node_only, daemon=True).start()
    out, run = run_step(fleet)
    check_invariants(out, run, ref)
    assert [name for _, name, _ in run.stats.deaths] == [victim.name], run.stats.deaths
    assert run.stats.deaths[0][0] < 0.6 + 5.0, run.stats.deaths  # found out promptly, not at the heartbeat timeout
