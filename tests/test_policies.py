"""Policies: JSQ dispatch with the pending cap, the throughput-plateau profile, continuous balancing."""

from __future__ import annotations

import json
import random
from collections import Counter
from dataclasses import replace

import pytest

from rlboost.policies import Balancer, JSQDispatcher, Move, ThroughputProfile, WorkerLoad


def worker(name, running=0, pending=0, max_running=4):
    return WorkerLoad(name, running, pending, max_running)


def apply(loads, moves):
    """Apply moves the way the manager does: a pending sample fills a free slot first, else queues."""
    by_name = {load.name: load for load in loads}
    for move in moves:
        source, target = by_name[move.source], by_name[move.target]
        if move.executing:
            source = replace(source, running=source.running - move.count)
            target = replace(target, running=target.running + move.count)
        else:
            source = replace(source, pending=source.pending - move.count)
            started = min(move.count, target.max_running - target.running)
            target = replace(target, running=target.running + started,
                             pending=target.pending + move.count - started)
        by_name[move.source], by_name[move.target] = source, target
    return list(by_name.values())


# --- JSQ dispatch ---

def test_jsq_spreads_evenly_across_empty_workers():
    assignment = JSQDispatcher(2).assign([f"s{i}" for i in range(6)], [worker("a"), worker("b"), worker("c")])
    assert Counter(assignment.values()) == {"a": 2, "b": 2, "c": 2}
    assert list(assignment) == [f"s{i}" for i in range(6)]


def test_jsq_fills_free_slots_before_pending():
    loads = [worker("a", running=4), worker("b", running=3)]  # a full, b has one free slot
    assert JSQDispatcher(5).assign(["x", "y"], loads) == {"x": "b", "y": "a"}


def test_jsq_respects_cap_and_leaves_the_rest_out():
    loads = [worker("a", running=4, pending=1), worker("b", running=4)]
    assignment = JSQDispatcher(2).assign([f"s{i}" for i in range(10)], loads)
    assert Counter(assignment.values()) == {"a": 1, "b": 2}
    assert list(assignment) == ["s0", "s1", "s2"]


def test_jsq_zero_cap_uses_only_free_slots():
    loads = [worker("a", running=2), worker("b", running=4)]
    assignment = JSQDispatcher(0).assign(["x", "y", "z"], loads)
    assert assignment == {"x": "a", "y": "a"}


def test_jsq_a_worker_that_does_not_queue_takes_only_its_free_slots():
    loads = [replace(worker("a", running=1, max_running=2), queue=False), worker("b", running=4)]
    assignment = JSQDispatcher(2).assign([f"s{i}" for i in range(6)], loads)
    assert Counter(assignment.values()) == {"a": 1, "b": 2}


def test_jsq_holds_the_share_of_incoming_workers():
    # two ready workers, two pulling the step's weights: the ready ones take half, the rest waits
    ready = [worker("a"), worker("b")]
    incoming = [worker("c"), worker("d")]
    samples = [f"s{i}" for i in range(8)]
    assignment = JSQDispatcher(2).assign(samples, ready, incoming)
    assert Counter(assignment.values()) == {"a": 2, "b": 2}
    held = [s for s in samples if s not in assignment]
    assert len(held) == 4
    # once they serve, the held samples go to them: everyone ends with the same share
    loads = [worker("a", running=2), worker("b", running=2), worker("c"), worker("d")]
    assert Counter(JSQDispatcher(2).assign(held, loads).values()) == {"c": 2, "d": 2}
    assert JSQDispatcher(2).assign(samples, ready, ()) == JSQDispatcher(2).assign(samples, ready)
    with pytest.raises(ValueError, match="unique"):
        JSQDispatcher(2).assign(samples, ready, [worker("a")])


def test_jsq_prefers_fewer_pending():
    loads = [worker("a", running=4, pending=2), worker("b", running=4, pending=1)]
    assert JSQDispatcher(5).assign(["x", "y"], loads) == {"x": "b", "y": "a"}  # then a tie: name decides


def test_jsq_tie_break_is_by_name_and_deterministic():
    loads = [worker("c"), worker("a"), worker("b")]
    first = JSQDispatcher(1).assign(["x"], loads)
    assert first == {"x": "a"}
    assert all(JSQDispatcher(1).assign(["x"], loads) == first for _ in range(5))


def test_jsq_does_not_mutate_and_handles_empty():
    loads = [worker("a", running=1), worker("b")]
    snapshot = list(loads)
    JSQDispatcher(1).assign(["x", "y", "z"], loads)
    assert loads == snapshot
    assert JSQDispatcher(1).assign(["x"], []) == {}
    with pytest.raises(ValueError):
        JSQDispatcher(-1)


# --- Throughput profile ---

def test_profile_plateau_is_smallest_size_near_the_best():
    profile = ThroughputProfile(tolerance=0.9)
    assert profile.plateau() is None
    for size, tokens_per_s in [(1, 100), (2, 190), (4, 350), (8, 390), (16, 400)]:
        profile.observe(size, tokens_per_s)
    assert profile.plateau() == 8  # 390 >= 0.9 * 400 > 350
    assert profile.best() == 400
    assert ThroughputProfile(tolerance=1.0).plateau() is None
    assert ThroughputProfile().best() is None


def test_profile_smoothing_moves_toward_new_observations():
    profile = ThroughputProfile(smoothing=0.25)
    profile.observe(4, 100.0)
    profile.observe(4, 200.0)
    assert profile.throughput(4) == pytest.approx(125.0)
    assert profile.throughput(8) is None


def test_profile_ignores_invalid_observations():
    profile = ThroughputProfile()
    for size, tokens_per_s in [(0, 100.0), (-2, 100.0), (4, -1.0), (4, float("nan"))]:
        profile.observe(size, tokens_per_s)
    assert profile.plateau() is None and profile.throughput(4) is None


# --- Balancer ---

def test_balancer_moves_one_pending_sample_to_a_worker_with_none():
    loads = [worker("a", running=4, pending=3), worker("b", running=4)]
    assert Balancer().rebalance(loads, {}) == [Move("a", "b", 1, executing=False)]


def test_balancer_no_move_without_pending_or_idle():
    loads = [worker("a", running=4), worker("b", running=2)]
    assert Balancer(default_plateau=1).rebalance(loads, {}) == []


def test_balancer_does_not_ping_pong_a_single_pending_sample():
    loads = [worker("a", running=4, pending=1), worker("b", running=4)]
    assert Balancer().rebalance(loads, {}) == []


def test_balancer_executing_move_is_running_minus_plateau():
    loads = [worker("busy", running=14, max_running=16), worker("idle", max_running=16),
             worker("light", running=3, max_running=16)]
    assert Balancer().rebalance(loads, {"busy": 8}) == [Move("busy", "idle", 6, executing=True)]
    assert Balancer().rebalance(loads, {"busy": 14}) == []


def test_balancer_default_plateau_applies_only_without_profile():
    loads = [worker("busy", running=10, max_running=16), worker("idle", max_running=16)]
    assert Balancer(default_plateau=4).rebalance(loads, {}) == [Move("busy", "idle", 6, executing=True)]
    assert Balancer(default_plateau=4).rebalance(loads, {"busy": 7}) == [Move("busy", "idle", 3, executing=True)]
    assert Balancer(default_plateau=None).rebalance(loads, {"busy": None}) == []


def test_balancer_executing_move_capped_by_idle_capacity():
    loads = [worker("busy", running=30, max_running=32), worker("idle", max_running=4)]
    assert Balancer().rebalance(loads, {"busy": 2}) == [Move("busy", "idle", 4, executing=True)]


def test_balancer_two_idle_workers_do_not_take_the_same_samples():
    loads = [worker("busy", running=12, max_running=16), worker("idle1", max_running=4),
             worker("idle2", max_running=16)]
    moves = Balancer().rebalance(loads, {"busy": 4, "idle1": 4})
    assert moves == [Move("busy", "idle1", 4, executing=True), Move("busy", "idle2", 4, executing=True)]


@pytest.mark.parametrize("loads", [
    [worker("a", running=4, pending=5), worker("b", running=1), worker("c", running=4), worker("d")],
    [worker("a", running=16, max_running=16), worker("b", max_running=8), worker("c", max_running=8)],
    [worker("a", running=4, pending=4), worker("b", running=4), worker("c", running=4)],
])
def test_balancer_is_idempotent_and_does_not_mutate(loads):
    balancer = Balancer(default_plateau=2)
    snapshot = list(loads)
    moves = balancer.rebalance(loads, {})
    assert moves and loads == snapshot
    settled = apply(loads, moves)
    assert balancer.rebalance(settled, {}) == []
    assert sum(w.running + w.pending for w in settled) == sum(w.running + w.pending for w in loads)


def reference_rebalance(balancer, loads, plateaus):
    """The balancer as first written (O(workers²) phase 1): the reference its faster form must match."""
    running = {load.name: load.running for load in loads}
    pending = {load.name: load.pending for load in loads}
    capacity = {load.name: load.max_running for load in loads}
    moved = {}
    moved_any = True
    while moved_any:
        moved_any = False
        for target in sorted((n for n in running if pending[n] == 0), key=lambda n: (running[n], n)):
            source = min(running, key=lambda n: (-pending[n], n))
            has_free_slot = running[target] < capacity[target]
            target_pending_after = 0 if has_free_slot else 1
            if source == target or pending[source] - 1 < target_pending_after:
                continue
            pending[source] -= 1
            if has_free_slot:
                running[target] += 1
            else:
                pending[target] += 1
            moved[(source, target, False)] = moved.get((source, target, False), 0) + 1
            moved_any = True
    for idle in sorted(n for n in running if running[n] == 0 and pending[n] == 0):
        donors = [n for n in running if n != idle and pending[n] == 0]
        if not donors:
            continue
        busiest = min(donors, key=lambda n: (-running[n], n))
        plateau = plateaus.get(busiest)
        if plateau is None:
            plateau = balancer.default_plateau
        if plateau is None:
            continue
        count = min(max(running[busiest] - plateau, 0), capacity[idle])
        if count > 0:
            running[busiest] -= count
            running[idle] += count
            moved[(busiest, idle, True)] = count
    return [Move(source, target, count, executing) for (source, target, executing), count in moved.items()]


def random_case(rng):
    """Loads with many ties (small counts), full and zero-capacity workers, names that sort unlike
    their numbers, plateaus missing, None, zero, negative or beyond the capacity, and half of the time
    the manager's own shape (pending only on full workers)."""
    names = rng.sample([f"w{i}" for i in range(24)], rng.randint(0, 12))
    manager_shape = rng.random() < 0.5
    loads = []
    for name in names:
        cap = rng.choice([0, 1, 2, 4, 4, 8])
        if manager_shape:
            assigned = rng.randint(0, cap + rng.choice([0, 0, 1, 3, 6]))
            loads.append(worker(name, min(assigned, cap), max(assigned - cap, 0), cap))
        else:
            loads.append(worker(name, rng.randint(0, cap + 1), rng.choice([0, 0, 0, 1, 1, 2, 3, 5]), cap))
    plateaus = {}
    for name in names:
        roll = rng.random()
        if roll < 0.6:
            plateaus[name] = rng.randint(-1, 9)  # -1: no profile gives it, yet the result must still match
        elif roll < 0.8:
            plateaus[name] = None
    return loads, plateaus, rng.choice([None, None, 0, 1, 3])


def test_balancer_matches_the_reference_on_random_loads():
    rng = random.Random(20240611)
    gated = moving = 0
    for _ in range(5000):
        loads, plateaus, default = random_case(rng)
        balancer = Balancer(default_plateau=default)
        expected = reference_rebalance(balancer, loads, plateaus)
        assert balancer.rebalance(loads, plateaus) == expected, (loads, plateaus, default)
        if not balancer.may_move(loads, plateaus):
            gated += 1
            assert expected == [], (loads, plateaus, default)  # the gate only skips calls without a move
        moving += bool(expected)
    assert gated > 1000 and moving > 1000  # both sides of the gate are exercised


def test_balancer_matches_the_reference_at_scale():
    rng = random.Random(7)
    for _ in range(50):
        loads = [worker(f"w{i}", rng.randint(0, 16), rng.choice([0, 0, 1, 2, 4]) if rng.random() < 0.3 else 0, 16)
                 for i in range(rng.randint(50, 100))]
        plateaus = {load.name: rng.choice([None, 4, 8, 12]) for load in loads}
        assert Balancer().rebalance(loads, plateaus) == reference_rebalance(Balancer(), loads, plateaus)


def test_balancer_gate_is_exact_on_simple_cases():
    balancer = Balancer()
    assert not balancer.may_move([worker("a", running=4, pending=1), worker("b", running=4)], {})  # b full
    assert balancer.may_move([worker("a", running=4, pending=1), worker("b", running=3)], {})
    assert not balancer.may_move([worker("a", running=4), worker("b")], {"a": 4})  # a at its plateau
    assert balancer.may_move([worker("a", running=4), worker("b")], {"a": 3})
    assert not balancer.may_move([worker("a", running=4), worker("b")], {})  # a's plateau unknown
    assert Balancer(default_plateau=2).may_move([worker("a", running=4), worker("b")], {})


def test_profile_plateau_cache_follows_observations():
    profile = ThroughputProfile(tolerance=0.9, smoothing=1.0)
    profile.observe(4, 100.0)
    assert profile.plateau() == 4
    profile.observe(8, 200.0)
    assert profile.plateau() == 8
    profile.observe(8, 50.0)  # smoothing 1: the new value replaces the old
    assert profile.plateau() == 4
    profile.observe(0, 1e9)  # ignored: leaves the cache as it was
    assert profile.plateau() == 4


# --- SpecBudget -------------------------------------------------------------------------------------

from rlboost.policies import SpecBudget  # noqa: E402


def test_spec_budget_measures_plain_then_speculation_then_keeps_the_cheaper():
    budget = SpecBudget(max_batch=8, probe_every=4)
    assert not budget.speculate(9) and not budget.speculate(0)  # beyond the batch limit: never
    assert not budget.speculate(2)  # no plain baseline at this batch size yet
    budget.observe(2, seconds=0.10, tokens=2, speculative=False)  # 50 ms per token plain
    assert budget.speculate(2)  # speculation not measured yet: try it
    budget.observe(2, seconds=0.12, tokens=6, speculative=True)  # 20 ms per token speculating
    assert budget.speculate(2)  # cheaper: keep speculating
    assert not budget.speculate(2)  # every probe_every-th eligible step runs plain (count 4)
    assert budget.plain_step_s(2) == pytest.approx(0.10) and budget.plain_step_s(3) is None


def test_spec_budget_weighs_throughput_not_the_luck_of_the_last_verifications():
    """Verifications of 60 ms that emit 1 token or 9 in turn run at 12 ms a token against plain's 30:
    the budget keeps speculating, also right after an unlucky one. (A moving average of each step's
    ms per token, 6.7 and 60 in turn, stands at 34 after the sixth and would stop it.)"""
    budget = SpecBudget(max_batch=8, probe_every=100)
    budget.speculate(1)
    budget.observe(1, seconds=0.03, tokens=1, speculative=False)
    for tokens in (9, 1, 9, 1, 9, 1):
        budget.observe(1, seconds=0.06, tokens=tokens, speculative=True)
    assert budget.per_token(1, True) < budget.per_token(1, False) == pytest.approx(0.03)
    assert budget.speculate(1)


def test_spec_budget_stops_where_speculation_is_slower_and_retries_later():
    budget = SpecBudget(max_batch=8, probe_every=4, smoothing=1.0)
    budget.speculate(4)
    budget.observe(4, seconds=0.1, tokens=4, speculative=False)  # 25 ms per token
    assert budget.speculate(4)
    budget.observe(4, seconds=0.2, tokens=5, speculative=True)  # 40 ms per token: a loss
    decisions = [budget.speculate(4) for _ in range(20)]  # eligible steps 3..22
    assert decisions.count(True) == 1 and decisions[17 - 3]  # only the retry at step 17 (= 1 mod 16)


def _budget_with_costs(batch: int, plain_s: float, intercept_s: float, per_position_s: float,
                       acceptance: list[float], probe_every: int = 100, ragged: bool = False) -> SpecBudget:
    """A budget that measured plain steps of `batch` at `plain_s`, verify steps costing `intercept_s`
    plus `per_position_s` per extra position beyond them, and node i of a draft accepted at
    `acceptance[i]` (100 drafts of len(acceptance) nodes)."""
    budget = SpecBudget(max_batch=8, probe_every=probe_every, ragged=ragged)
    budget.observe(batch, plain_s, batch, speculative=False)
    for width in (2, 5, 9):
        extra = batch * (width - 1)
        budget.observe(batch, plain_s + intercept_s + per_position_s * extra, batch + 1, True, extra)
    for d in range(100):
        budget.verified(len(acceptance), [i for i, p in enumerate(acceptance) if d < 100 * p])
    return budget


def test_spec_budget_verifies_the_nodes_that_pay_for_their_positions():
    """Node i pays while its acceptance x a plain token's time exceeds the positions it adds (one per
    request: the verify batch is padded to its widest draft)."""
    acceptance = [0.9, 0.6, 0.2, 0.2, 0.1, 0.1, 0.1, 0.1]
    # batch 8, compute-bound: 10 ms a token plain, 2.5 ms a position: a node pays above 25% acceptance
    dear = _budget_with_costs(8, plain_s=0.08, intercept_s=0.0, per_position_s=0.0025, acceptance=acceptance)
    assert dear.acceptance(0) == pytest.approx(90.5 / 101) and dear.acceptance(8) == 0.5  # measured; prior
    assert dear.nodes(8, [8] * 8) == 2
    assert dear.nodes(8, [8] + [1] * 7) == 1  # the second node of one request alone does not pay its column
    # batch 1, memory-bound: 30 ms a token, 0.5 ms a position: every measured node pays
    cheap = _budget_with_costs(1, plain_s=0.03, intercept_s=0.0, per_position_s=0.0005, acceptance=acceptance)
    assert cheap.nodes(1, [8]) == 8 and cheap.nodes(1, [3]) == 3
    # a fixed cost of verifying (drafting, the tree's masks) that no acceptance covers: the step runs plain
    costly = _budget_with_costs(1, plain_s=0.03, intercept_s=0.2, per_position_s=0.0005, acceptance=acceptance)
    assert costly.nodes(1, [8]) == 0


def test_a_ragged_budget_charges_a_node_only_to_the_drafts_that_have_it():
    """vLLM verifies each draft's own tokens: one request's second node costs one position, not a
    column of the whole batch, so it pays where a padded engine's would not."""
    acceptance = [0.9, 0.6, 0.2, 0.2, 0.1, 0.1, 0.1, 0.1]
    costs = dict(plain_s=0.08, intercept_s=0.0, per_position_s=0.0025, acceptance=acceptance)
    padded, ragged = _budget_with_costs(8, **costs), _budget_with_costs(8, ragged=True, **costs)
    one_long = [8] + [1] * 7
    assert padded.nodes(8, one_long) == 1 and ragged.nodes(8, one_long) == 2
    assert ragged.nodes(8, [8] * 8) == 2  # node 3 (20% x 10 ms < 2.5 ms) pays for no draft
    again = ragged.fresh()
    assert again.ragged and again.max_batch == 8 and again.probe_every == 100
    assert again.plain_step_s(8) is None and again.nodes(8, [8] * 8) == 4  # measured nothing: 32 positions


def test_spec_budget_verifies_whole_drafts_until_measured_and_on_its_probes():
    """Until a verify step was timed, whole drafts where the batch is small; at a large one only as
    many nodes as keep the step within 32 positions beyond the plain step's (whole drafts of 8 at
    batch 32 cost several plain steps on a CPU)."""
    budget = SpecBudget(max_batch=32, probe_every=2)
    assert budget.nodes(4, [3, 5]) == 5  # no plain step, no verify cost measured yet
    assert budget.nodes(1, [8]) == 8 and budget.nodes(16, [8] * 16) == 2 and budget.nodes(32, [8] * 32) == 1
    budget = _budget_with_costs(8, plain_s=0.08, intercept_s=0.0, per_position_s=0.0025,
                                acceptance=[0.9, 0.1, 0.1, 0.1], probe_every=2)
    decisions = [budget.nodes(8, [4] * 8) for _ in range(16)]
    assert decisions.count(4) == 2 and decisions[7] == decisions[15] == 4  # every 4 * probe_every-th: whole
    assert set(decisions) - {4} == {1}


def test_line_fit_recovers_a_line_and_falls_back_where_x_did_not_vary():
    from rlboost.policies.spec_budget import LineFit

    fit = LineFit()
    assert fit.line() is None
    for x in (0, 8, 16, 64):
        fit.add(x, 0.01 + 0.002 * x)
    intercept, slope = fit.line()
    assert intercept == pytest.approx(0.01) and slope == pytest.approx(0.002)
    same = LineFit()
    for _ in range(3):
        same.add(8, 0.04)
    assert same.line() == pytest.approx((0.0, 0.005))  # all of it charged per position
    cut_whole = LineFit()
    for _ in range(3):
        cut_whole.add(0, 0.003)
    assert cut_whole.line() == pytest.approx((0.003, 0.0))  # only drafting measured


def test_spec_budget_drafts_where_the_best_cut_of_typical_drafts_saves_time():
    """Once the verify cost and the acceptance are measured, whether to draft follows the best cut,
    not the per-token time of past verify steps (which whole, expensive drafts set)."""
    for acceptance, drafts in (([0.9, 0.6, 0.2, 0.2], True), ([0.2, 0.1, 0.1, 0.1], False)):
        budget = _budget_with_costs(8, plain_s=0.08, intercept_s=0.0, per_position_s=0.0025,
                                    acceptance=acceptance)
        assert budget.per_token(8, True) > budget.per_token(8, False)  # the measured verify steps lost
        budget.nodes(8, [4] * 8)  # typical drafts: 4 nodes for every request
        assert budget.speculate(8)  # its first eligible step: a retry (then every 400th; plain every 100th)
        decisions = [budget.speculate(8) for _ in range(30)]
        assert set(decisions) == {drafts}, (acceptance, decisions)


# --- the verify curve as the budget's prior -----------------------------------------------------------------

from rlboost.policies.verify_curve import VerifyCurve, load_verify_curve  # noqa: E402

GPU_LIKE = [{"batch": 1, "positions": [1, 2, 4, 8], "relative": [1.0, 1.01, 1.02, 1.05]},
            {"batch": 8, "positions": [1, 2, 4, 8], "relative": [1.0, 1.05, 1.2, 1.6]},
            {"batch": 64, "positions": [1, 2, 4, 8], "relative": [1.02, 1.6, 3.0, 6.0]}]
"""A memory-bound card's shape of curve: near-free positions at batch 1, dear ones at 64."""


def test_a_verify_curve_interpolates_in_log_batch_and_in_positions_and_holds_outside():
    curve = VerifyCurve.from_rows(GPU_LIKE)
    assert curve.relative(8, 4) == 1.2 and curve.relative(1, 3) == pytest.approx(1.015)
    assert curve.relative(64, 16) == 6.0 and curve.relative(128, 8) == 6.0 and curve.relative(8, 1) == 1.0
    assert curve.relative(2, 8) == pytest.approx(1.05 + (1.6 - 1.05) / 3)  # log2(2) of log2(8)
    assert curve.relative(16, 4) == pytest.approx(1.2 + (3.0 - 1.2) / 3)  # log2(16/8) of log2(64/8)
    assert curve.positions(5) == [1, 2, 4, 8]
    with pytest.raises(ValueError, match="batch 8, n=2: relative cost nan"):
        VerifyCurve.from_rows([{"batch": 8, "positions": [1, 2], "relative": [1.0, float("nan")]}])
    with pytest.raises(ValueError, match="differ in length"):
        VerifyCurve.from_rows([{"batch": 8, "positions": [1, 2], "relative": [1.0]}])


def test_the_verify_curve_loads_from_a_gpu_check_json_by_shape_and_names_what_is_missing(tmp_path):
    path = tmp_path / "gpu.json"
    path.write_text(json.dumps({"shapes": [{"shape": "tiny", "verify": []},
                                           {"shape": "qwen2.5-0.5b", "verify": GPU_LIKE}]}))
    assert load_verify_curve(str(path)).relative(64, 8) == 6.0  # the first shape with a curve
    assert load_verify_curve(f"{path}:qwen2.5-0.5b").source == f"{path}:qwen2.5-0.5b"
    with pytest.raises(ValueError, match=r"no verify curve for shape 'smollm2-135m' .*shapes with one: qwen2.5-0.5b"):
        load_verify_curve(f"{path}:smollm2-135m")
    with pytest.raises(ValueError, match="cannot read a JSON from /no/such.json"):
        load_verify_curve("/no/such.json")


def _measured_acceptance(budget: SpecBudget, acceptance: list[float]) -> SpecBudget:
    for d in range(100):
        budget.verified(len(acceptance), [i for i, p in enumerate(acceptance) if d < 100 * p])
    return budget


def test_the_curve_prior_sets_the_first_cut_before_any_verify_step_and_measurements_take_over():
    """Without a prior a budget verifies whole drafts up to 32 positions until a verify step is timed.
    With a curve it cuts from the first step as the curve prices positions: all 8 nodes at batch 8 on a
    memory-bound card, where the rule of 32 positions stops at 4; 2 nodes at batch 1 on a CPU-like curve,
    where the rule takes all 8. Measured verify steps then move the cut."""
    acceptance = [0.9, 0.6, 0.3, 0.3, 0.2, 0.2, 0.1, 0.1]
    cpu_like = VerifyCurve.from_rows([{"batch": 1, "positions": [1, 2, 4, 8], "relative": [1.0, 1.5, 2.5, 4.5]}])
    for curve, batch, plain_s, with_prior, without in ((VerifyCurve.from_rows(GPU_LIKE), 8, 0.010, 8, 4),
                                                       (cpu_like, 1, 0.030, 2, 8)):
        budget = _measured_acceptance(SpecBudget(max_batch=64, probe_every=100, prior=curve), acceptance)
        plain = _measured_acceptance(SpecBudget(max_batch=64, probe_every=100), acceptance)
        for b in (budget, plain):
            b.observe(batch, plain_s, batch, speculative=False)
        # GPU, batch 8: (1.6 - 1) x 10 ms over 56 positions = 107 us each against 1.25 ms a token: every
        # node above 9% acceptance pays. CPU, batch 1: 15 ms a position against 30 ms a token: above 50%
        assert budget.nodes(batch, [8] * batch) == with_prior and plain.nodes(batch, [8] * batch) == without
    # the curve was wrong for this machine: its verify steps at batch 1 measure nearly free; after some
    # of them, whole drafts pay
    budget = _measured_acceptance(SpecBudget(max_batch=64, probe_every=100, prior=cpu_like), acceptance)
    budget.observe(1, 0.030, 1, speculative=False)
    assert budget.nodes(1, [8]) == 2
    for width in (2, 5, 9) * 4:
        budget.observe(1, 0.030 + 0.0001 * (width - 1), 2, True, width - 1)
    assert budget.nodes(1, [8]) == 8
    assert budget.fresh().prior is cpu_like
