"""Hybrid rollout with real processes and real kills (SIGKILL of worker processes): every sample
finishes exactly once, on-policy, as the exact continuation of its tokens, with bounded waste; a
fenced worker's late tokens are dropped; the step finishes without preemptible workers at all."""

from __future__ import annotations

import os
import random
import signal
import threading
import time

import pytest

from hybrid_util import check_invariants, reference, run_step, start_fleet
from rlboost.hybrid.manager import PREEMPTIBLE, RESERVED


@pytest.fixture(scope="module")
def ref():
    return reference()


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("hybrid")
    fleet, weights = start_fleet(tmp, num_preemptible=3)
    fleet.weights, fleet.tmp = weights, tmp
    yield fleet
    fleet.shutdown()


def refill(fleet) -> None:
    fleet.replenish()
    fleet.wait_ready()
    assert len(fleet.manager.alive(PREEMPTIBLE)) == fleet.cfg.num_preemptible


def test_unkilled_step_matches_the_single_engine(fleet, ref):
    from rlboost.hybrid.ray_setup import non_loopback_listeners

    assert os.environ.get("RAY_AUTH_MODE") == "token"  # the run's Ray demands its token
    out, run = run_step(fleet)
    assert non_loopback_listeners() == []  # nothing of it, workers included, listens beyond 127.0.0.1
    check_invariants(out, run, ref)
    assert run.stats.migrated["seed_handoff"] > 0  # the reserved worker handed its partial samples over
    assert run.stats.tokens_by_kind[RESERVED] > 0 and run.stats.tokens_by_kind[PREEMPTIBLE] > 0
    assert run.stats.deaths == []


@pytest.mark.parametrize("seed", [0, 1])
def test_sigkilled_workers_lose_no_sample(fleet, ref, seed):
    rng = random.Random(seed)
    kills = sorted((rng.uniform(0.35, 0.9), rng.randrange(3)) for _ in range(2))
    out, run = run_step(fleet, kills=kills)
    check_invariants(out, run, ref, fleet.tmp / "ledgers")
    assert run.stats.preemptions == 2 and run.stats.migrated["preempted"] > 0, run.stats
    assert run.stats.in_flight_at_preemption > 0
    assert any(t.migrations >= 1 for t in run.tracked.values())
    refill(fleet)


def test_a_fenced_worker_cannot_contribute(fleet, ref):
    # fence a live, busy preemptible worker right after the hand-off; it keeps generating and streaming
    def fence_one():
        time.sleep(0.5)
        busiest = max(fleet.manager.alive(PREEMPTIBLE), key=lambda h: len(h.assigned))
        fleet.manager.fence(busiest.name, "test: declared dead while alive")

    threading.Thread(target=fence_one, daemon=True).start()
    out, run = run_step(fleet)
    check_invariants(out, run, ref)
    assert run.stats.fenced_tokens_dropped > 0  # it did send more, and all of it was dropped
    fenced = [h for h in fleet.manager.workers.values() if not h.alive]
    assert len(fenced) == 1 and fenced[0].stream is not None  # still streaming when the step ended
    refill(fleet)


def test_a_frozen_worker_is_fenced_and_its_late_tokens_dropped(fleet, ref):
    """SIGSTOP freezes a busy worker: Ray still counts it alive and its stream just goes quiet. Missed
    heartbeats and an unanswered ping get it declared dead; SIGCONT right after lets it stream again,
    and all of it is dropped."""
    cfg = fleet.manager.cfg
    saved, cfg.heartbeat_timeout_s = cfg.heartbeat_timeout_s, 1.6
    frozen = {}

    def freeze_then_thaw():
        time.sleep(0.5)
        frozen["h"] = h = max(fleet.manager.alive(PREEMPTIBLE), key=lambda h: len(h.assigned))
        os.kill(h.pid, signal.SIGSTOP)
        while h.alive:
            time.sleep(0.01)
        os.kill(h.pid, signal.SIGCONT)

    thread = threading.Thread(target=freeze_then_thaw, daemon=True)
    thread.start()
    try:
        out, run = run_step(fleet)
    finally:
        thread.join()
        cfg.heartbeat_timeout_s = saved
    check_invariants(out, run, ref)
    [(_, name, reason)] = run.stats.deaths
    assert name == frozen["h"].name and reason.startswith("no sign of life"), run.stats.deaths
    assert run.stats.fenced_tokens_dropped > 0
    refill(fleet)


def test_all_preemptible_workers_dying_mid_step(fleet, ref):
    out, run = run_step(fleet, kills=[(0.5, 0), (0.5, 0), (0.5, 0)])
    check_invariants(out, run, ref, fleet.tmp / "ledgers")
    assert run.stats.preemptions == 3
    assert run.stats.tokens_by_kind[RESERVED] > 0  # the reserved worker took the work back
    refill(fleet)


def test_a_worker_at_another_weight_version_gets_no_work(fleet, ref):
    """Invariant 1: only workers holding the step's version generate. One preemptible worker is frozen
    (SIGSTOP) when version 1 is published (same tensors, so the reference outputs stay valid): its pull
    cannot finish, so it must stay idle through the step, and serve again once it has pulled."""
    stale = sorted(fleet.manager.alive(PREEMPTIBLE), key=lambda h: h.name)[0]
    os.kill(stale.pid, signal.SIGSTOP)
    try:
        fleet.publish(fleet.weights, version=1)  # returns without waiting for preemptible pulls
        out, run = run_step(fleet, version=1)
        check_invariants(out, run, ref, version=1)
        assert stale.alive and stale.version == 0 and stale.pull is not None
        assert run.stats.tokens_by_worker[stale.name] == 0 and run.stats.tokens_by_kind[PREEMPTIBLE] > 0
    finally:
        os.kill(stale.pid, signal.SIGCONT)
    fleet.wait_ready()
    assert stale.version == 1 and stale.checksum == fleet.manifest.checksum
    fleet.publish(fleet.weights, version=0)  # back to version 0 for the other tests
    fleet.wait_ready()


def test_zero_preemptible_workers(fleet, ref):
    for h in fleet.manager.alive(PREEMPTIBLE):
        fleet.preempt(h)
    out, run = run_step(fleet)  # the kills are found out during the step, as a real preemption would be
    check_invariants(out, run, ref)
    assert run.stats.tokens_by_kind[PREEMPTIBLE] == 0
    # the window may close before a kill is found out (a loaded machine): whatever was handed to a
    # dead instance came back as a preemption and finished on the reserved worker
    assert run.stats.migrated["seed_handoff"] <= run.stats.migrated["preempted"]
    fleet.manager.reap()
    assert fleet.manager.alive(PREEMPTIBLE) == []
    out, run = run_step(fleet)
    check_invariants(out, run, ref)
    assert run.stats.seed_s == pytest.approx(run.stats.rollout_s)  # nobody to hand off to: no switch
    refill(fleet)



def test_the_gated_loop_decides_as_an_ungated_one(fleet, ref, monkeypatch):
    """The loop skips the dispatcher and the balancer while nothing they read has changed since they
    last did nothing. Before each of its turns this asks both, ungated, what they would decide on the
    same state, and checks the loop does exactly that: in an undisturbed step (whose tail rebalances),
    then through a fence, a notice and a kill that leave the work to the reserved worker."""
    from rlboost.hybrid.manager import StepRun
    from rlboost.policies import WorkerLoad

    def ungated_loads(run):
        loads = []
        for h in run.m.alive():
            if run._eligible(h):
                running = min(len(h.assigned), h.max_running)
                loads.append(WorkerLoad(h.name, running, len(h.assigned) - running, h.max_running))
        return loads

    def record(obj, name, calls):
        method = getattr(type(obj), name)

        def recorded(*args):
            calls.append(method(obj, *args))
            return calls[-1]
        monkeypatch.setattr(obj, name, recorded)

    assigned, balanced = [], []
    record(fleet.manager.dispatcher, "assign", assigned)
    record(fleet.manager.balancer, "rebalance", balanced)
    count = {"dispatch": 0, "dispatch skipped": 0, "balance": 0, "balance skipped": 0}
    dispatch, rebalance = StepRun._dispatch, StepRun._rebalance

    def checked_dispatch(run):
        before, calls = list(run.pending), len(assigned)
        if not before or not ungated_loads(run):  # the ungated loop first let reserved workers back in
            dispatch(run)
            assert not run.pending or ungated_loads(run)
            return
        expected = run.m.dispatcher.assign(before, ungated_loads(run))
        del assigned[calls:]
        dispatch(run)
        assert {uid: run.tracked[uid].worker for uid in set(before) - set(run.pending)} == expected
        count["dispatch"] += 1
        count["dispatch skipped"] += len(assigned) == calls

    def checked_rebalance(run):
        expected, calls, free = [], len(balanced), not run.pending and not run._aborts
        if free:
            plateaus = {h.name: h.profile._compute_plateau() for h in run.m.alive()}  # no cache
            expected = run.m.balancer.rebalance(ungated_loads(run), plateaus)
            del balanced[calls:]
            count["balance"] += 1
        rebalance(run)
        assert (balanced[calls] if len(balanced) > calls else []) == expected
        count["balance skipped"] += free and len(balanced) == calls

    monkeypatch.setattr(StepRun, "_dispatch", checked_dispatch)
    monkeypatch.setattr(StepRun, "_rebalance", checked_rebalance)

    out, run = run_step(fleet)  # undisturbed: the tail leaves instances idle next to busy ones
    check_invariants(out, run, ref)

    def fence_then_notice():
        time.sleep(0.4)
        live = sorted(fleet.manager.alive(PREEMPTIBLE), key=lambda h: h.name)
        fleet.manager.fence(live[0].name, "test: fenced")
        time.sleep(0.2)
        fleet.manager.notice(live[1].name, 1.0)

    thread = threading.Thread(target=fence_then_notice, daemon=True)
    thread.start()
    out, run = run_step(fleet, kills=[(0.9, 1)])  # the third instance: the reserved worker takes the rest back
    thread.join()
    check_invariants(out, run, ref)
    assert count["dispatch skipped"] > 0 and count["balance skipped"] > 0, count
    for h in fleet.manager.alive(PREEMPTIBLE):
        if h.noticed:
            fleet.preempt(h)
    refill(fleet)
