"""The step boundary as a value: the offload loop between steps (one for the runtime and the simulator),
the sample ledger's checks, the worker table's membership events, and the step's report and metrics.
All pure or Ray-free: fake handles stand in for workers (no actor is ever called)."""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path

import pytest

import rlboost
from rlboost.hybrid.handles import PREEMPTIBLE, RESERVED, WorkerHandle, WorkerState
from rlboost.hybrid.pulls import PullStats
from rlboost.hybrid.step_report import StepReport, step_metrics
from rlboost.hybrid.worker_table import WorkerTable
from rlboost.policies.offload import OffloadConfig, OffloadController
from rlboost.policies.offload_loop import OffloadLoop, StepOutcome, step_timings
from rlboost.rollout.sample import Sample
from rlboost.rollout.sample_ledger import SampleLedger
from rlboost.rollout.step_data import Partial, StepError, StepStats

ROOT = Path(rlboost.__file__).parent


def outcome(**kw) -> StepOutcome:
    values = dict(instances_start=2, instances_end=2, preemptions=0, wall_s=10.0, train_s=4.0, wait_train_s=1.0,
                  remote_s=6.0, wait_remote_s=3.0, samples=8, response_tokens=400, instance_s=20.0)
    return StepOutcome(**(values | kw))


# ---- the offload loop ---------------------------------------------------------------------------------

def test_the_step_timings_are_derived_in_one_place():
    t = step_timings(outcome(provision_s=(1.0, 3.0), measured={"tokens": 400}))
    assert t.stable and t.instances == 2 and t.tokens_per_s == pytest.approx(40.0)
    assert t.provision_s == pytest.approx(2.0) and t.tokens == 400 and t.instance_s == 20.0
    assert math.isnan(step_timings(outcome()).provision_s)  # no instance became ready
    assert not step_timings(outcome(instances_end=3)).stable  # one joined
    assert not step_timings(outcome(preemptions=1)).stable  # one was replaced


def test_the_loop_plans_a_step_and_learns_from_it_as_the_controller_does():
    cfg = OffloadConfig(objective="throughput")
    loop = OffloadLoop(OffloadController(cfg, initial_seed_s=5.0, num_reserved=1))
    twin = OffloadController(cfg, initial_seed_s=5.0, num_reserved=1)
    plan = loop.begin(2)
    assert plan.seed_window_s == twin.seed_for(2) == 5.0 and plan.outlook == twin.outlook()
    cap = loop.end(outcome())
    twin.update(step_timings(outcome()))
    assert cap == twin.instance_cap() == loop.cap and cap is not None
    assert loop.begin(2).seed_window_s == twin.seed_for(2) == pytest.approx(5.0 + (1.0 - 3.0) / 2)


@pytest.mark.parametrize("call", [".seed_for(", ".instance_cap(", "controller.update("])
def test_only_the_offload_loop_drives_the_controller_between_steps(call):
    # the runtime (hybrid), the simulator and the benches all go through OffloadLoop: the loop between
    # steps is written once
    callers = sorted(str(p.relative_to(ROOT)) for unit in ("hybrid", "sim", "bench")
                     for p in (ROOT / unit).rglob("*.py") if call in p.read_text())
    assert callers == [], callers


# ---- the sample ledger --------------------------------------------------------------------------------

def ledger(version=3) -> tuple[SampleLedger, Sample]:
    sample = Sample(uid="u", prompt_ids=[1, 2], seed=0)
    return SampleLedger([("u", 0, sample)], version), sample


def test_the_ledger_continues_a_sample_from_the_tokens_it_holds():
    book, sample = ledger()
    request = book.start("u", "w0")
    track = book.attempt(request.request_id, "w0")
    book.check_chunk(track, 0, 3)
    book.accept(track, 2, 3, [7, 8], [-0.1, -0.2])
    assert book.check_partial(track, Partial(3, 3, [7, 8, 9], [-0.1, -0.2, -0.3])) == 1
    book.requeue(track)
    assert book.attempt(request.request_id, "w0") is None  # stale from now on
    again = book.start("u", "w1")
    assert again.held == 2 and again.request_id == "u#2"
    assert book.finish(book.attempt(again.request_id, "w1"), "stop") and book.all_finished
    assert sample.finish_reason == "stop" and sample.versions == [3, 3]


def test_the_ledger_refuses_what_breaks_an_invariant():
    book, _ = ledger()
    track = book.attempt(book.start("u", "w0").request_id, "w0")
    with pytest.raises(StepError, match="weight version 2"):
        book.check_chunk(track, 0, 2)  # on-policy
    with pytest.raises(StepError, match="a gap or a duplicate"):
        book.check_chunk(track, 1, 3)  # exactly once
    book.accept(track, 2, 3, [7, 8], [-0.1, -0.2])
    with pytest.raises(StepError, match="do not extend"):
        book.check_partial(track, Partial(3, 3, [7, 5, 9], [0.0] * 3))  # exact continuation
    with pytest.raises(StepError, match="returned 1 tokens but 2"):
        book.check_partial(track, Partial(1, 3))
    with pytest.raises(StepError, match="without their ids"):
        book.accept(track, 1, 3, None, None)


def test_a_recomputed_sample_forgets_its_tokens():
    book, sample = ledger()
    book.pending.clear()  # dispatched
    track = book.attempt(book.start("u", "w0").request_id, "w0")
    book.accept(track, 2, 3, [7, 8], [-0.1, -0.2])
    book.requeue(track, forget_tokens=True)
    assert track.tokens == 0 and sample.response_ids == [] and list(book.pending) == ["u"]


# ---- the worker table ---------------------------------------------------------------------------------

class Recorder:
    def __init__(self):
        self.events = []

    def joined(self, h, now):
        self.events.append(("joined", h.name))

    def ready(self, h, pull_s, now):
        self.events.append(("ready", h.name))

    def noticed(self, h, now, deadline):
        self.events.append(("noticed", h.name, deadline))

    def retiring(self, h, now):
        self.events.append(("retiring", h.name))

    def dying(self, h, now):
        self.events.append(("dying", h.name, h.alive))  # still alive: what it sent counts

    def died(self, h, reason, cause, now):
        self.events.append(("died", h.name, reason, cause, h.alive))


def handle(name, kind=PREEMPTIBLE) -> WorkerHandle:
    return WorkerHandle(name, kind, actor=None, pid=0, node_id="", max_running=4, streaming=True)


def test_the_table_tells_its_one_listener_of_every_membership_change():
    table, listener = WorkerTable(), Recorder()
    table.listen(listener)
    for name in ("a", "b", "c"):
        table.admit(handle(name))
    table.notice("a", 5.0)
    table.release("b")
    table.causes["c"] = "preempted by the trace"
    table.fence("c", "test")
    table.apply_inbox(1.0)
    # the notice's seconds become its deadline, on the clock of the turn that applies it
    assert listener.events == [("joined", "a"), ("joined", "b"), ("joined", "c"), ("noticed", "a", 6.0),
                               ("retiring", "b"), ("dying", "c", True), ("died", "c", "test",
                                                                         "preempted by the trace", False)]
    assert table.get("a").state is WorkerState.NOTICED and table.get("b").state is WorkerState.RETIRING
    table.fence("c", "again")  # a dead worker is not declared dead twice
    table.apply_inbox(2.0)
    assert len(listener.events) == 7 and [h.name for h in table.alive()] == ["a", "b"]


def test_between_steps_a_release_ends_the_instance_and_deaths_are_recorded_for_the_next_report():
    table, ended = WorkerTable(), []
    table.on_retire = ended.append
    for h in (handle("p0"), handle("p1"), handle("r0", RESERVED)):
        table.admit(h)
    table.release("p0")
    table.fence("p1", "silent")
    table.fence("r0", "it died")
    table.apply_inbox(1.0)
    assert [h.name for h in ended] == ["p0"]
    # a given-back instance is not a preemption; a lost one is; a reserved worker never counts as one
    assert table.between_steps.take() == [("p0", "released (beyond the instance cap)", False),
                                          ("p1", "silent", True), ("r0", "it died", False)]
    assert table.between_steps.take() == []


# ---- the step's report and its metrics ---------------------------------------------------------------

def test_the_metrics_are_read_from_the_report_alone():
    stats = StepStats(preemptions=1, wasted_tokens=3, rollout_s=7.0, seed_s=2.0,
                      tokens_by_kind=Counter({RESERVED: 100, PREEMPTIBLE: 300}))
    stats.migrated["preempted"] = 4
    report = StepReport(stats=stats, samples=8, response_tokens=400, t0=0.0, released_s=2.0, trainer_wait_s=1.0,
                        remote_s=6.0, wait_remote_s=3.0, loop_cpu_s=0.5, relay_cpu_s=0.25, reports=10,
                        pulls=PullStats(pulls=[("p0", 1.0, 10, "full"), ("p1", 3.0, 4, "patch")], provision_s=[4.0]),
                        deaths_between_steps=(("p2", "lost", True), ("p3", "released", False)))
    assert report.preemptions == 2  # one in the step, one between steps
    m = step_metrics(report, outcome(preemptions=report.preemptions), seed_window_s=2.0, cap=3,
                     preemption_rate=0.1, weight_bytes=1000, reserved_tokens_per_s=50.0)
    assert m["spot/cap"] == 3.0 and m["spot/preemptions"] == 2.0 and m["spot/joins"] == 1.0
    assert m["migration/preempted"] == 4.0 and m["migration/wasted_tokens"] == 3.0
    assert m["weights/pull_s"] == 2.0 and m["rollout/preemptible_token_share"] == 0.75
    assert m["weights/pulled_bytes"] == 14.0 and m["weights/full_pulls"] == 1.0 and m["weights/patch_pulls"] == 1.0
    assert m["weights/from_base_pulls"] == 0.0
    assert m["timing_s/gen"] == 7.0 and m["timing_s/update_actor"] == 4.0 and m["timing_s/wait_train"] == 1.0
    assert "spot/cap" not in step_metrics(report, outcome(), seed_window_s=2.0, cap=None, preemption_rate=0.0,
                                          weight_bytes=0, reserved_tokens_per_s=0.0)
    advised = step_metrics(report, outcome(), seed_window_s=2.0, cap=None, preemption_rate=0.0, weight_bytes=0,
                           reserved_tokens_per_s=0.0, advised_cap=0)  # a cap not enforced (the showcase)
    assert advised["spot/cap_advised"] == 0.0 and "spot/cap" not in advised and "spot/cap_advised" not in m


# ---- who owns the workers during a step ---------------------------------------------------------------

@pytest.mark.parametrize("where", ["after the loop took the workers", "before the loop took them"])
def test_a_stop_landing_in_start_step_leaves_the_workers_owned_once_and_released_once(where, monkeypatch):
    """A stop signal raises in the driver wherever it is, here inside `start_step`, once the loop thread
    has started. The loop alone takes the table's `owner` and releases it once, however the step ends:
    the driver's unwinding never releases it under the loop (the "release unlocked lock" traceback of a
    Ctrl-C), and `cancel_step` finds and ends the step the driver never got back."""
    import threading

    from rlboost.cluster.config import WeightsConfig
    from rlboost.engine.sampling_params import SamplingParams
    from rlboost.hybrid.config import HybridConfig
    from rlboost.hybrid.manager import RolloutManager
    from rlboost.hybrid.step_run import StepRun
    from rlboost.rollout import new_groups
    from rlboost.stopping import StopRequested

    class Row:
        data_source, ground_truth, extra_info = "test", None, {}

    errors = []
    monkeypatch.setattr(threading, "excepthook", lambda args: errors.append(args.exc_value))
    start = StepRun.start

    def interrupted(run):
        if where == "before the loop took them":
            run.table.owner.acquire()  # the driver's last call between steps still holds it
            run.thread.start()
            run.table.owner.release()
        else:
            start(run)
        raise StopRequested(2)  # the signal lands before start_step returns

    monkeypatch.setattr(StepRun, "start", interrupted)
    manager = RolloutManager(HybridConfig(), WeightsConfig())
    manager.table.replacing = 1  # no worker, a reserved one booting: the step waits for it (with none coming
    # it would fail at once, racing the cancel below for what `groups()` raises)
    with pytest.raises(StopRequested):
        manager.start_step(new_groups(1, [(0, [5, 6], Row())], 2, run_seed=0), SamplingParams(), 0, None)
    run = manager.current
    assert run is not None and run.thread.is_alive()
    manager.cancel_step()  # what a stop's cleanup does
    assert not run.thread.is_alive() and manager.current is None
    assert errors == []  # no thread died releasing a lock it did not hold
    assert manager.table.owner.acquire(blocking=False)  # released, and only once
    manager.table.owner.release()
    with pytest.raises(RuntimeError, match="rollout cancelled"):
        list(run.groups())


# ---- the next batch in a step's tail --------------------------------------------------------------------

def test_in_a_step_s_tail_the_runtime_counts_a_kv_cache_that_binds_before_its_sequences():
    """`StepRun._limit_successor` gives the batch ahead, on each worker, what `ahead_slots` leaves it: on a
    worker whose engine reports its KV cache in tokens (vLLM's blocks), the step's samples there counted
    at prompt + max_tokens; on one that reports none (the CPU engine), the sequences left free."""
    from rlboost.cluster.config import WeightsConfig
    from rlboost.engine.sampling_params import SamplingParams
    from rlboost.hybrid.config import HybridConfig
    from rlboost.hybrid.manager import RolloutManager
    from rlboost.policies.tail_share import ahead_slots
    from rlboost.rollout import new_groups

    class Row:
        data_source, ground_truth, extra_info = "test", None, {}

    manager = RolloutManager(HybridConfig(), WeightsConfig())
    params = SamplingParams(max_tokens=1000)
    run = manager.make_step(new_groups(0, [(0, [5] * 100, Row())], 8, run_seed=0), params, 0, None)
    succ = manager.make_step(new_groups(1, [(1, [5] * 60, Row())], 8, run_seed=0), params, 1, None, ahead=True)
    bounded = WorkerHandle("p0", PREEMPTIBLE, None, 0, "", max_running=16, version=0, kv_tokens=10_000)
    unbounded = WorkerHandle("p1", PREEMPTIBLE, None, 0, "", max_running=16, version=0)
    for h in (bounded, unbounded):
        h.state = WorkerState.SERVING
        manager.table.admit(h)
        run.joined(h, 0.0)
    run.state.decide(0.0)  # the step's 8 samples go to the two workers
    held = {name: run.state.holding(name) for name in ("p0", "p1")}
    assert held["p0"] > 0 and held["p1"] > 0
    run.successor = succ
    for h in (bounded, unbounded):
        succ.joined(h, 0.0)
    run._limit_successor()
    # nothing finished yet: the batch ahead's samples too are counted at their longest (60 + 1,000 tokens)
    assert succ.state.workers["p0"].slots == ahead_slots(16, held["p0"], 10_000, 1100, 1060) < 16 - held["p0"]
    assert succ.state.workers["p1"].slots == 16 - held["p1"]
