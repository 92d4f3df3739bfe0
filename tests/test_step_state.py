"""The step's state machine (rlboost.rollout.step_state), driven by scripted event sequences: the
seeding hand-off, dispatch and shares, kills at exact token counts, exact continuation, waste,
fencing, the colocated fallback, notices and releases, balancing, group completion, the step's
timings, and the invariants it refuses to break. No Ray, no threads, no clock: every fault happens
at an exact point of the script."""

from __future__ import annotations

import random

import pytest

from rlboost.engine.sequence import ChunkColumns, StreamChunk
from rlboost.rollout.step_state import (RESERVED, Abort, GroupDone, Partial, ReleaseReserved, StepConfig, StepError, StepState, Submit)
from step_script import Script, step, submitted


# ---- the seeding window ------------------------------------------------------------------------------

def test_the_window_hands_the_reserved_samples_to_the_instances_and_then_frees_the_reserved_workers():
    s = step(n_groups=2, n=4, length=40, seed_window_s=1.0)
    s.reserved("r0", max_running=8)
    s.join("p0", max_running=8, serving=False, pulling_since=0.0)  # pulling the step's weights: its share waits for it
    first = s.decide(0.0)
    assert len(submitted(first)["r0"]) == 4 and s.state.pending  # half the step is held for p0
    s.generate("r0", 6)
    s.state.ready("p0", 0.5, pull_s=0.5)
    assert len(submitted(s.decide(0.5))["p0"]) == 4
    assert s.released_at is None and not s.decide(0.9)  # still seeding: nothing to do
    handoff = s.decide(1.0)
    [abort] = [c for c in handoff if isinstance(c, Abort)]
    assert abort.worker == "r0" and abort.reason == "seed_handoff" and abort.then_sleep
    assert s.released_at is None  # the reserved worker is not free until its samples are back
    s.answer(abort)
    again = s.decide(1.0)
    assert s.released_at == 1.0 and any(isinstance(c, ReleaseReserved) for c in again)
    moved = submitted(again)
    assert set(moved) == {"p0"} and len(moved["p0"]) == 4  # the reserved worker takes no more work
    held = {r.uid: r.held for c in again if isinstance(c, Submit) for r in c.requests}
    # 6 generated, 4 streamed: the partial output carries all 6, and the sample continues from there
    assert set(held.values()) == {6} and all(len(s.samples[uid].response_ids) == 6 for uid in held)
    assert s.state.stats.migrated["seed_handoff"] == 4 and s.state.stats.seed_s == 1.0
    s.run_to_end()
    s.assert_exact()
    assert s.state.stats.tokens_by_kind[RESERVED] == 4 * 6


def test_a_window_ended_by_an_event_hands_off_then_and_only_once():
    s = step(n_groups=2, n=4, length=40, seed_window_s=float("inf"))  # no time ends this window
    s.reserved("r0", max_running=8)
    s.join("p0", max_running=8)
    s.decide(0.0)
    s.generate("r0", 6)
    assert not s.decide(1e9) and s.state.seeding  # however late: still seeding
    s.state.end_window(2.0)
    [abort] = [c for c in s.decide(2.0) if isinstance(c, Abort)]
    assert abort.worker == "r0" and abort.reason == "seed_handoff" and not s.state.seeding
    s.answer(abort)
    s.state.end_window(3.0)  # once seeding is over the event changes nothing
    assert not [c for c in s.decide(3.0) if isinstance(c, Abort)] and s.released_at == 3.0
    assert s.state.stats.migrated["seed_handoff"] == 4 and s.state.stats.seed_s == 2.0
    s.run_to_end()
    s.assert_exact()


def test_without_an_instance_the_reserved_workers_keep_the_step():
    s = step(seed_window_s=0.5)
    s.reserved("r0", max_running=8)
    s.decide(0.0)
    s.decide(2.0)
    assert not s.aborts and s.released_at is None  # nobody to hand off to
    s.run_to_end()
    s.assert_exact()
    assert s.state.stats.seed_s == s.state.stats.rollout_s and s.released_at == s.now


def test_an_evaluation_has_no_window_and_frees_the_trainer_at_once():
    s = step(seed_window_s=None)
    s.reserved("r0", max_running=8)
    s.decide(0.0)
    assert s.released_at == 0.0 and s.state.next_deadline() is None
    s.run_to_end()
    s.assert_exact()


# ---- dispatch and shares -----------------------------------------------------------------------------

def test_a_pulling_instance_keeps_its_share_only_as_long_as_a_pull_takes():
    s = step(n_groups=2, n=4, seed_window_s=None, config=StepConfig(share_grace_s=1.0), longest_pull_s=2.0)
    s.reserved("r0", max_running=8)
    s.join("p0", max_running=8, serving=False, pulling_since=0.0)
    assert len(submitted(s.decide(0.0))["r0"]) == 4
    assert not s.decide(3.9)  # grace: max(1, 2 x the longest pull) = 4 s
    assert len(submitted(s.decide(4.1))["r0"]) == 4  # a pull that hangs gives its share back


def test_dispatch_follows_the_given_order_and_a_partial_order_is_refused():
    lengths = {f"0:{j}": 5 for j in range(4)}
    order = ["0:3", "0:1", "0:0", "0:2"]
    s = Script(lengths, {uid: 0 for uid in lengths}, order=order, seed_window_s=None)
    s.reserved("r0", max_running=1)
    s.state.dispatcher.max_pending = 0
    assert submitted(s.decide(0.0)) == {"r0": ["0:3"]}
    s.generate("r0", 5)
    assert submitted(s.decide(0.1)) == {"r0": ["0:1"]}
    with pytest.raises(ValueError, match="every sample of the step exactly once"):
        Script(lengths, {uid: 0 for uid in lengths}, order=order[:3])


# ---- kills, waste, continuation, fencing -------------------------------------------------------------

@pytest.mark.parametrize("tokens", [1, 4, 7, 8, 11])
def test_a_kill_at_an_exact_token_count_requeues_from_the_last_streamed_token(tokens):
    s = step(n_groups=1, n=4, length=20, seed_window_s=None, interval=4)
    s.join("p0")
    s.join("p1")
    s.decide(0.0)
    victims = dict(s.workers["p0"].requests)
    s.generate("p0", tokens)
    streamed = tokens - tokens % 4
    s.kill("p0")
    stats = s.state.stats
    assert stats.preemptions == 1 and stats.in_flight_at_preemption == len(victims)
    assert stats.wasted_tokens == len(victims) * (tokens % 4) <= 4 * len(victims)  # bounded waste
    assert stats.migrated["preempted"] == len(victims)
    resumed = submitted(s.decide(0.1))["p1"]
    assert sorted(resumed) == sorted(r.uid for r in victims.values())
    assert all(len(s.samples[uid].response_ids) == streamed for uid in resumed)
    assert all(s.state.tracked[uid].migrations == 1 for uid in resumed)
    s.run_to_end()
    s.assert_exact()  # the continuation is exact: prompt + streamed tokens + the rest


def test_a_fenced_worker_never_contributes_again():
    s = step(n_groups=1, n=2, length=20, seed_window_s=None)
    s.join("p0")
    s.join("p1")
    s.decide(0.0)
    [r] = [r for r in s.workers["p0"].requests.values()]
    s.state.dead("p0", "fenced by the test", 0.1)  # declared dead while it still runs
    before = list(s.samples[r.uid].response_ids)
    s.chunk("p0", r, 4, False)  # it keeps streaming
    assert s.samples[r.uid].response_ids == before and s.state.stats.fenced_tokens_dropped == 4
    assert s.state.stats.preemptions == 1 and s.state.stats.deaths[0][1:] == ("p0", "fenced by the test")
    s.run_to_end()
    s.assert_exact()
    assert s.state.stats.tokens_by_worker["p0"] == 0


def test_a_chunk_of_an_attempt_already_taken_back_is_stale():
    s = step(n_groups=1, n=2, length=20, seed_window_s=None)
    s.join("p0")
    s.decide(0.0)
    r = next(iter(s.workers["p0"].requests.values()))
    s.state.notice("p0", 0.1)
    s.generate("p0", 3)  # generated but not chunked: the abort's partial output carries them
    s.execute(s.state.take_commands())
    s.answer()
    late = type(r)(r.uid, r.request_id, r.held, generated=4)
    s.chunk("p0", late, 4, False)  # the chunk of those tokens arrives after the answer
    assert s.state.stats.stale_chunks == 1 and len(s.samples[r.uid].response_ids) == 3


def test_tokens_of_another_version_or_with_a_gap_are_refused():
    s = step(n_groups=1, n=1, length=20, seed_window_s=None)
    s.join("p0")
    s.decide(0.0)
    r = next(iter(s.workers["p0"].requests.values()))
    with pytest.raises(StepError, match="weight version 3 in a step at version 0"):
        s.chunk("p0", r, 4, False, version=3)
    r.streamed = 4  # as if the first chunk had been lost
    with pytest.raises(StepError, match="a gap or a duplicate"):
        s.chunk("p0", r, 4, False)


def test_a_partial_output_that_does_not_extend_the_streamed_tokens_is_refused():
    s = step(n_groups=1, n=1, length=20, seed_window_s=None)
    s.join("p0")
    s.decide(0.0)
    r = next(iter(s.workers["p0"].requests.values()))
    s.generate("p0", 4)
    s.state.notice("p0", 0.1)
    [abort] = s.state.take_commands()
    with pytest.raises(StepError, match="do not extend"):
        s.state.aborted(abort.id, {r.request_id: Partial(5, 0, [1, 2, 3, 4, 5], [0.0] * 5)}, 0.2)


# ---- every instance gone -----------------------------------------------------------------------------

def test_when_every_instance_dies_after_the_hand_off_the_reserved_workers_take_the_work_back():
    s = step(n_groups=2, n=4, length=30, seed_window_s=0.0)
    s.reserved("r0", max_running=8)
    s.join("p0", max_running=8)
    s.decide(0.0)
    s.answer_all()
    s.decide(0.0)
    assert s.released_at == 0.0 and not s.workers["r0"].requests
    s.generate("p0", 9)
    s.kill("p0")
    back = submitted(s.decide(0.5))
    assert set(back) == {"r0"} and len(back["r0"]) == 8 and s.state.stats.fallback
    s.run_to_end()
    s.assert_exact()


def test_with_no_worker_left_the_step_fails_naming_every_death():
    s = step(seed_window_s=None)
    s.reserved("r0")
    s.join("p0")
    s.decide(0.0)
    s.kill("p0", "its Ray node left the cluster")
    s.kill("r0", "no sign of life for 15.0s")
    with pytest.raises(StepError, match="p0: its Ray node left the cluster; r0: no sign of life"):
        s.decide(0.1)



def test_a_dead_reserved_worker_being_replaced_holds_the_step_until_its_replacement_serves():
    """Issue 26 item 6: the only worker, reserved, dies mid-step; the fleet boots a replacement
    (`replacing(1)`), and the step waits for it instead of failing, then ends exactly."""
    s = step(seed_window_s=None)
    s.reserved("r0", max_running=8)
    s.decide(0.0)
    s.generate("r0", 5)  # 4 streamed, 1 generated and lost with it
    s.kill("r0")
    s.state.replacing(1)
    assert not submitted(s.decide(0.1)) and len(s.state.pending) == 8  # nobody to run them, nothing failed
    s.join("r1", RESERVED, max_running=8, serving=False, pulling_since=0.2)
    s.state.replacing(0)
    assert not submitted(s.decide(0.3))  # still pulling the step's version
    s.state.ready("r1", 0.4, pull_s=0.2)
    back = submitted(s.decide(0.4))
    assert len(back["r1"]) == 8
    held = {r.uid: r.held for c in s.submits[-1:] for r in c.requests}
    assert set(held.values()) == {4}  # every sample continues from its last streamed token
    s.run_to_end()
    s.assert_exact()
    assert s.state.stats.wasted_tokens == 8 and s.state.stats.preemptions == 0


def test_a_replacement_that_cannot_start_fails_the_step_naming_why():
    s = step(seed_window_s=None)
    s.reserved("r0")
    s.decide(0.0)
    s.kill("r0", "its process exited")
    s.state.replacing(1)
    s.decide(0.1)
    s.state.replacing(0, failed="rollout worker rese-2 (reserved) failed to start: out of memory")
    with pytest.raises(StepError, match="r0: its process exited; a reserved worker's replacement: rollout worker "
                                        "rese-2 .* out of memory"):
        s.decide(0.2)


def test_a_reserved_replacement_joining_after_the_hand_off_takes_no_work_and_sleeps():
    """After the seeding hand-off the reserved resources are the trainer's: a replacement that comes to
    serve then gets no samples (while an instance serves) and frees its memory."""
    s = step(n_groups=2, n=4, length=40, seed_window_s=1.0)
    s.reserved("r0", max_running=8)
    s.join("p0", max_running=8)
    s.decide(0.0)
    s.answer_all()
    s.decide(1.0)
    s.answer_all()
    s.decide(1.0)
    assert s.released_at == 1.0
    s.kill("r0")
    s.state.replacing(1)
    s.join("r1", RESERVED, max_running=8, serving=False, pulling_since=1.1)
    s.state.replacing(0)
    s.state.ready("r1", 1.5, pull_s=0.4)
    commands = s.decide(1.5)
    [sleep] = [c for c in commands if isinstance(c, Abort)]
    assert sleep.worker == "r1" and sleep.request_ids == [] and sleep.then_sleep
    assert "r1" not in submitted(commands)
    s.run_to_end()
    s.assert_exact()
    assert s.state.stats.tokens_by_worker["r1"] == 0

# ---- notices and releases ----------------------------------------------------------------------------

def test_a_notice_takes_every_sample_back_exactly_and_the_kill_that_follows_wastes_nothing():
    s = step(n_groups=1, n=4, length=30, seed_window_s=None)
    s.join("p0")
    s.join("p1")
    s.decide(0.0)
    s.generate("p0", 6)
    s.state.notice("p0", 0.1)
    s.execute(s.state.take_commands())
    [abort] = s.aborts
    assert abort.reason == "noticed" and abort.worker == "p0"
    s.answer(abort)
    s.kill("p0")
    assert s.state.stats.wasted_tokens == 0 and s.state.stats.migrated["noticed"] == 2
    assert "p0" not in submitted(s.decide(0.2))
    s.run_to_end()
    s.assert_exact()


def noticed_with_a_deadline(keep: bool = True, history_extra: int = 50, observe: bool = True):
    """Two instances with two samples each; p0 has made 6 tokens of each at 10 tokens/s per sample and
    gets a notice of its kill 5 s later (margin 1 s). The history expects its first sample's true
    length (about 24 tokens left: 2.4 s) and the second `history_extra` tokens longer."""
    lengths = {"0:0": 30, "0:1": 31, "0:2": 32, "0:3": 33}
    first = {}
    s = Script(lengths, {uid: 0 for uid in lengths}, seed_window_s=None,
               config=StepConfig(notice_keep=keep, notice_margin_s=1.0),
               expected=lambda uid: lengths[uid] + (history_extra if uid == first.get("long") else 0))
    s.join("p0", max_running=2)
    s.join("p1", max_running=2)
    on_p0 = sorted(submitted(s.decide(0.0))["p0"])
    first["short"], first["long"] = on_p0
    s.generate("p0", 6)
    if observe:
        s.state.observe("p0", 2, 20.0)
    s.state.notice("p0", 0.1, deadline=5.1)
    s.execute(s.state.take_commands())
    return s, first


def test_a_notice_with_a_deadline_leaves_the_samples_expected_to_finish_before_it():
    s, first = noticed_with_a_deadline()
    [abort] = s.aborts
    assert abort.worker == "p0" and [s.state.tracked[uid].request_id for uid in (first["long"],)] == abort.request_ids
    assert s.state.stats.kept_through_notice == 1 and s.state.next_deadline() == pytest.approx(4.1)
    s.answer(abort)
    assert "p0" not in submitted(s.decide(0.2))  # noticed: it gets nothing new
    s.generate("p0", 100)  # the kept sample finishes on the instance, before its kill
    assert not [c for c in s.decide(4.1) if isinstance(c, Abort)]  # nothing left to take back
    assert s.state.next_deadline() is None
    s.kill("p0")
    assert s.state.stats.wasted_tokens == 0 and s.state.stats.migrated["noticed"] == 1
    s.run_to_end()
    s.assert_exact()


def test_what_a_noticed_instance_kept_and_did_not_finish_is_taken_back_before_its_kill():
    s, first = noticed_with_a_deadline()
    s.answer(s.aborts[0])
    s.generate("p0", 4)  # slower than its measured speed: not done when the margin before the kill comes
    assert not [c for c in s.decide(4.0) if isinstance(c, Abort)]
    [late] = [c for c in s.decide(4.1) if isinstance(c, Abort)]
    assert late.worker == "p0" and late.reason == "noticed"
    assert late.request_ids == [s.state.tracked[first["short"]].request_id]
    s.answer(late)
    s.kill("p0")
    assert s.state.stats.wasted_tokens == 0 and s.state.stats.migrated["noticed"] == 2
    s.run_to_end()
    s.assert_exact()


@pytest.mark.parametrize("why", ["the rule is off", "no speed measured"])
def test_without_the_rule_or_a_measured_speed_a_notice_takes_everything_back_at_once(why):
    s, _ = noticed_with_a_deadline(keep=why != "the rule is off", observe=why != "no speed measured")
    [abort] = s.aborts
    assert len(abort.request_ids) == 2 and s.state.stats.kept_through_notice == 0
    assert s.state.next_deadline() is None


def test_a_release_takes_the_samples_back_then_retires_the_worker():
    s = step(n_groups=1, n=4, length=30, seed_window_s=None)
    s.join("p0")
    s.join("p1")
    s.decide(0.0)
    s.generate("p0", 5)
    s.state.retire("p0", 0.1)
    s.execute(s.state.take_commands())
    assert not s.retired  # not before its samples are back
    s.answer()
    s.execute(s.state.take_commands())
    assert s.retired == ["p0"]
    s.state.dead("p0", "released", 0.2, released=True)
    assert s.state.stats.preemptions == 0 and s.state.stats.migrated["released"] == 2
    s.run_to_end()
    s.assert_exact()


# ---- balancing ---------------------------------------------------------------------------------------

def test_an_idle_worker_gets_the_executing_samples_with_the_fewest_tokens():
    s = step(n_groups=1, n=6, length=200, seed_window_s=None)
    s.join("p0", max_running=8)
    s.decide(0.0)
    s.state.workers["p0"].profile.observe(2, 100.0)  # p0 plateaus at 2 samples
    s.state.workers["p0"].profile.observe(6, 100.0)
    for i, r in enumerate(sorted(s.workers["p0"].requests.values(), key=lambda r: r.uid)):
        s.generate("p0", 10 + 8 * i, only={r.uid})
    s.join("p1", max_running=8)
    [abort] = [c for c in s.decide(0.1) if isinstance(c, Abort)]
    assert abort.reason == "rebalanced" and len(abort.request_ids) == 4  # beyond B = 2
    assert [rid.split("#")[0] for rid in abort.request_ids] == ["0:0", "0:1", "0:2", "0:3"]  # the fewest tokens
    s.answer(abort)
    assert sorted(submitted(s.decide(0.1))["p1"]) == ["0:0", "0:1", "0:2", "0:3"]
    assert s.state.stats.migrated["rebalanced"] == 4


def test_samples_running_far_past_their_history_move_first():
    s = step(n_groups=1, n=6, length=200, seed_window_s=None, overruns=lambda progress: ["0:5", "0:4"])
    s.join("p0", max_running=8)
    s.decide(0.0)
    s.state.workers["p0"].profile.observe(4, 100.0)
    s.join("p1", max_running=8)
    [abort] = [c for c in s.decide(0.1) if isinstance(c, Abort)]
    assert [rid.split("#")[0] for rid in abort.request_ids] == ["0:5", "0:4"]
    assert s.state.stats.overruns_moved == 2


# ---- groups and timings ------------------------------------------------------------------------------

def test_a_group_is_handed_out_once_when_its_last_sample_finishes():
    s = step(n_groups=3, n=2, length=10, seed_window_s=None)
    s.join("p0", max_running=8)
    s.decide(0.0)
    s.generate("p0", 20, only={"1:0", "1:1", "2:0"})  # finishes them (lengths 10-14)
    assert [c.group for c in s.decide(0.1) if isinstance(c, GroupDone)] == [1]
    s.run_to_end()
    s.assert_exact()
    assert sorted(s.groups_done) == [0, 1, 2] and len(s.groups_done) == 3


def test_the_timings_are_final_when_the_last_group_is_handed_out():
    s = step(n_groups=1, n=2, length=8, seed_window_s=0.0)
    s.reserved("r0")
    s.join("p0")
    s.join("p1")
    s.decide(0.0)
    s.answer_all()
    s.decide(0.0)
    s.now = 2.0
    s.generate("p0", 20)
    s.now = 3.0
    s.generate("p1", 20)
    assert s.state.done and not s.groups_done  # done, and the group not handed out yet...
    stats = s.state.stats
    assert (stats.rollout_s, stats.tail_s, stats.remote_start_s) == (3.0, 1.0, 0.0)  # ...with the timings set
    s.decide(3.0)
    assert s.groups_done == [0]
    assert s.state.remote_timings(end=5.0) == (3.0, 2.0)


def test_remote_timings_are_zero_when_no_instance_generated():
    s = step(n_groups=1, n=2, length=8, seed_window_s=None)
    s.reserved("r0")
    s.decide(0.0)
    s.run_to_end()
    assert s.state.remote_timings(end=s.now + 5) == (0.0, 0.0)
    with pytest.raises(StepError, match="has not finished"):
        step().state.remote_timings(end=1.0)


# ---- the gates and random scripts --------------------------------------------------------------------

class Ungated(StepState):
    """The same state machine asking the dispatcher and the balancer at every decision."""

    def decide(self, now: float):
        self._dispatch_idle_at = self._balanced_at = self._unbalanceable_at = None
        self._incoming_cache = None
        return super().decide(now)


def random_script(seed: int, state_class=StepState, batched: bool = False) -> Script:
    rng = random.Random(seed)
    lengths = {f"{g}:{j}": rng.randint(1, 40) for g in range(rng.randint(2, 5)) for j in range(rng.randint(1, 4))}
    s = Script(lengths, {uid: int(uid.split(":")[0]) for uid in lengths}, interval=rng.choice([1, 3, 4]),
               seed_window_s=rng.choice([None, 0.0, 0.3]), max_pending=rng.randint(0, 2), longest_pull_s=0.2,
               batched=batched)
    if state_class is not StepState:  # the same inputs, another class
        s.state.__class__ = state_class
    s.reserved("r0", max_running=rng.randint(2, 6))
    return s


def play(s: Script, seed: int) -> list:
    """Random events at random moments (joins, pulls, kills, notices, releases, profiles, late answers);
    returns every command issued, in order."""
    rng = random.Random(seed)
    log = []
    names = iter(f"p{i}" for i in range(100))
    for tick in range(3000):
        t = tick * 0.01
        if s.state.done:
            break
        roll = rng.random()
        live = [n for n, w in s.state.workers.items() if w.alive and n != "r0"]
        if roll < 0.03:
            s.join(next(names), max_running=rng.randint(1, 5), serving=rng.random() < 0.5, pulling_since=t)
        elif roll < 0.05 and live:
            victim = rng.choice(live)
            if s.state.workers[victim].status.name == "PULLING":
                s.state.ready(victim, t, pull_s=0.1)
            else:
                s.kill(victim, f"killed at {t:.2f}")
        elif roll < 0.06 and live:
            s.state.notice(rng.choice(live), t)
        elif roll < 0.065 and live:
            s.state.retire(rng.choice(live), t)
        elif roll < 0.08 and live:
            s.state.workers[rng.choice(live)].profile.observe(rng.randint(1, 5), rng.uniform(10, 100))
        if s.aborts and rng.random() < 0.5:
            s.answer(rng.choice(s.aborts))  # answers arrive in any order
        for name in list(s.workers):
            w = s.state.workers[name]
            if w.alive and rng.random() < 0.7:
                s.generate(name, rng.randint(1, 3))
        for r in s.retired:
            s.state.dead(r, "released", t, released=True)
        s.retired.clear()
        log.append((t, s.decide(t)))
    s.answer_all()
    s.run_to_end()
    return log


@pytest.mark.parametrize("seed", range(40))
def test_random_scripts_finish_every_sample_exactly_once_with_exact_tokens_and_bounded_waste(seed):
    s = random_script(seed)
    play(s, seed)
    s.assert_exact()
    stats = s.state.stats
    assert stats.wasted_tokens <= s.interval * stats.in_flight_at_preemption
    assert sum(s.state.tracked[uid].migrations for uid in s.lengths) >= stats.migrated["preempted"]


@pytest.mark.parametrize("seed", range(25))
def test_the_gated_decisions_are_the_ungated_ones(seed):
    gated, ungated = random_script(seed), random_script(seed, Ungated)
    assert play(gated, seed) == play(ungated, seed)
    gated.assert_exact()


@pytest.mark.parametrize("seed", range(25))
def test_a_reports_chunks_at_once_are_the_same_events_as_one_by_one(seed):
    # The runtime hands the state a report's chunks in one `chunks` call, the simulator each in a
    # `chunk` call: through kills, notices, late aborts and finishes inside a report, the same commands,
    # the same tokens and the same counters.
    one_by_one, reports = random_script(seed), random_script(seed, batched=True)
    assert play(one_by_one, seed) == play(reports, seed)
    reports.assert_exact()
    assert reports.state.stats == one_by_one.state.stats
    assert ({n: w.tokens for n, w in reports.state.workers.items()}
            == {n: w.tokens for n, w in one_by_one.state.workers.items()})


def test_a_fenced_workers_report_is_counted_and_dropped_whole():
    s = Script({"a": 12, "b": 12}, {"a": 0, "b": 0}, interval=4, seed_window_s=None, batched=True)
    s.join("p0")
    s.decide()
    s.generate("p0", 4)
    assert s.state.tracked["a"].tokens == s.state.tracked["b"].tokens == 4
    running = list(s.workers["p0"].requests)
    s.kill("p0")
    before = s.state.stats.fenced_tokens_dropped
    s.state.chunks("p0", ChunkColumns.of(StreamChunk(rid, [5] * 4, [-0.1] * 4, 4, False, None, 0) for rid in running),
                   1.0)
    assert s.state.stats.fenced_tokens_dropped - before == 8
    assert s.state.tracked["a"].tokens == s.state.tracked["b"].tokens == 4


def test_the_simulator_and_the_runtime_decide_nothing_of_their_own():
    # Dispatch, balancing and the choice of samples live in StepState only: its two shells never call
    # the policies that make those decisions.
    import ast
    import pathlib

    import rlboost

    root = pathlib.Path(rlboost.__file__).parent
    for shell in ("sim/cluster.py", "hybrid/step_run.py", "hybrid/manager.py"):
        tree = ast.parse((root / shell).read_text())
        called = {node.func.attr for node in ast.walk(tree)
                  if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)}
        assert not called & {"assign", "rebalance", "may_move", "flag_overruns"}, shell
