"""Chaos: a multi-step run under a hundred hard kills (worker processes SIGKILLed, Ray nodes removed with
their processes), many of them while the victim is still pulling its weights, each at an exact event of
a step (a worker's token count, a pull in flight). The pool is refilled by the `fixed` provider as
instances die. Asserted from the workers' ledgers, step by step: no sample lost or duplicated, no step
mixing versions, no request losing more than (max_unacked_reports + 1) x stream_interval tokens to a
death (in the engine or in reports Ray was carrying), and `migration/wasted_tokens` equal to the
ledgers' count of tokens generated and never received.

The ordinary suite runs a shorter version of each (12 process kills; 2 process and 2 node kills);
`make bench` the hundred kills of each (hours on a 2-core machine: left out of CI)."""

from __future__ import annotations

import random
import time

import pytest

from hybrid_util import check_invariants, patience, run_step, slow_loads, start_fleet, version_weights
from rlboost.hybrid.fleet import Fleet
from rlboost.hybrid.providers import FixedPool
from rlboost.hybrid.step_run import StepRun

pytestmark = pytest.mark.e2e  # whole training runs under random hard kills: `make test-e2e`

KILLS_PER_STEP = 4
"""Kills armed per step, one after another; those a step ends before are not carried over."""
PULL_SHARE = 0.4
"""The share of kills that wait for a victim with a pull in flight."""


class Chaos:
    """Each step's kills as faults at events: the i-th waits for the (i-1)-th, then for a victim (a live,
    not yet killed instance) that has streamed a seeded number of tokens in the step, or for one whose
    pull is in flight; the kinds of kill in `how` take turns, whatever the timing. The first kill of
    a step is always one in a pull: every step publishes a version of its own, which the instances
    pull as it starts (a seeded draw alone left a run of 4 node kills with none in a pull)."""

    def __init__(self, fleet: Fleet, seed: int, how: list[str]):
        self.fleet, self.how = fleet, how
        self.rng = random.Random(seed)
        self.kills: list[tuple[str, str, bool]] = []  # (name, how, mid-pull)

    def faults(self) -> list:
        fired = [0]
        plans = [(i == 0 or self.rng.random() < PULL_SHARE, self.rng.randrange(4, 200), self.rng.randrange(1 << 16))
                 for i in range(KILLS_PER_STEP)]

        def fault(i: int, mid_pull: bool, tokens: int, pick: int):
            victim = {}

            def when(run: StepRun) -> bool:
                if fired[0] != i:
                    return False
                by_tokens = dict(run.stats.tokens_by_worker)  # a copy, made in one piece under the GIL
                ready = [h for h in self.fleet.killable()
                         if (h.pull is not None if mid_pull else by_tokens.get(h.name, 0) >= tokens)]
                if ready:
                    victim["h"] = ready[pick % len(ready)]
                return bool(ready)

            def what(run: StepRun) -> None:
                h, how = victim["h"], self.how[len(self.kills) % len(self.how)]
                self.kills.append((h.name, how, h.pull is not None))
                self.fleet.preempt(h, how)
                fired[0] += 1

            return when, what

        return [fault(i, *plan) for i, plan in enumerate(plans)]


def run_under_chaos(tmp_path, instances: str, kills: int) -> None:
    how = ["instance"] if instances == "processes" else ["process", "instance"]
    # loading a version takes 0.3 s more than it would, so a fair share of the kills land during a pull
    fleet, _ = start_fleet(tmp_path, num_preemptible=3, instances=instances,
                           spec_overrides={"engine_factory": slow_loads(0.3)})
    pool = FixedPool(fleet, size=3, preempt_every=0.0, seed=0, respawn=True)
    chaos = Chaos(fleet, seed=1, how=how)
    # what fails the test is a run where the kills stop (no instance comes up to be killed)
    stall_s = patience(120)
    version, wasted = 0, 0
    t0 = time.monotonic()
    try:
        pool.start()
        seen, progress_at = 0, time.monotonic()
        while len(chaos.kills) < kills:
            if len(chaos.kills) > seen:
                seen, progress_at = len(chaos.kills), time.monotonic()
            assert time.monotonic() - progress_at < stall_s, f"no kill for {stall_s:.0f} s after {seen} kills"
            version += 1
            fleet.publish(version_weights(version), version)  # tensors of its own: stale weights would show
            out, run = run_step(fleet, version=version, faults=chaos.faults())
            wasted += check_invariants(out, run, ledger_dir=tmp_path / "ledgers", state=fleet.served())
    finally:
        pool.stop()
        fleet.shutdown()
    mid_pull = sum(1 for _, _, p in chaos.kills if p)
    print(f"\n{instances}: {len(chaos.kills)} kills ({mid_pull} mid-pull) over {version} steps in "
          f"{time.monotonic() - t0:.0f} s, {wasted} tokens generated and never received (the ledgers' count "
          f"and the manager's)")
    assert mid_pull >= 1
    assert {h for _, h, _ in chaos.kills} == set(how)


@pytest.mark.parametrize("instances,kills", [("processes", 12), ("nodes", 4)])
def test_a_run_survives_hard_kills_and_loses_no_more_than_the_bound(tmp_path, instances, kills):
    run_under_chaos(tmp_path, instances, kills)


@pytest.mark.bench
@pytest.mark.timeout(7200)  # 100 boots of a worker (and of a Ray node): past the 15 min backstop
@pytest.mark.parametrize("instances,kills", [("processes", 100), ("nodes", 100)])
def test_a_run_survives_a_hundred_hard_kills_and_loses_no_more_than_the_bound(tmp_path, instances, kills):
    """A bigger run of the test above, left out of CI: a hundred boots of a worker process (and of a Ray
    node) take tens of minutes to hours on a 2-core machine (the ordinary suite's 4 node kills took 5 min)."""
    run_under_chaos(tmp_path, instances, kills)
