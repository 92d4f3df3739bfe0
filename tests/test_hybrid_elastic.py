"""Instances on their own schedule: joining mid-step, pulling weights, dying mid-pull, being refused,
and preemption notices (invariants 1, 2, 4, 5, 7), with real processes and real kills. From the first
test on, the fleet serves a version with tensors of its own (not the base every instance boots with),
so a joiner's samples are checked against the weights it pulled."""

from __future__ import annotations

import dataclasses
import os
import signal
import threading
import time

import pytest
import ray

from hybrid_util import (ENGINE, MODEL, advance, busiest, check_invariants, handed_off, make_whole, patience, run_step,
                         heartbeat_timeout, slow_loads,
                         start_fleet)
from rlboost.cluster import weights as ws
from rlboost.hybrid.fleet import WorkerActor
from rlboost.hybrid.handles import PREEMPTIBLE, RESERVED, WorkerHandle, WorkerState
from rlboost.models import ModelConfig, load_model

pytestmark = pytest.mark.e2e  # fleets of real processes joining and leaving: `make test-e2e`


@pytest.fixture(scope="module")
def shared_fleet(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("elastic")
    # small batches make a step long enough (seconds) for an instance to boot and join during it
    fleet, _ = start_fleet(tmp, num_preemptible=0, weights=ws.WeightsConfig(pull_timeout_s=patience(10), pull_retries=2),
                           spec_overrides={"engine": dataclasses.replace(ENGINE, max_num_seqs=4)})
    fleet.tmp = tmp
    advance(fleet)
    yield fleet
    fleet.shutdown()


@pytest.fixture
def fleet(shared_fleet):
    yield shared_fleet
    make_whole(shared_fleet)


NEVER_S = 3600.0
"""A pull delay no step comes near, however loaded the machine: a step that waited for such a pull would
show it without a race against the step's own time."""


def kill_all_preemptible(fleet):
    for h in fleet.killable():
        fleet.preempt(h)
    run_step(fleet)  # finds the kills out
    fleet.reap()


def test_an_instance_joining_mid_step_serves_once_its_pull_verifies(fleet):
    """An instance started once the reserved worker is busy with the step joins it when its pull
    verifies. The step cannot end before that, however long the boot takes: the reserved worker is
    frozen (SIGSTOP) from the join until the step has the newcomer serving, then thawed."""
    joined, frozen = [], {}
    fleet.manager.pulls.take_stats()

    def join(run):  # once the reserved worker is busy with the step
        (frozen["h"],) = fleet.alive(RESERVED)
        os.kill(frozen["h"].pid, signal.SIGSTOP)
        threading.Thread(target=lambda: joined.extend(fleet.start(PREEMPTIBLE, 1)), daemon=True).start()

    def serving(run):
        w = run.state.workers.get(joined[0].name) if joined else None
        return w is not None and w.status is WorkerState.SERVING

    try:
        # frozen for as long as a boot and a pull may take: not declared dead meanwhile
        with heartbeat_timeout(fleet, patience(120)):
            out, run = run_step(fleet, handoff=None,  # the reserved worker alone would take the whole step
                                faults=[(lambda run: run.stats.tokens_by_kind[RESERVED] > 0, join),
                                        (serving, lambda run: os.kill(frozen["h"].pid, signal.SIGCONT))])
    finally:
        if "h" in frozen:
            os.kill(frozen["h"].pid, signal.SIGCONT)
    check_invariants(out, run, state=fleet.served())
    (h,) = joined
    assert h.ready is not None and h.ready > run.t0  # it verified its weights during the step...
    assert h.version == fleet.manifest.version and h.checksum == fleet.manifest.checksum
    assert run.stats.tokens_by_worker[h.name] > 0  # ...and joined the dispatch then
    assert run.stats.deaths == []  # the frozen reserved worker was waited for, not declared dead
    pulls = fleet.manager.pulls.take_stats()
    assert len(pulls.provision_s) == 1 and pulls.pulls
    kill_all_preemptible(fleet)


def test_an_instance_killed_mid_pull_never_serves_and_blocks_nothing(fleet):
    spec = fleet.spec
    fleet.spec = dataclasses.replace(spec, engine_factory=slow_loads(NEVER_S))
    try:
        (h,) = fleet.start(PREEMPTIBLE, 1)
    finally:
        fleet.spec = spec
    assert h.pull is not None and h.version == -1
    fleet.preempt(h)
    t0 = time.monotonic()
    out, run = run_step(fleet)
    check_invariants(out, run, state=fleet.served())
    assert not h.alive and h.version == -1 and run.stats.tokens_by_worker[h.name] == 0
    assert time.monotonic() - t0 < NEVER_S  # the step did not wait for the pull to end
    fleet.reap()


def test_a_pull_failing_its_checksum_is_retried_then_the_instance_dropped(fleet):
    good = fleet.manager.manifest
    first = good.buckets[0]
    fleet.manager.pulls.take_stats()
    fleet.manager.pulls.manifest = dataclasses.replace(
        good, buckets=[dataclasses.replace(first, crc32=first.crc32 ^ 1)] + good.buckets[1:])
    try:
        (h,) = fleet.start(PREEMPTIBLE, 1)
        fleet.wait_ready(timeout_s=patience(30))  # returns once the instance is dropped
    finally:
        fleet.manager.pulls.manifest = good
    assert not h.alive and h.version == -1
    assert "weight pull failed 3 times" in h.fenced and "checksum" in h.fenced
    assert fleet.manager.pulls.take_stats().pull_failures == 3
    out, run = run_step(fleet)
    check_invariants(out, run, state=fleet.served())
    fleet.reap()


def test_an_instance_serving_another_model_is_refused(fleet):
    spec = fleet.spec
    fleet.spec = dataclasses.replace(spec, model=ModelConfig(path="tiny:llama"))
    try:
        assert fleet.start(PREEMPTIBLE, 1) == []
    finally:
        fleet.spec = spec
    name, why = fleet.manager.pulls.stats.refused[-1]
    assert "serves model" in why and name not in {h.name for h in fleet.handles()}


def test_an_instance_claiming_the_version_with_other_weights_is_refused(fleet):
    actor = WorkerActor.options(num_cpus=0, resources={RESERVED: 1}).remote(fleet.spec)
    other = {n: p.detach() for n, p in load_model(dataclasses.replace(MODEL, seed=7)).model.named_parameters()}
    foreign = ws.publish(other, version=fleet.manifest.version)
    ray.get(actor.pull.remote(foreign, 20))
    info = ray.get(actor.info.remote())
    assert info.version == fleet.manifest.version and info.checksum != fleet.manifest.checksum
    handle = WorkerHandle("impostor", PREEMPTIBLE, actor, info.pid, info.node_id, info.max_running, info.version,
                          info.fingerprint, info.checksum)
    assert fleet.manager.add_worker(handle) is False
    assert "impostor" not in {h.name for h in fleet.handles()}
    assert "checksum" in fleet.manager.pulls.stats.refused[-1][1]


def test_a_noticed_preemption_wastes_no_tokens(fleet):
    fleet.start(PREEMPTIBLE, 2)
    fleet.wait_ready(timeout_s=patience(120))
    victim = {}

    def notice(run):
        name = busiest(run)
        victim["h"], victim["in_flight"] = fleet.worker(name), run.state.holding(name)
        fleet.notice(name, 0.5)

    def gone(run):  # the kill comes once the notice took its samples back
        return "h" in victim and not run.state.holding(victim["h"].name)

    out, run = run_step(fleet, faults=[(lambda run: handed_off(run) and busiest(run) is not None, notice),
                                       (gone, lambda run: fleet.preempt(victim["h"]))])
    check_invariants(out, run, ledger_dir=fleet.tmp / "ledgers", state=fleet.served())
    h = victim["h"]
    # what it held when warned went back by the notice (or finished, or moved, before the notice arrived)
    assert victim["in_flight"] > 0 and run.stats.migrated["noticed"] > 0
    assert run.stats.wasted_tokens == 0 and run.stats.in_flight_at_preemption == 0  # nothing left on it
    from rlboost.hybrid.token_ledger import read_ledger
    generated = read_ledger(fleet.tmp / "ledgers" / f"{h.name}.ledger").generated
    lost = {rid: n - run.stats.received[rid] for rid, n in generated.items() if rid.rpartition("#")[0] in run.tracked}
    assert lost and all(v == 0 for v in lost.values()), lost
    kill_all_preemptible(fleet)
