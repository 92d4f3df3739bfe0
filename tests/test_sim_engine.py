"""EngineState: one engine's continuous batching through time, interrupted by submissions and aborts,
against a reference that plays the same rules one decode step at a time."""

from __future__ import annotations

import random
from collections import deque

import pytest

from rlboost.sim.batching import EngineState, KV_WATERMARK, engine_rollout
from rlboost.sim.profile import EngineProfile, ProfileConfig, make_profiles
from rlboost.sim.specs import GPUSpec, H100, MODELS


def small_engine(kv_tokens: int, max_num_seqs: int = 512) -> EngineProfile:
    """An 8B engine on one GPU with room for about `kv_tokens` tokens of KV, so that samples must take
    turns."""
    m = MODELS["qwen3-8b"]
    gpu = GPUSpec("small", H100.hbm_bytes_per_s, H100.peak_flops, memory_bytes=m.weight_bytes + kv_tokens * 147456)
    return EngineProfile(m, gpu, ProfileConfig(kv_memory_fraction=1.0, max_num_seqs=max_num_seqs,
                                               tp={"qwen3-8b": 1}))


def reference(engine: EngineProfile, prompt_len: int, actions: list) -> tuple[dict, dict, int, float]:
    """EngineState's rules one decode step at a time. `actions`: (time, "submit", [(key, length, made)])
    or (time, "abort", [keys]), sorted by time. A submission to a busy engine is admitted at the end of
    the step in progress; an abort takes the tokens of the complete steps and the remaining samples
    carry on from that step boundary. Returns (finish time per key, tokens per aborted key, decode
    tokens, final clock)."""
    capacity = engine.kv_capacity_tokens
    clock, order, tokens = 0.0, 0, 0
    running: list[list] = []  # [key, length, made, start order]
    waiting: list[list] = []  # [key, length, made]
    finished: dict = {}
    aborted: dict = {}
    acts = deque(actions)
    admit_due = False

    def admit() -> None:
        nonlocal clock, order
        while True:
            new = 0
            while waiting and len(running) < engine.cfg.max_num_seqs:
                key, length, made = waiting[0]
                total = sum(prompt_len + r[2] for r in running)
                if running and total + prompt_len + made + len(running) + 1 > (1 - KV_WATERMARK) * capacity:
                    break
                waiting.pop(0)
                running.append([key, length, made, order])
                order += 1
                if made:
                    clock += engine.prefill_s(prompt_len + made)
                else:
                    new += 1
            if new:
                clock += engine.prefill_s(new * prompt_len, sequences=new)
            total = sum(prompt_len + r[2] for r in running)
            if not running or total + len(running) <= capacity:
                return
            victim = max(running, key=lambda r: r[3])
            running.remove(victim)
            waiting.insert(0, victim[:3])

    def apply(t: float, kind: str, arg: list) -> None:
        nonlocal clock, admit_due
        if kind == "submit":
            waiting.extend([list(item) for item in arg])
            if running:
                admit_due = True
            else:
                clock = max(clock, t)
                admit()
            return
        for key in arg:
            for pool in (running, waiting):
                for r in pool:
                    if r[0] == key:
                        aborted[key] = r[2]
                        pool.remove(r)
                        break
        if waiting:
            if running:
                admit_due = True
            else:
                clock = max(clock, t)
                admit()

    while running or acts:
        if not running:
            apply(*acts.popleft())
            continue
        total = sum(prompt_len + r[2] for r in running)
        if total + len(running) > capacity:  # no room for the next step's tokens: an admission point evicts
            admit()
            continue
        step = engine.step_s(len(running), total)
        if acts and acts[0][0] < clock + step:  # the action comes before this step completes
            apply(*acts.popleft())
            continue
        clock += step
        tokens += len(running)
        for r in running:
            r[2] += 1
        done = [r for r in running if r[2] == r[1]]
        for r in done:
            finished[r[0]] = clock
            running.remove(r)
        if done or admit_due:
            admit_due = False
            admit()
    return finished, aborted, tokens, clock


def drive(engine: EngineProfile, prompt_len: int, actions: list) -> tuple[dict, dict, int, float]:
    """The same actions on an EngineState, jumping from event to event."""
    state = EngineState(engine, prompt_len)
    finished: dict = {}
    aborted: dict = {}

    def run_until(t: float) -> None:
        while state.running and state.next_event_s() <= t:
            when = state.next_event_s()
            for key in state.advance_to(when):
                finished[key] = when
        assert not state.advance_to(t)  # nothing finishes strictly inside a stretch

    for t, kind, arg in actions:
        run_until(t)
        if kind == "submit":
            state.submit(arg, t)
        else:
            aborted.update(state.abort(arg, t))
    run_until(float("inf"))
    return finished, aborted, state.tokens_generated, state.clock


def random_actions(rng: random.Random, n_submits: int, n_aborts: int, horizon: float, max_len: int) -> list:
    first = [(f"s{i}", rng.randint(1, max_len), 0) for i in range(rng.randint(3, 12))]
    actions = [(0.0, "submit", first)]
    keys = [item[0] for item in first]
    for n in range(n_submits):
        items = []
        for j in range(rng.randint(1, 4)):
            length = rng.randint(2, max_len)
            items.append((f"m{n}.{j}", length, rng.randint(0, length - 1)))  # some carry tokens (migrated)
        keys += [item[0] for item in items]
        actions.append((rng.uniform(0, horizon), "submit", items))
    for _ in range(n_aborts):  # running, waiting, finished or not yet submitted: all must be handled
        actions.append((rng.uniform(0, horizon), "abort", rng.sample(keys, 3)))
    actions.sort(key=lambda a: a[0])
    return actions


def compare_with_reference(seed: int) -> tuple:
    rng = random.Random(seed)
    engine = small_engine(kv_tokens=900, max_num_seqs=6) if seed % 2 else make_profiles("qwen3-8b")[0]
    actions = random_actions(rng, n_submits=4, n_aborts=3, horizon=4.0, max_len=200)
    got = drive(engine, 32, actions)
    want = reference(engine, 32, actions)
    assert got[0].keys() == want[0].keys()
    for key, t in want[0].items():
        assert got[0][key] == pytest.approx(t, rel=1e-9), key
    assert got[1] == want[1]  # aborted samples come back with exactly the tokens of the complete steps
    assert got[2] == want[2]
    assert got[3] == pytest.approx(want[3], rel=1e-9)
    return got


@pytest.mark.parametrize("seed", range(12))
def test_event_jumps_match_the_step_by_step_reference_with_submits_and_aborts(seed):
    compare_with_reference(seed)


def test_the_reference_cases_abort_samples_that_hold_tokens():
    # ... or the comparison above proves less than it says.
    aborted = [compare_with_reference(seed)[1] for seed in range(12)]
    assert sum(1 for a in aborted for made in a.values() if made > 0) >= 5


def test_the_small_kv_cases_do_evict():
    # The reference comparison above must cover evictions, or it proves less than it says.
    engine = small_engine(kv_tokens=900, max_num_seqs=6)
    state = EngineState(engine, 32)
    state.submit([(i, 200, 0) for i in range(8)], 0.0)
    while state.running:
        state.advance_to(state.next_event_s())
    assert state.preemptions > 0


def test_interrupting_the_engine_changes_nothing():
    # advance_to at arbitrary times (no submit, no abort) must give the same finish times as one go.
    engine, _ = make_profiles("qwen3-8b")
    rng = random.Random(1)
    lengths = [rng.randint(1, 3000) for _ in range(40)]
    whole = EngineState(engine, 512)
    whole.submit([(i, n, 0) for i, n in enumerate(lengths)], 0.0)
    finish_whole = {}
    while whole.running:
        t = whole.next_event_s()
        finish_whole.update({k: t for k in whole.advance_to(t)})
    parts = EngineState(engine, 512)
    parts.submit([(i, n, 0) for i, n in enumerate(lengths)], 0.0)
    finish_parts, t = {}, 0.0
    while parts.running:
        t += rng.uniform(0.01, 3.0)
        while parts.next_event_s() <= t:
            when = parts.next_event_s()
            finish_parts.update({k: when for k in parts.advance_to(when)})
        parts.advance_to(t)
    assert finish_parts.keys() == finish_whole.keys()
    for k in finish_whole:
        assert finish_parts[k] == pytest.approx(finish_whole[k], rel=1e-9)
    assert parts.tokens_generated == whole.tokens_generated == sum(lengths)


def test_engine_rollout_is_the_engine_state_run_to_the_end():
    engine, _ = make_profiles("qwen3-8b")
    lengths = [5, 900, 14336, 3000, 1]
    state = EngineState(engine, 512)
    state.submit([(i, n, 0) for i, n in enumerate(lengths)], 0.0)
    while state.running:
        state.advance_to(state.next_event_s())
    assert engine_rollout(engine, lengths, 512).seconds == state.clock


def test_abort_returns_progress_and_frees_the_batch():
    engine, _ = make_profiles("qwen3-8b")
    state = EngineState(engine, 512)
    state.submit([("a", 1000, 0), ("b", 1000, 200)], 0.0)  # b was migrated with 200 tokens
    start = engine.prefill_s(512) + engine.prefill_s(712)  # a new prompt and a re-prefill
    assert state.clock == pytest.approx(start)
    t = start + engine.advance_s(2, 512 + 712, 100) + 1e-6
    state.advance_to(t)
    assert state.progress() == {"a": 100, "b": 300}
    assert state.abort(["b", "nobody"], t) == {"b": 300}
    assert state.running == 1 and state.progress() == {"a": 100}


def test_submit_validates():
    engine = small_engine(kv_tokens=500)
    state = EngineState(engine, 32)
    with pytest.raises(ValueError, match="does not fit"):
        state.submit([("x", 1000, 0)], 0.0)
    with pytest.raises(ValueError, match="tokens made"):
        state.submit([("y", 10, 10)], 0.0)
