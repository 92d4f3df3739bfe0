"""HistoPipe: history-ordered dispatch, spreading groups across workers, overrun flags, the bounded
length history, and the list-scheduling model that measures what the order buys."""

from __future__ import annotations

import copy
import json
import random

import pytest

from rlboost.policies.dispatch import JSQDispatcher, WorkerLoad
from rlboost.policies.histopipe import HistoPipe, HistoPipeConfig, LengthHistory, SampleInfo, simulate_tail


def pipe(**cfg) -> HistoPipe:
    return HistoPipe(HistoPipeConfig(**{"enabled": True, **cfg}))


def samples(groups, per_group=2) -> list[SampleInfo]:
    """Groups in the order given; group g's prompt is "p{g}", its samples "g{g}s{i}"."""
    return [SampleInfo(f"g{g}s{i}", f"p{g}", g) for g in groups for i in range(per_group)]


def with_history(p: HistoPipe, expected: dict[int, int]) -> HistoPipe:
    p.observe_step({f"p{g}": [n, n] for g, n in expected.items()})
    return p


def group_order(uids: list[str]) -> list[int]:
    seen: list[int] = []
    for uid in uids:
        g = int(uid[1:uid.index("s")])
        if g not in seen:
            seen.append(g)
    return seen


# --- default scheduling ---

def test_disabled_returns_the_given_order():
    p = HistoPipe(HistoPipeConfig(enabled=False))
    p.observe_step({"p0": [5], "p1": [50]})
    s = samples([0, 1])
    assert p.order(0, s) == [x.uid for x in s]
    assert len(p.history) == 0  # disabled records nothing


def test_first_epoch_returns_the_given_order():
    s = samples([3, 1, 2])
    assert pipe().order(0, s) == [x.uid for x in s]
    assert pipe().order(1, s) == [x.uid for x in s]


# --- group order ---

def test_even_step_descending_odd_ascending_when_alternating():
    p = with_history(pipe(alternate=True), {0: 10, 1: 40, 2: 20, 3: 30})
    s = samples([0, 1, 2, 3])
    assert group_order(p.order(0, s)) == [1, 3, 2, 0]
    assert group_order(p.order(1, s)) == [0, 2, 3, 1]
    assert group_order(p.order(2, s)) == [1, 3, 2, 0]


def test_by_default_every_step_is_descending():
    p = with_history(pipe(), {0: 10, 1: 40, 2: 20, 3: 30})
    s = samples([0, 1, 2, 3])
    assert group_order(p.order(1, s)) == [1, 3, 2, 0]


def test_expected_length_is_the_mean_not_the_max():
    p = pipe()
    p.observe_step({"p0": [100, 0, 0, 0], "p1": [30, 30]})  # means 25 and 30
    assert group_order(p.order(0, samples([0, 1]))) == [1, 0]


def test_unknown_groups_go_last_in_their_given_order():
    p = with_history(pipe(alternate=True), {1: 10, 3: 50})
    s = samples([2, 1, 0, 3])
    assert group_order(p.order(0, s)) == [3, 1, 2, 0]
    assert group_order(p.order(1, s)) == [1, 3, 2, 0]


def test_ties_by_group_index():
    p = with_history(pipe(alternate=True), {5: 20, 2: 20, 7: 20, 1: 99})
    s = samples([5, 7, 2, 1])
    assert group_order(p.order(0, s)) == [1, 2, 5, 7]
    assert group_order(p.order(1, s)) == [2, 5, 7, 1]


def test_deterministic_and_inputs_untouched():
    p = with_history(pipe(), {0: 10, 1: 40, 2: 20, 3: 30})
    s = samples([0, 1, 2, 3], per_group=3)
    before = copy.deepcopy(s)
    first = p.order(0, s)
    assert p.order(0, s) == first
    assert s == before
    assert sorted(first) == sorted(x.uid for x in s)  # a permutation: nothing lost or duplicated


# --- spreading over workers ---

def test_a_groups_samples_stay_together():
    p = with_history(pipe(), {0: 10, 1: 40, 2: 20, 3: 30})
    assert p.order(0, samples([0, 1, 2, 3])) == [
        "g1s0", "g1s1", "g3s0", "g3s1", "g2s0", "g2s1", "g0s0", "g0s1"]


@pytest.mark.parametrize("num_groups", [4, 8])
def test_jsq_spreads_each_long_group_over_the_workers(num_groups):
    k, per_group = 4, 8
    p = with_history(pipe(), {g: 100 - g for g in range(num_groups)})
    order = p.order(0, samples(range(num_groups), per_group))
    loads = [WorkerLoad(f"w{i}", running=0, pending=0, max_running=64) for i in range(k)]
    for assignment in (JSQDispatcher(max_pending=0).assign(order, loads),
                       {uid: f"w{i % k}" for i, uid in enumerate(order)}):  # plain round-robin
        for g in range(num_groups):
            assert {assignment[f"g{g}s{i}"] for i in range(per_group)} == {f"w{i}" for i in range(k)}
        assert all(assignment[a] != assignment[b] for a, b in zip(order, order[1:]))


# --- overruns ---

def test_overrun_threshold_is_strict_and_factor_times_longest():
    p = pipe(overrun_factor=1.5, overrun_min_tokens=32)
    p.observe_step({"p": [40, 100]})  # longest 100 -> threshold 150
    assert p.flag_overruns({"u": ("p", 150)}) == []
    assert p.flag_overruns({"u": ("p", 151)}) == ["u"]


def test_overrun_min_tokens_protects_short_prompts():
    p = pipe(overrun_factor=1.5, overrun_min_tokens=32)
    p.observe_step({"p": [10]})  # 1.5 x 10 = 15, but the floor is 32
    assert p.flag_overruns({"u": ("p", 32)}) == []
    assert p.flag_overruns({"u": ("p", 33)}) == ["u"]


def test_unknown_prompts_and_disabled_never_flag():
    p = pipe(overrun_min_tokens=0)
    p.observe_step({"p": [10]})
    assert p.flag_overruns({"u": ("other", 10_000)}) == []
    off = HistoPipe(HistoPipeConfig(enabled=False, overrun_min_tokens=0))
    off.history.record("p", [10])
    assert off.flag_overruns({"u": ("p", 10_000)}) == []


def test_overruns_most_past_history_first_then_uid():
    p = pipe(overrun_factor=1.0, overrun_min_tokens=0)
    p.observe_step({"short": [10], "long": [100]})
    progress = {"b": ("long", 300), "a": ("long", 300), "c": ("short", 50), "d": ("short", 20),
                "e": ("long", 150), "f": ("short", 5)}
    # Ratios: c 5.0, a/b 3.0, d 2.0, e 1.5; f is under.
    assert p.flag_overruns(progress) == ["c", "a", "b", "d", "e"]


# --- history ---

def test_history_expected_and_longest():
    h = LengthHistory(max_prompts=4)
    assert h.expected("p") is None and h.longest("p") is None
    h.record("p", [10, 20, 60])
    assert h.expected("p") == 30.0 and h.longest("p") == 60
    h.record("p", [5])  # the latest epoch replaces the old one
    assert h.expected("p") == 5.0 and h.longest("p") == 5
    h.record("p", [])  # no news keeps the last epoch
    assert h.longest("p") == 5
    with pytest.raises(ValueError):
        h.record("p", [3, -1])


def test_history_evicts_least_recently_recorded():
    h = LengthHistory(max_prompts=2)
    h.record("a", [1])
    h.record("b", [2])
    h.record("a", [3])  # refreshes a: b is now the oldest
    h.record("c", [4])
    assert len(h) == 2
    assert h.longest("b") is None and h.longest("a") == 3 and h.longest("c") == 4
    h.expected("a")  # reading is not recording: a stays the oldest
    h.record("d", [5])
    assert h.longest("a") is None and h.longest("c") == 4 and h.longest("d") == 5


def test_state_dict_round_trips_through_json():
    p = pipe(max_prompts=3)
    p.observe_step({"x": [7, 9], "y": [1]})
    p.observe_step({"z": [40], "x": [8]})  # order now y, z, x
    state = json.loads(json.dumps(p.state_dict()))
    q = pipe(max_prompts=3)
    q.load_state_dict(state)
    assert q.state_dict() == p.state_dict()
    assert [key for key, _ in q.state_dict()["history"]["prompts"]] == ["y", "z", "x"]
    q.observe_step({"w": [2]})  # the order came back too: y is evicted first
    assert q.history.longest("y") is None and q.history.longest("x") == 8
    small = pipe(max_prompts=2)
    small.load_state_dict(state)  # a smaller bound keeps the most recent
    assert [key for key, _ in small.state_dict()["history"]["prompts"]] == ["z", "x"]


# --- config ---

@pytest.mark.parametrize("field, value", [("overrun_factor", 0.9), ("overrun_factor", float("nan")),
                                          ("overrun_min_tokens", -1), ("max_prompts", 0)])
def test_config_errors_name_the_field(field, value):
    with pytest.raises(ValueError, match=f"rollout.histopipe.{field}"):
        HistoPipe(HistoPipeConfig(**{field: value}))


# --- the list-scheduling model ---

def test_simulate_tail_hand_computed():
    # One slot each: 5 on w0, 3 on w1; w1 frees at 3 and takes the 2, done at 5.
    assert simulate_tail([5, 3, 2], workers=2, max_running=1) == (5.0, 5.0)
    # Short first: w0 takes 5 at time 2 and ends at 7 while w1 is done at 3.
    assert simulate_tail([2, 3, 5], workers=2, max_running=1) == (3.0, 7.0)
    # Two slots: JSQ puts one 1 on each worker, then the 5 goes to w0 at time 1.
    assert simulate_tail([1, 1, 1, 1, 5], workers=2, max_running=2) == (1.0, 6.0)
    # At t=0 JSQ spreads rather than filling w0 first: the 1 goes to w0 beside the 4, not the 3.
    assert simulate_tail([4, 3, 1], workers=2, max_running=2) == (3.0, 4.0)
    # A worker with nothing to do is done at 0.
    assert simulate_tail([4], workers=3, max_running=2) == (0.0, 4.0)


def test_simulate_tail_step_cost_follows_the_batch():
    # [4, 2] in lock-step at cost 2/step for 2 steps (t=4); the 1 joins: 1 step at 2 (t=6), 1 at 1 (t=7).
    assert simulate_tail([4, 2, 1], workers=1, max_running=2, step_cost=lambda b: float(b)) == (7.0, 7.0)
    with pytest.raises(ValueError):
        simulate_tail([1], workers=0, max_running=1)


def long_tailed_lengths(seed: int, groups=32, per_group=8) -> list[list[int]]:
    rng = random.Random(seed)
    result = []
    for _ in range(groups):
        mu = rng.gauss(5.5, 0.6)  # a prompt's typical length: lognormal across prompts
        result.append([max(1, int(rng.lognormvariate(mu, 0.35))) for _ in range(per_group)])
    return result


def schedules(seed: int, workers: int) -> tuple[list[int], list[int], list[int]]:
    """Lengths in HistoPipe's order (history = these very lengths), by group, and shuffled."""
    lengths = long_tailed_lengths(seed)
    s = [SampleInfo(f"g{g}s{i}", f"p{g}", g) for g in range(len(lengths)) for i in range(len(lengths[g]))]
    length_of = {f"g{g}s{i}": n for g, row in enumerate(lengths) for i, n in enumerate(row)}
    p = pipe()
    p.observe_step({f"p{g}": row for g, row in enumerate(lengths)})
    ordered = [length_of[uid] for uid in p.order(0, s)]
    by_group = [length_of[x.uid] for x in s]
    shuffled = by_group[:]
    random.Random(seed + 1000).shuffle(shuffled)
    return ordered, by_group, shuffled


# With a much heavier spread across prompts (sigma 0.8) some seeds draw one sample longer than the
# whole load per slot: the makespan is then that sample alone whatever the order, and a tail
# comparison would only reward orders that delay everyone else. sigma 0.6 keeps the load balanceable.
@pytest.mark.parametrize("step_cost", [None, lambda b: 1.0 + 0.05 * b])
def test_history_order_shrinks_the_tail(step_cost):
    ordered, by_group, shuffled = schedules(seed=0, workers=4)
    first, last = simulate_tail(ordered, 4, 8, step_cost)
    for default in (by_group, shuffled):
        d_first, d_last = simulate_tail(default, 4, 8, step_cost)
        assert last - first < d_last - d_first
        assert last <= d_last


def test_history_order_wins_on_average_over_seeds():
    tails = [0.0, 0.0, 0.0]
    makespans = [0.0, 0.0, 0.0]
    for seed in range(20):
        for j, lengths in enumerate(schedules(seed, workers=4)):
            first, last = simulate_tail(lengths, 4, 8)
            tails[j] += last - first
            makespans[j] += last
    assert tails[0] < 0.5 * min(tails[1:])
    assert makespans[0] < min(makespans[1:])
