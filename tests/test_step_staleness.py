"""Bounded staleness in the step's state machine (rlboost.rollout.step_state, `StepConfig.max_staleness`):
which versions a step admits, a newer version swapped in between tokens, the step's version advanced
by a publish (and the workers it fences), and the seeding window of a step started ahead of its
trainer. Scripted like tests/test_step_state.py: every event at an exact point, no clock."""

from __future__ import annotations

import random

import pytest

from rlboost.rollout.step_state import (RESERVED, Abort, ReleaseReserved, StepConfig, StepError, Submit, WorkerState)
from step_script import Script, expected_logprobs, expected_tokens, step, submitted


def stale(k: int) -> StepConfig:
    return StepConfig(max_staleness=k)


def assert_exact_tokens(s: Script) -> None:
    """Every sample finished once with exactly its expected tokens and log-probs (versions: the test's)."""
    assert s.state.done and s.state.num_finished == len(s.lengths)
    for uid, sample in s.samples.items():
        n = s.lengths[uid]
        assert sample.response_ids == expected_tokens(uid, n) and sample.logprobs == expected_logprobs(uid, n), uid
        assert len(sample.versions) == n, uid


def test_a_synchronous_step_admits_its_own_version_only():
    s = step(version=5, seed_window_s=None)
    with pytest.raises(ValueError, match="version 4"):
        s.join("p0", version=4)
    s.join("p1")
    assert s.state.workers["p1"].version == 5 and not s.state.admits(4) and s.state.admits(5)


def test_within_the_bound_a_worker_behind_serves_and_every_token_keeps_its_version():
    s = step(n_groups=1, n=2, length=10, version=5, seed_window_s=None, config=stale(1))
    s.join("p0", version=4)
    s.decide(0.0)
    r = next(iter(s.workers["p0"].requests.values()))
    with pytest.raises(StepError, match="weight version 3 in a step at versions 4..5"):
        s.chunk("p0", r, 4, False, version=3)
    s.run_to_end()
    assert_exact_tokens(s)
    assert all(sample.versions == [4] * len(sample.versions) for sample in s.samples.values())


def test_a_newer_version_swaps_in_between_tokens_and_the_samples_continue_on_it():
    s = step(n_groups=1, n=2, length=20, version=5, seed_window_s=None, config=stale(1), interval=4)
    s.join("p0", max_running=8, version=4)
    s.decide(0.0)
    s.generate("p0", 6)  # 4 streamed, 2 only in the engine: the abort's partial output carries them
    s.ready("p0", 5, 0.5)
    [abort] = s.state.take_commands()
    assert isinstance(abort, Abort) and abort.reason == "refreshed" and abort.then_load == 5
    assert s.state.workers["p0"].swapping == 5 and not s.state.eligible()  # no work while it swaps
    s.aborts.append(abort)
    s.answer(abort)
    again = s.decide(0.5)
    assert submitted(again) == {"p0": sorted(s.lengths)}  # back on the same worker, on the new weights
    assert {r.held for c in again if isinstance(c, Submit) for r in c.requests} == {6}
    s.run_to_end()
    assert_exact_tokens(s)
    for uid, sample in s.samples.items():
        assert sample.versions == [4] * 6 + [5] * (s.lengths[uid] - 6), uid
    assert s.state.stats.migrated["refreshed"] == 2 and s.state.workers["p0"].version == 5


def test_an_idle_worker_takes_a_newer_version_at_once():
    s = step(n_groups=1, n=1, length=10, version=5, seed_window_s=None, config=stale(2))
    s.join("p0", version=3)
    s.ready("p0", 4, 0.1)
    assert s.state.workers["p0"].version == 4 and not s.state.take_commands()
    s.decide(0.2)
    s.run_to_end()
    assert s.samples["0:0"].versions == [4] * 10


def test_a_publish_advances_the_step_and_fences_a_worker_left_behind():
    s = step(n_groups=2, n=2, length=12, version=4, seed_window_s=None, config=stale(1))
    s.join("p0", max_running=2, version=4)
    s.join("p1", max_running=2, version=3)  # admitted now, out of the window once 5 is out
    s.decide(0.0)
    assert s.workers["p1"].requests
    s.state.advance(5, 0.1)
    [fenced] = s.state.take_commands()
    assert fenced.worker == "p1" and fenced.reason == "fenced"
    assert s.state.workers["p1"].status is WorkerState.PULLING and s.state.version == 5
    s.aborts.append(fenced)
    s.answer(fenced)
    s.ready("p0", 5, 0.2)
    s.run_to_end()
    assert_exact_tokens(s)
    assert s.state.stats.tokens_by_worker["p1"] == 0 and s.state.stats.migrated["fenced"] == 2
    assert all(set(sample.versions) <= {4, 5} for sample in s.samples.values())


def test_a_publish_that_would_leave_held_tokens_past_the_bound_is_refused():
    s = step(n_groups=1, n=1, length=12, version=4, seed_window_s=None, config=stale(1))
    s.join("p0", version=3)
    s.decide(0.0)
    s.generate("p0", 4)
    with pytest.raises(StepError, match="sample 0:0 holds tokens of weight version 3, more than max_staleness=1"):
        s.state.advance(5, 0.1)
    with pytest.raises(StepError, match="cannot go back"):
        step(version=4, config=stale(1)).state.advance(3, 0.0)


def test_a_step_started_ahead_of_its_trainer_seeds_when_the_trainer_comes():
    s = step(n_groups=2, n=4, length=40, version=4, seed_window_s=None, config=stale(1), ahead=True)
    assert not s.decide(0.0)  # no worker yet: an ahead step waits for one (the reserved GPUs train)
    s.join("p0", max_running=2, version=4)  # with max_pending 2 it holds 4 of the 8
    first = s.decide(0.1)
    assert not any(isinstance(c, ReleaseReserved) for c in first)  # the reserved GPUs are the trainer's already
    s.generate("p0", 4)
    s.state.advance(5, 2.0)  # the trainer published 5 and starts on this step
    s.state.seed(2.0, 1.0)
    s.join("r0", RESERVED, max_running=8, version=5)
    assert len(submitted(s.decide(2.0))["r0"]) == 4 and s.state.seeding and s.released_at is None
    s.generate("r0", 3)
    [handoff] = [c for c in s.decide(3.0) if isinstance(c, Abort)]
    assert handoff.worker == "r0" and handoff.reason == "seed_handoff"
    s.answer(handoff)
    s.decide(3.0)
    assert s.released_at == 3.0 and s.state.stats.seed_s == pytest.approx(1.0)
    s.run_to_end()
    assert_exact_tokens(s)
    assert all(set(sample.versions) <= {4, 5} for sample in s.samples.values())


def test_a_step_done_before_its_trainer_comes_is_not_seeded():
    s = step(n_groups=1, n=2, length=5, version=4, seed_window_s=None, config=stale(1), ahead=True)
    s.join("p0", version=4)
    s.decide(0.0)
    s.run_to_end()
    s.state.seed(1.0, 10.0)
    assert not s.state.seeding and not s.decide(1.0) and s.state.released and s.released_at is None


def random_run(seed: int) -> Script:
    rng = random.Random(seed)
    k = rng.choice([1, 2])
    lengths = {f"{g}:{j}": rng.randint(5, 60) for g in range(rng.randint(2, 4)) for j in range(rng.randint(2, 4))}
    s = Script(lengths, {uid: int(uid.split(":")[0]) for uid in lengths}, interval=rng.choice([1, 3, 4]),
               seed_window_s=None, max_pending=rng.randint(0, 2), version=3, config=stale(k))
    names = iter(f"p{i}" for i in range(100))
    s.join(next(names), max_running=3, version=3)
    for tick in range(3000):
        if s.state.done:
            break
        t = tick * 0.01
        live = [n for n, w in s.state.workers.items() if w.alive]
        roll = rng.random()
        if roll < 0.04:
            s.join(next(names), max_running=rng.randint(1, 4), version=rng.randint(3 - k, 3))
        elif roll < 0.12 and live:
            name = rng.choice(live)
            newer = min(3, (s.state.workers[name].version or 3) + 1)
            s.ready(name, newer, t)
        elif roll < 0.14 and len(live) > 1:
            s.kill(rng.choice(live), f"killed at {t:.2f}")
        s.execute(s.state.take_commands())
        if s.aborts and rng.random() < 0.5:
            s.answer(rng.choice(s.aborts))
        for name in list(s.workers):
            if s.state.workers[name].alive and rng.random() < 0.5:
                s.generate(name, 1)
        s.decide(t)
    s.answer_all()
    s.run_to_end()
    assert_exact_tokens(s)
    for sample in s.samples.values():
        assert set(sample.versions) <= set(range(3 - k, 4)), sample.uid
    return s
    assert s.state.stats.wasted_tokens <= s.interval * s.state.stats.in_flight_at_preemption


@pytest.mark.parametrize("seed", range(20))
def test_random_swaps_joins_and_kills_within_the_bound_finish_every_sample_exactly(seed):
    random_run(seed)


def test_the_random_runs_swap_versions_mid_sample_and_kill_workers():
    # the runs above test something only if their events happen: swaps that split samples across
    # versions, and kills
    runs = [random_run(seed) for seed in range(20)]
    assert sum(r.state.stats.migrated["refreshed"] for r in runs) >= 20
    assert sum(r.state.stats.preemptions for r in runs) >= 10
    assert sum(len(set(x.versions)) > 1 for r in runs for x in r.samples.values()) >= 20


def test_the_reserved_workers_of_a_late_window_take_their_share_from_the_instances():
    s = step(n_groups=2, n=4, length=40, version=4, seed_window_s=None, config=stale(1), ahead=True, max_pending=0)
    s.join("p0", max_running=8, version=4)
    s.decide(0.0)
    assert len(s.workers["p0"].requests) == 8 and not s.state.pending  # the instance holds the whole batch
    for i, r in enumerate(sorted(s.workers["p0"].requests.values(), key=lambda r: r.uid)):
        r.generated = i  # 0..7 tokens each, none streamed yet
    s.state.advance(5, 1.0)
    s.state.seed(1.0, 5.0)
    s.join("r0", RESERVED, max_running=8, version=5)
    commands = s.decide(1.0)
    [share] = [c for c in commands if isinstance(c, Abort)]
    fewest = [r.request_id for r in sorted(s.workers["p0"].requests.values(), key=lambda r: r.generated)[:4]]
    assert share.worker == "p0" and share.reason == "seed_share" and sorted(share.request_ids) == sorted(fewest)
    s.answer(share)
    assert len(submitted(s.decide(1.0))["r0"]) == 4  # half the engines, half the unfinished samples
    s.run_to_end()
    assert_exact_tokens(s)
    assert s.state.stats.migrated["seed_share"] == 4


def test_a_limited_worker_takes_only_its_slots_and_queues_nothing():
    s = step(n_groups=2, n=4, length=30, version=4, seed_window_s=None, config=stale(1), ahead=True, max_pending=2)
    s.join("p0", max_running=4, version=4)
    s.state.limit("p0", 1)  # the step before runs 3 of its 4 slots
    assert submitted(s.decide(0.0)) == {"p0": [s.state.workers["p0"].assigned.copy().pop()]}
    assert len(s.state.pending) == 7
    s.state.limit("p0", 3)
    assert len(submitted(s.decide(0.1))["p0"]) == 2 and s.state.holding("p0") == 3
    s.state.limit("p0", None)  # the step before is over: all 4 slots, and the queue of max_pending 2
    assert len(submitted(s.decide(0.2))["p0"]) == 3 and s.state.holding("p0") == 6
    s.run_to_end()
    assert_exact_tokens(s)


def test_a_lower_limit_yields_the_samples_with_fewest_tokens_and_they_continue_exactly():
    s = step(n_groups=1, n=4, length=30, version=4, seed_window_s=None, config=stale(1), ahead=True, max_pending=0,
             interval=4)
    s.join("p0", max_running=4, version=4)
    s.state.limit("p0", 4)
    s.decide(0.0)
    requests = sorted(s.workers["p0"].requests.values(), key=lambda r: r.uid)
    for i, r in enumerate(requests):
        r.generated = 2 * i  # 0, 2, 4, 6 tokens, none streamed
    s.state.limit("p0", 1)  # the step before needs 3 slots back
    [abort] = s.state.take_commands()
    assert isinstance(abort, Abort) and abort.reason == "yielded"
    assert sorted(abort.request_ids) == sorted(r.request_id for r in requests[:3])  # the fewest tokens first
    s.state.limit("p0", 0)  # asked again before the answer: only the sample not already leaving goes
    [again] = s.state.take_commands()
    assert again.request_ids == [requests[3].request_id]
    s.aborts += [abort, again]
    s.answer_all()
    assert not s.decide(0.1) and len(s.state.pending) == 4  # no slot: they wait, holding what they made
    assert s.state.stats.migrated["yielded"] == 4
    s.state.limit("p0", None)
    assert {r.held for c in s.decide(0.2) if isinstance(c, Submit) for r in c.requests} == {0, 2, 4, 6}
    s.run_to_end()
    assert_exact_tokens(s)
