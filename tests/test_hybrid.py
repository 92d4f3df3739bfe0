"""Hybrid rollout with real processes and real kills (SIGKILL of worker processes): every sample
finishes exactly once, on-policy, as the exact continuation of its tokens, with bounded waste; a
fenced worker's late tokens are dropped; the step finishes without preemptible workers at all."""

from __future__ import annotations

import random
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
    fleet.replenish(fleet.weights, version=0)
    assert len(fleet.manager.alive(PREEMPTIBLE)) == fleet.cfg.num_preemptible


def test_unkilled_step_matches_the_single_engine(fleet, ref):
    out, run = run_step(fleet)
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


def test_all_preemptible_workers_dying_mid_step(fleet, ref):
    out, run = run_step(fleet, kills=[(0.5, 0), (0.5, 0), (0.5, 0)])
    check_invariants(out, run, ref, fleet.tmp / "ledgers")
    assert run.stats.preemptions == 3
    assert run.stats.tokens_by_kind[RESERVED] > 0  # the reserved worker took the work back
    refill(fleet)


def test_zero_preemptible_workers(fleet, ref):
    for h in fleet.manager.alive(PREEMPTIBLE):
        fleet.preempt(h)
    out, run = run_step(fleet)  # the kills are found out during the step, as a real preemption would be
    check_invariants(out, run, ref)
    assert run.stats.tokens_by_kind[PREEMPTIBLE] == 0 and run.stats.migrated["seed_handoff"] == 0
    fleet.manager.reap()
    assert fleet.manager.alive(PREEMPTIBLE) == []
    out, run = run_step(fleet)
    check_invariants(out, run, ref)
    assert run.stats.seed_s == pytest.approx(run.stats.rollout_s)  # nobody to hand off to: no switch
    refill(fleet)
