"""Inside a room (run by tests/test_hosts.py): preemptible instances on hosts of their own behind real
links, preempted the way spot VMs go: the whole host vanishes and its link goes silent (no reset, no
closed stream). The manager must find out by heartbeat, within heartbeat_timeout_s plus a margin, and
lose or duplicate nothing; a host partitioned away and back is fenced; one that vanishes mid-pull is
dropped without holding the version back; a link that degrades does not hold the step."""

from __future__ import annotations

import random
import time

import pytest

from hybrid_util import (after_tokens, check_invariants, kill, load_factor, patience, preemptible, reference, refill,
                         run_step, start_fleet, version_weights)
from rlboost.cluster.hosts import HostEntry
from rlboost.cluster.resources import PREEMPTIBLE
from rlboost.hybrid.handles import WorkerState

HEARTBEAT_S = 1.5
"""The heartbeat timeout on an idle machine; the fleet's is `patience(HEARTBEAT_S)`, set when it starts, so
the live hosts' beats on a loaded machine are not taken for a vanished host's silence."""
HOSTS = [HostEntry(kind="reserved", name="res-0", cpus=2), HostEntry(kind="preemptible", count=4, link="100mbit")]


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("hosts")
    fleet, weights = start_fleet(tmp, num_preemptible=2, instances="hosts", hosts=HOSTS,
                                 heartbeat_timeout_s=patience(HEARTBEAT_S))
    fleet.weights, fleet.tmp = weights, tmp
    yield fleet
    fleet.shutdown()


@pytest.fixture(scope="module")
def ref():
    return reference()


def host_of(fleet, name: str):
    return fleet.instances[name].host


def test_a_vanished_host_is_found_by_heartbeat_and_loses_nothing(fleet, ref):
    vanished_at = {}

    def vanish(run):
        name = preemptible(0)(run)
        vanished_at[name] = time.monotonic() - run.state.t0
        kill(fleet, preemptible(0))(run)

    faults = [(after_tokens(preemptible(0), random.Random(3).randrange(8, 120)), vanish)]
    out, run = run_step(fleet, faults=faults)
    check_invariants(out, run, ref, fleet.tmp / "ledgers")
    [(declared, name, reason)] = run.stats.deaths
    assert name in vanished_at and run.stats.migrated["preempted"] > 0
    # nothing reset its streams and Ray still lists its node: only the silence tells
    assert reason.startswith("no sign of life"), reason
    assert declared - vanished_at[name] <= fleet.cfg.heartbeat_timeout_s + 2 * load_factor(), run.stats.deaths
    refill(fleet)


def test_a_partitioned_host_whose_link_returns_is_fenced(fleet, ref):
    cut = {}

    def partition(run):
        cut["name"] = name = preemptible(0)(run)
        fleet.cluster.room.cut(host_of(fleet, name))

    def heal(run):  # declared dead by now: what it sends from here on must be dropped
        fleet.cluster.room.restore(host_of(fleet, cut["name"]))

    faults = [(after_tokens(preemptible(0), 8), partition), (lambda run: run.stats.deaths, heal)]
    out, run = run_step(fleet, faults=faults)
    check_invariants(out, run, ref)
    [(_, name, reason)] = run.stats.deaths
    assert name == cut["name"] and reason.startswith("no sign of life")
    fleet.reap()  # the fenced instance is ended, its host with it: it joins no step again
    assert name not in fleet.instances and name not in {h.name for h in fleet.handles()}
    refill(fleet)
    assert len(fleet.alive(PREEMPTIBLE)) == 2


def test_a_host_vanishing_mid_pull_is_dropped(fleet):
    victim = sorted(fleet.alive(PREEMPTIBLE), key=lambda h: h.name)[0]
    fleet.cluster.room.set_link(host_of(fleet, victim.name), 2e6)  # the pull takes seconds, not milliseconds
    # tensors of its own: the base again would be an empty patch, pulled before the test could see it start
    fleet.publish(version_weights(1), version=1)
    deadline = time.monotonic() + patience(60)
    while victim.state != WorkerState.PULLING:
        assert time.monotonic() < deadline, victim.state
        time.sleep(0.005)
    fleet.preempt(victim)
    # the version is not held back by the vanished puller: its silence drops it, as a step would, long before
    # Ray finds its node gone (about a minute) or the pull's own limit ends
    fleet.wait_ready(timeout_s=fleet.cfg.heartbeat_timeout_s + patience(10))
    alive = fleet.alive(PREEMPTIBLE)
    assert victim.name not in {h.name for h in alive} and all(h.version == 1 for h in alive)
    refill(fleet)
    out, run = run_step(fleet, version=1)
    check_invariants(out, run, version=1, state=version_weights(1))


def test_a_degraded_link_does_not_hold_the_step(fleet):

    def degrade(run):
        fleet.cluster.room.set_link(host_of(fleet, preemptible(0)(run)), 1e6)

    out, run = run_step(fleet, faults=[(after_tokens(preemptible(0), 8), degrade)], version=1)
    check_invariants(out, run, version=1, state=version_weights(1))
    assert not run.stats.deaths  # slow, not dead
