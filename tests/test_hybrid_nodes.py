"""Preemptible instances as Ray nodes of their own: a preemption removes the node (and kills its
processes, as a vanished VM would). Removing a node while its worker process lives on is the case
DESIGN.md 2.7 warns of: the manager must notice from the cluster's node table and fence it."""

from __future__ import annotations

import contextlib
import random

import psutil
import pytest

from hybrid_util import (advance, after_tokens, check_invariants, gated_pulls, heartbeat_timeout, kill, make_whole,
                         patience, preemptible, run_step, start_fleet, wait_for)
from rlboost.hybrid.handles import PREEMPTIBLE

pytestmark = pytest.mark.e2e  # instances as Ray nodes of their own: `make test-e2e`


@pytest.fixture(scope="module")
def shared_fleet(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("hybrid_nodes")
    fleet, weights = start_fleet(tmp, num_preemptible=2, instances="nodes")
    fleet.weights, fleet.tmp = weights, tmp
    yield fleet
    fleet.shutdown()


@pytest.fixture
def fleet(shared_fleet):
    yield shared_fleet
    make_whole(shared_fleet)


def one_matrix_moved(state: dict) -> dict:
    """`state` with its smallest matrix moved by 0.25: a version other versions reach by a small patch."""
    name = max(state, key=lambda n: (state[n].dim() == 2, -state[n].numel()))
    return state | {name: state[name] + 0.25}


def test_removed_nodes_lose_no_sample(fleet):
    advance(fleet)  # tensors of its own: the migrated samples are checked against them
    rng = random.Random(7)
    faults = [(after_tokens(preemptible(0), rng.randrange(8, 200)), kill(fleet, preemptible(0), how="instance"))]
    out, run = run_step(fleet, faults=faults)
    check_invariants(out, run, ledger_dir=fleet.tmp / "ledgers", state=fleet.served())
    assert run.stats.preemptions == 1 and run.stats.migrated["preempted"] > 0

    fleet.replenish()  # a new node joins at a step boundary
    fleet.wait_ready(timeout_s=patience(120))
    assert len(fleet.alive(PREEMPTIBLE)) == 2 and fleet.joins == 3

    # the node stops answering and the cluster removes it (its health checks fail), its worker process
    # lives on: only the cluster (the node table, or the actor's death it reports) says it is gone. The
    # whole node is held still (SIGSTOP), none of it killed: killing its raylet would orphan the held
    # worker's process group, and the kernel answers that with SIGHUP then SIGCONT (POSIX job control),
    # so the worker either dies with its node (SIGHUP) or, where SIGHUP is ignored (a run under nohup),
    # resumes and can finish its share before its death is found: local runs under nohup saw a step end
    # with no death that way. The worker is held from before the step, so whatever share the step gives
    # it stays unfinished and there are always samples to rescue from it; the step has no seeding
    # window, so every worker gets its share when it starts. The heartbeat timeout is out of reach for
    # this step, so the cluster is the only way the death can be found, however slow the machine.
    victim = sorted(fleet.alive(PREEMPTIBLE), key=lambda h: h.name)[0]
    node = psutil.Process(fleet.instances.pop(victim.name).pid)
    worker = psutil.Process(victim.pid)
    fleet.killed.add(victim.name)  # if the test fails before the manager finds it dead, the next is not left with it

    def rest_of_node():
        return [proc for proc in [node, *node.children(recursive=True)] if proc.pid != victim.pid]

    def holds_samples(run):
        w = run.state.workers.get(victim.name)
        return w is not None and len(w.assigned) > 0

    removed = []

    def node_stops_answering(run):
        removed.append(True)
        for proc in rest_of_node():
            with contextlib.suppress(psutil.NoSuchProcess):
                proc.suspend()

    def resume(run):  # fenced by now: whatever it still sends must be ignored
        worker.resume()

    faults = [(holds_samples, node_stops_answering), (lambda run: run.stats.deaths, resume)]
    worker.suspend()
    try:
        with heartbeat_timeout(fleet, patience(600)):
            out, run = run_step(fleet, handoff=None, faults=faults)
    finally:
        # the worker first: still held when its raylet dies, it would be resumed
        for proc in [worker, *rest_of_node()]:
            with contextlib.suppress(psutil.NoSuchProcess):
                proc.kill()
    assert removed, "the step never gave the held worker a sample, so its node was never removed"
    check_invariants(out, run, state=fleet.served())
    stats = run.stats
    assert len(stats.deaths) == 1, (f"the step ended with no death of {victim.name} found: samples moved "
                                    f"{dict(stats.migrated)}, tokens by worker {dict(stats.tokens_by_worker)}")
    [(_, name, reason)] = stats.deaths
    # found out from the cluster (the node table, or the actor's death it reports)
    assert name == victim.name and not reason.startswith("no sign of life"), run.stats.deaths
    assert stats.tokens_by_worker[victim.name] == 0  # held from before the step to its death: it sent nothing


def test_pulled_buckets_can_be_served_by_the_nodes_that_pulled_them(fleet):
    """Peer to peer: after instances on their own nodes pulled a version, Ray's object directory lists
    their nodes as holders of every object they fetched (the full buckets of a version they pulled
    whole, the patch of the next one), so a later joiner can fetch from them, not only from the
    trainer's node."""
    import ray

    fleet.replenish()
    fleet.wait_ready(timeout_s=patience(120))
    holders = {h.node_id for h in fleet.alive(PREEMPTIBLE)}
    assert len(holders) == 2
    # the version served changed every tensor, offered no patch and so left no instance a copy to patch
    # from: this one, one matrix away, is pulled in full and kept, so the next comes by a patch
    fleet.publish(one_matrix_moved(fleet.served()), version=fleet.manifest.version + 1)
    fleet.wait_ready(timeout_s=patience(120))
    joined_at = fleet.manifest
    refs = [b.ref for b in joined_at.buckets]
    locations = ray.experimental.get_object_locations(refs)
    for ref in refs:
        assert holders <= set(locations[ref]["node_ids"]), locations[ref]
    fleet.publish(one_matrix_moved(fleet.served()), version=joined_at.version + 1)  # every live instance pulls it
    fleet.wait_ready(timeout_s=patience(120))
    patch = fleet.manifest.patch_from(joined_at.version, joined_at.checksum)
    assert patch is not None  # one matrix changed: a patch, not the whole version
    locations = ray.experimental.get_object_locations(patch.parts)
    for ref in patch.parts:
        assert holders <= set(locations[ref]["node_ids"]), locations[ref]


def test_a_joiner_reaches_its_version_when_the_peers_holding_its_patch_are_preempted(fleet):
    """The instances that fetched a version's patch hold copies a joiner may fetch from (Ray's object
    manager picks among the holders). Both are preempted (their nodes removed) while a joiner's pull of
    that patch from its base is in flight, held before it fetches anything until both are gone: the
    joiner still reaches the version, bit for bit (its checksum is the store's), from the copy the
    publisher keeps."""
    import dataclasses

    import ray

    fleet.replenish()
    fleet.wait_ready(timeout_s=patience(120))
    before = fleet.manifest
    fleet.publish(one_matrix_moved(fleet.weights), version=before.version + 1)  # a small patch from the base
    fleet.wait_ready(timeout_s=patience(120))
    patch = fleet.manifest.patch_from_base()
    assert patch is not None and patch.nbytes < fleet.manifest.nbytes / 10
    holders = sorted(fleet.alive(PREEMPTIBLE), key=lambda h: h.name)
    assert holders and all(h.version == fleet.manifest.version for h in holders)
    fleet.manager.pulls.take_stats()
    gate = fleet.tmp / "joiner-pull-gate"
    plain = fleet.spec
    # the base model on its disk, and a pull held until the gate opens
    fleet.spec = dataclasses.replace(plain, join_from_base=True, engine_factory=gated_pulls(str(gate)))
    try:
        [joiner] = fleet.start(PREEMPTIBLE, 1)
        assert joiner.pull is not None  # asked for, and held before it fetched a byte
        for h in holders:
            fleet.preempt(h, how="instance")
        gone = {h.node_id for h in holders}
        wait_for(lambda: not any(n["Alive"] for n in ray.nodes() if n["NodeID"] in gone), 60,
                 "the holders' nodes to be gone")
        assert not ray.wait([joiner.pull.ref], timeout=0)[0]  # still pulling: the preemption fell inside its pull
        gate.touch()
        fleet.wait_ready(timeout_s=patience(120))
    finally:
        gate.touch()
        fleet.spec = plain
    assert joiner.ready is not None and joiner.checksum == fleet.manifest.checksum
    modes = {w: mode for w, _, _, mode in fleet.manager.pulls.take_stats().pulls}
    assert modes[joiner.name] == "from_base"
    assert all(not h.alive or h.name in fleet.killed for h in holders)
    assert ray.experimental.get_object_locations(patch.parts)  # still held by the publisher
    out, run = run_step(fleet)  # what it built from its disk and the patch is the version's weights
    check_invariants(out, run, state=fleet.served())
    assert run.stats.tokens_by_worker[joiner.name] > 0


def test_a_crashed_worker_s_node_lives_until_the_fleet_reaps_it(fleet):
    """`preempt_with=process` through the instance: the worker's process dies and its billing stops at
    once, its node lives on (a crash, not a vanished VM) until the step has found the death and the
    fleet reaps the worker; then the node's whole process tree is gone."""
    victim = sorted(fleet.killable(), key=lambda h: h.name)[0]
    node = fleet.instances[victim.name]
    billed = fleet.meter.live
    worker = psutil.Process(victim.pid)  # before the kill: its PID may be another process's after
    fleet.preempt(victim, how="process")
    assert fleet.meter.live == billed - 1 and node.poll() is None
    wait_for(lambda: not running(worker), 30, "the crashed worker's process to die")  # a zombie is dead
    out, run = run_step(fleet)
    check_invariants(out, run, state=fleet.served())
    assert not fleet.worker(victim.name).alive  # found dead (in the step, or by its stream before it)...
    assert node.poll() is None  # ...not reaped yet: the node still runs
    tree = [psutil.Process(node.pid), *psutil.Process(node.pid).children(recursive=True)]
    fleet.reap()
    assert victim.name not in fleet.instances and node.poll() is not None
    # SIGKILL is delivered, not awaited: each process of the tree is gone once the kernel has run it
    wait_for(lambda: not [p for p in tree if running(p)], 30, "every process of the node to die")


def running(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
