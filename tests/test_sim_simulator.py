"""The simulator of whole runs: the veRL calibration, the colocated fallback, conservation of samples
and tokens, the trace and the cap, bounded waste, notices, the controller's convergence, the real
policy objects, determinism and speed."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import pytest

from rlboost.policies.balance import Balancer
from rlboost.policies.dispatch import JSQDispatcher
from rlboost.policies.histopipe import HistoPipe
from rlboost.policies.offload import OffloadController
from rlboost.policies.profile import ThroughputProfile
from rlboost.rollout.step_state import StepState
from rlboost.sim.baselines import CALIBRATION_TARGET, colocated_run, colocated_step
from rlboost.sim.profile import ProfileConfig, make_profiles
from rlboost.sim.simulator import POLICIES, SimConfig, disagg_splits, offered_instances, simulate
from rlboost.sim.workload import Workload, WorkloadConfig
from rlboost.spot.cost import CostMeter
from rlboost.spot.trace import TraceConfig, TraceReplay, load_trace

RESERVED_USD_PER_S = 83.79 / 3600


def trace_file(tmp_path, rows: str, name: str = "trace.csv") -> TraceConfig:
    """A trace of one's own, replayed as written (no sampling, real time)."""
    path = tmp_path / name
    path.write_text("time_s,available_instances\n" + rows.strip() + "\n")
    return TraceConfig(path=str(path), sample=1.0, time_scale=1.0)


# --- the baselines --------------------------------------------------------------------------------


def test_verl_reproduces_the_calibration():
    r = simulate(SimConfig(policy="verl"))
    reference = colocated_run("qwen3-8b", steps=len(r.steps))
    assert r.throughput_tokens_per_s == pytest.approx(reference["tokens_per_s"], rel=0.02)
    assert r.throughput_tokens_per_s == pytest.approx(CALIBRATION_TARGET, rel=0.03)
    assert r.wall_s >= 7200 > r.steps[-1].start_s  # the whole segment, no partial step
    assert r.cost_usd == pytest.approx(RESERVED_USD_PER_S * r.wall_s)
    assert r.instance_seconds == 0 and r.preemptions == 0 and r.migrations == 0
    double = simulate(SimConfig(policy="verl2x"))
    assert r.throughput_tokens_per_s < double.throughput_tokens_per_s < 2 * r.throughput_tokens_per_s
    assert double.cost_usd == pytest.approx(2 * RESERVED_USD_PER_S * double.wall_s)


def test_disagg_splits_the_node_and_keeps_the_best_split():
    splits = disagg_splits(SimConfig())
    assert splits == [2, 4, 6]  # whole tp=2 engines
    tp1 = SimConfig(profile=ProfileConfig(tp={"qwen3-8b": 1}))
    assert disagg_splits(tp1) == [1, 2, 3, 4, 5, 6, 7]
    short = dict(policy="disagg", duration_s=1200)
    best = simulate(SimConfig(**short))
    assert best.rollout_gpus in splits and best.train_gpus == 8 - best.rollout_gpus
    assert best.instance_seconds == 0 and best.cost_usd == pytest.approx(RESERVED_USD_PER_S * best.wall_s)
    for r in (2, 6):  # the extremes starve one side
        assert simulate(SimConfig(rollout_gpus=r, **short)).throughput_tokens_per_s < best.throughput_tokens_per_s
    with pytest.raises(ValueError, match="rollout_gpus"):
        simulate(SimConfig(rollout_gpus=8, **short))


def test_zero_instances_is_the_colocated_fallback(tmp_path):
    zeros = trace_file(tmp_path, "0,0\n3000,0")
    r = simulate(SimConfig(policy="rlboost", trace=zeros, duration_s=2000))
    verl = simulate(SimConfig(policy="verl", duration_s=2000))
    assert r.migrations == 0 and r.instance_seconds == 0 and r.preemptions == 0
    assert r.timeline == [(0.0, 0)]
    assert r.cost_usd == pytest.approx(RESERVED_USD_PER_S * r.wall_s)
    engine, train = make_profiles("qwen3-8b")
    work = Workload(WorkloadConfig())
    for s in r.steps:  # the reserved engines generate everything, then train
        assert s.reserved_rollout_s == s.rollout_s and s.wait_train_s == 0 and s.wasted_tokens == 0
        # the manager deals samples one by one (JSQ), which is veRL's step with round-robin dispatch
        lengths = [n for group in work.step(s.step) for n in group]
        dealt = colocated_step(engine, train, lengths, 512, engines=4, gpus=8, dispatch="round_robin")
        assert s.end_s - s.start_s == pytest.approx(dealt["step_s"] + train.weight_sync_s(200.0), rel=1e-6)
    # veRL's SPMD rollout gives each engine a contiguous chunk of prompts, whose lengths correlate
    assert 1.0 < r.throughput_tokens_per_s / verl.throughput_tokens_per_s < 1.15


def test_an_instance_too_small_for_one_engine_is_never_rented():
    cfg = SimConfig(model="qwen3-14b", gpus_per_instance=1, duration_s=1500)  # 14B needs tp=2
    r = simulate(cfg)
    assert r.timeline == [(0.0, 0)] and r.instance_seconds == 0 and r.migrations == 0


# --- invariants -----------------------------------------------------------------------------------


@pytest.mark.parametrize("migration", ["token", "recompute"])
def test_every_sample_finishes_exactly_once_and_tokens_are_conserved(monkeypatch, migration):
    finishes: Counter = Counter()
    original = StepState._finish

    def spy(self, track, worker, reason):
        finishes[(self.version, track.uid)] += 1
        return original(self, track, worker, reason)

    monkeypatch.setattr(StepState, "_finish", spy)
    cfg = SimConfig(segment="B", migration=migration, duration_s=3000)  # B loses instances at 2280-2760 s
    r = simulate(cfg)
    assert r.preemptions > 0 and sum(s.in_flight_at_preemption for s in r.steps) > 0
    work = Workload(cfg.workload)
    per_step = cfg.workload.prompts_per_step * cfg.workload.samples_per_prompt
    assert set(finishes.values()) == {1}
    assert Counter(k for k, _ in finishes) == {s.step: per_step for s in r.steps}
    for s in r.steps:
        assert s.tokens_trained == sum(map(sum, work.step(s.step)))
        assert s.tokens_generated == s.tokens_trained + s.wasted_tokens + s.recomputed_tokens
    assert r.tokens_generated == r.tokens + r.wasted_tokens + r.recomputed_tokens
    assert (r.recomputed_tokens > 0) == (migration == "recompute")


def test_instances_never_exceed_the_cap_or_the_trace():
    cfg = SimConfig(model="qwen3-14b", segment="C")  # 14B: the controller's cap binds below the trace
    r = simulate(cfg)
    trace = load_trace(replace(cfg.trace, segment="C"))
    caps = r.caps
    assert any(cap is not None and cap < trace.available_at(t) for t, cap in caps)  # the cap did bind
    for t, live in r.timeline:
        assert live <= trace.available_at(t)
        in_force = [cap for tc, cap in caps if tc <= t]
        if in_force and in_force[-1] is not None:
            assert live <= in_force[-1]
    assert r.timeline[-1][1] == 0  # every instance ends with the run
    assert r.instance_seconds == pytest.approx(sum(s.instance_s for s in r.steps))


def test_preemption_waste_is_bounded_with_token_migration_and_larger_with_recompute(tmp_path):
    # Four instances, all killed mid-step at 150 s (they serve from 62.6 s: boot + pull), back at 400 s.
    trace = trace_file(tmp_path, "0,4\n150,0\n400,4\n1000,4")
    runs = {m: simulate(SimConfig(trace=trace, migration=m, duration_s=700)) for m in ("token", "recompute")}
    for r in runs.values():
        assert r.preemptions == 4
        assert r.steps[0].preemptions == 4 and r.steps[0].migrated["preempted"] > 0
    token, recompute = runs["token"], runs["recompute"]
    in_flight = token.steps[0].in_flight_at_preemption
    assert in_flight > 0
    assert 0 < token.wasted_tokens <= token.config.stream_interval * in_flight
    assert token.recomputed_tokens == 0
    lost = recompute.steps[0].wasted_tokens + recompute.steps[0].recomputed_tokens
    assert lost > 10 * recompute.config.stream_interval * recompute.steps[0].in_flight_at_preemption
    assert recompute.tokens_generated > token.tokens_generated
    # Streaming every token loses nothing.
    every_token = simulate(SimConfig(trace=trace, stream_interval=1, duration_s=700))
    assert every_token.preemptions == 4 and every_token.wasted_tokens == 0


def test_notices_reduce_the_waste_to_zero():
    base = SimConfig(segment="A", duration_s=3000)  # A loses instances at 1200-1380 s
    hard = simulate(base)
    noticed = simulate(replace(base, notice_s=30.0))
    assert hard.preemptions > 0 and hard.wasted_tokens > 0
    assert noticed.preemptions > 0 and noticed.wasted_tokens == 0
    assert sum(s.migrated.get("noticed", 0) for s in noticed.steps) > 0
    assert sum(s.migrated.get("preempted", 0) for s in noticed.steps) == 0


def test_t_seed_converges_on_a_stable_trace(tmp_path):
    trace = trace_file(tmp_path, "0,8\n7200,8")
    ends = []
    for start in (200.0, 5.0):  # from far above and from the floor
        r = simulate(SimConfig(trace=trace, initial_seed_s=start))
        seeds = [s.seed_s for s in r.steps]
        assert len(seeds) >= 15 and r.preemptions == 0
        first = max(abs(b - a) for a, b in zip(seeds[:4], seeds[1:4]))
        last = max(abs(b - a) for a, b in zip(seeds[-6:], seeds[-5:]))
        assert last < first / 2
        assert all(s.instances_start == 8 for s in r.steps[1:])
        ends.append(sum(seeds[-5:]) / 5)
    assert abs(ends[0] - ends[1]) < 15  # the same window, whichever side it came from


def test_the_controller_gets_the_papers_timings(monkeypatch):
    # t_wait_remote: the step's end (its last update) minus its last response; t_remote: the last
    # response minus the first work an instance got; t_train: trainer compute; t_wait_train: idle.
    seen = []
    original = OffloadController.update

    def update(self, timings):
        seen.append(timings)
        return original(self, timings)

    monkeypatch.setattr(OffloadController, "update", update)
    r = simulate(SimConfig(segment="A", duration_s=1500))
    train = make_profiles("qwen3-8b")[1]
    sync_s, pull_s = train.weight_sync_s(200.0), train.weight_sync_s(50.0)
    assert len(seen) == len(r.steps) >= 4
    for t, s in zip(seen, r.steps):
        assert s.migrated.get("seed_handoff", 0) > 0
        train_end = s.end_s - sync_s
        assert t.wait_remote_s == pytest.approx(train_end - (s.start_s + s.rollout_s)) == s.wait_remote_s
        # instances got work at the latest at the hand-off, at the earliest once their pull ended
        assert t.remote_s == s.remote_s
        assert s.rollout_s - s.reserved_rollout_s - 1e-9 <= t.remote_s <= s.rollout_s - (pull_s - sync_s) + 1e-9
        assert t.train_s == s.train_s and t.wait_train_s == s.wait_train_s
        assert t.instances == s.instances_start
    # instances that served the previous step pull while the reserved engines sync, and share the
    # step's first dispatch the moment their pull ends
    ready = [(t, s) for t, s in zip(seen[1:], r.steps[1:]) if s.instances_start == s.instances_end]
    assert ready and all(t.remote_s == pytest.approx(s.rollout_s - (pull_s - sync_s)) for t, s in ready)
    cfg = SimConfig().offload  # the artifact's controller settings, not the runtime's CPU-test defaults
    assert (cfg.eta, cfg.min_seed_s, cfg.max_seed_s) == (3.0, 5.0, 3600.0)
    assert all(5.0 <= s.seed_s <= 3600.0 for s in r.steps)


def test_noseed_and_nomemory_ablations():
    short = dict(segment="B", duration_s=3000)
    noseed = simulate(SimConfig(policy="rlboost-noseed", **short))
    assert all(s.seed_s == 0 for s in noseed.steps)
    # only seeding is removed: the controller still caps the instances
    assert all(s.cap is not None for s in noseed.steps)
    assert all(s.migrated.get("seed_handoff", 0) > 0 for s in noseed.steps)
    full = simulate(SimConfig(policy="rlboost", **short))
    nomemory = simulate(SimConfig(policy="rlboost-nomemory", **short))
    assert [s.seed_s for s in full.steps] != [s.seed_s for s in nomemory.steps]
    assert full.steps[0].seed_s == nomemory.steps[0].seed_s == 60.0


# --- the real policy objects ----------------------------------------------------------------------


def test_the_real_policy_objects_decide(monkeypatch):
    calls: Counter = Counter()

    def count(cls, name):
        original = getattr(cls, name)

        def wrapper(self, *args, **kwargs):
            calls[f"{cls.__name__}.{name}"] += 1
            return original(self, *args, **kwargs)

        monkeypatch.setattr(cls, name, wrapper)

    for cls, name in [(JSQDispatcher, "assign"), (Balancer, "rebalance"), (ThroughputProfile, "observe"),
                      (ThroughputProfile, "plateau"), (OffloadController, "seed_for"), (OffloadController, "update"),
                      (HistoPipe, "order"), (HistoPipe, "observe_step"), (TraceReplay, "step"),
                      (CostMeter, "charge_step")]:
        count(cls, name)
    # max_num_seqs 64: the reserved engines cannot take the whole step, so the balancer has moves to make
    r = simulate(SimConfig(duration_s=1500, profile=ProfileConfig(max_num_seqs=64)))
    steps = len(r.steps)
    assert calls["JSQDispatcher.assign"] > steps
    assert calls["Balancer.rebalance"] > 0 and sum(s.migrated.get("rebalanced", 0) for s in r.steps) > 0
    assert calls["ThroughputProfile.observe"] > 1000 and calls["ThroughputProfile.plateau"] > 0
    assert calls["OffloadController.seed_for"] == calls["OffloadController.update"] == steps
    assert calls["HistoPipe.order"] == calls["HistoPipe.observe_step"] == steps
    assert calls["TraceReplay.step"] > steps and calls["CostMeter.charge_step"] == steps


def test_the_bundled_trace_counts_gpus_and_a_csv_counts_instances(tmp_path):
    # Bamboo's rows are single-GPU VMs: 50% of them, in 2-GPU instances, is a quarter of the count
    bundled = offered_instances(SimConfig(segment="A"))
    gpus = load_trace(TraceConfig(segment="A", sample=0.5, time_scale=1.0))
    for t in gpus.times_s:
        assert bundled.available_at(t) == gpus.available_at(t) // 2
    assert bundled.stats()["mean"] == pytest.approx(6.93, abs=0.01)
    as_instances = offered_instances(SimConfig(segment="A", trace_gpus_per_instance=2))
    assert as_instances.counts == gpus.counts
    own = trace_file(tmp_path, "0,3\n100,5")  # a CSV of one's own counts instances as rented
    assert offered_instances(SimConfig(trace=own)).counts[:2] == (3, 5)


def test_pulling_instances_get_their_share_of_the_first_dispatch(tmp_path):
    # Four instances that pull each step's weights 2 s after the reserved engines: with their share
    # held for them, they generate from the step's start; without, the reserved engines take the
    # whole step and the instances idle until the hand-off.
    trace = trace_file(tmp_path, "0,4\n7200,4")
    # the hand-off at the window's end, as the paper's controller has it: what is measured is the share
    base = SimConfig(trace=trace, duration_s=1500, offload=replace(SimConfig().offload, gate_handoff=False))
    shared, unshared = simulate(base), simulate(replace(base, share_with_pulling=False))
    train = make_profiles("qwen3-8b")[1]
    late_s = train.weight_sync_s(50.0) - train.weight_sync_s(200.0)
    later = [s for s in shared.steps[1:] if s.instances_start == 4]
    assert later and all(s.remote_s == pytest.approx(s.rollout_s - late_s) for s in later)
    # without: the reserved engines hold the step (the balancer moves only a sample or two), so the
    # hand-off has several times more to migrate
    handed = [sum(s.migrated.get("seed_handoff", 0) for s in r.steps[1:]) for r in (shared, unshared)]
    assert handed[0] < handed[1] / 2
    assert shared.throughput_tokens_per_s > 1.05 * unshared.throughput_tokens_per_s


def test_the_dispatcher_decision_is_what_runs(monkeypatch):
    # A dispatcher that sends everything to one engine must make the run slower: the simulator applies
    # the policy's decisions rather than deciding on its own.
    cfg = SimConfig(duration_s=1200)
    normal = simulate(cfg)
    original = JSQDispatcher.assign

    def one_worker(self, sample_ids, loads, incoming=()):
        return original(self, sample_ids, sorted(loads, key=lambda w: w.name)[:1])

    monkeypatch.setattr(JSQDispatcher, "assign", one_worker)
    skewed = simulate(cfg)
    assert skewed.throughput_tokens_per_s < 0.8 * normal.throughput_tokens_per_s


def test_histopipe_orders_dispatch_from_the_second_epoch():
    work = WorkloadConfig(dataset_size=256)  # an epoch is 2 steps, so history exists from step 2
    # 64 slots per engine: the step's samples queue, so the order matters (with 512 they all start at once)
    prof = ProfileConfig(max_num_seqs=64)
    plain = simulate(SimConfig(workload=work, profile=prof, duration_s=1500))
    piped = simulate(SimConfig(workload=work, profile=prof, histopipe=True, duration_s=1500))
    assert [s.end_s for s in plain.steps[:2]] == [s.end_s for s in piped.steps[:2]]  # first epoch: unchanged
    assert [s.end_s for s in plain.steps] != [s.end_s for s in piped.steps]
    for s in piped.steps:
        assert s.tokens_generated == s.tokens_trained + s.wasted_tokens


# --- determinism, configuration, speed ------------------------------------------------------------


def test_same_seed_same_result_and_the_seed_picks_the_victims():
    cfg = SimConfig(segment="B", duration_s=3000)
    a, b = simulate(cfg), simulate(cfg)
    assert a.steps == b.steps and a.timeline == b.timeline and a.cost_usd == b.cost_usd
    other = simulate(replace(cfg, seed=1))  # the seed picks the victims, and so which samples migrate
    assert other.preemptions > 0 and other.steps != a.steps


def test_config_is_validated():
    for field, value in [("policy", "vllm"), ("segment", "D"), ("migration", "teleport"), ("model", "gpt2"),
                         ("stream_interval", 0), ("duration_s", 0.0), ("instance_startup_s", -1.0)]:
        with pytest.raises(ValueError, match=field):
            simulate(SimConfig(**{field: value}))


def test_relative_numbers_of_a_full_segment():
    # (how fast a segment simulates is a benchmark's to say, not a test's: on a busy machine the wall
    # time of a 2-CPU-second segment went past 10 s)
    verl = simulate(SimConfig(policy="verl"))
    r = simulate(SimConfig(policy="rlboost"))
    rel = r.relative_to(verl)
    assert rel["throughput"] == pytest.approx(r.throughput_tokens_per_s / verl.throughput_tokens_per_s)
    assert rel["cost_efficiency"] == pytest.approx(r.tokens_per_usd / verl.tokens_per_usd)
    assert rel["throughput"] > 1.2  # spot instances make rollout faster than the node alone
    assert r.tokens_per_usd == pytest.approx(r.tokens / r.cost_usd)
    assert r.cost_usd == pytest.approx(RESERVED_USD_PER_S * r.wall_s + 5.32 / 3600 * r.instance_seconds)
    assert set(POLICIES) == {"verl", "verl2x", "disagg", "verl-async", "rlboost", "rlboost-noseed", "rlboost-nomemory"}
