"""Speculative decoding (HistoSpec) in the simulator's engine timing (issue 27, item 4): a verify step is
a forward over draft + 1 tokens per request from the roofline profile, emits 1 + accepted tokens,
and runs only where the budget finds it beats plain decoding; 0 accepted is plain decoding."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from rlboost.config import load_config
from rlboost.sim.baselines import colocated_step
from rlboost.sim.batching import engine_rollout
from rlboost.sim.histospec_table import POLICIES, main as table_main, markdown, rows
from rlboost.sim.profile import make_profiles
from rlboost.sim.simulator import SimConfig, simulate
from rlboost.sim.speculation import SpecConfig, SpeculativeProfile, speculating

PLAIN = {model: make_profiles(model)[0] for model in ("qwen3-8b", "qwen3-14b", "qwen3-32b")}


def spec_of(model: str, accepted: float, draft: float = 4.0, max_batch: int = 256) -> SpeculativeProfile:
    return SpeculativeProfile(PLAIN[model], SpecConfig(accepted, draft, max_batch))


def slow_advance(engine, batch, context, steps):
    return sum(engine.step_s(batch, context + k * batch) for k in range(steps))


def test_a_verify_step_costs_a_decode_step_while_memory_bound_and_draft_plus_one_once_compute_bound():
    plain = PLAIN["qwen3-8b"]
    assert plain.verify_step_s(1, 600, 4.0) == pytest.approx(plain.step_s(1, 600), rel=1e-3)
    # 256 requests at short contexts: the matmuls bind, and a draft of 4 multiplies their time by 5.
    (_, _), (compute, _) = plain.roofline(256)
    assert plain.verify_step_s(256, 256 * 100, 4.0) == pytest.approx(plain.overhead_s + 5 * compute, rel=0.02)
    assert plain.verify_step_s(256, 256 * 100, 0.0) == plain.step_s(256, 256 * 100)


@pytest.mark.parametrize("accepted", [1.0, 2.0, 3.0])
def test_at_batch_one_a_request_of_l_tokens_takes_l_over_one_plus_accepted_verify_steps(accepted):
    spec, plain = spec_of("qwen3-8b", accepted), PLAIN["qwen3-8b"]
    prompt, length = 512, 3000
    verify_steps = length / (1 + accepted)
    # The verify steps one by one: each emits 1 + accepted tokens, at the context it starts from.
    by_hand = sum(plain.verify_step_s(1, prompt + j * (1 + accepted), 4.0) for j in range(int(verify_steps)))
    decode_s = engine_rollout(spec, [length], prompt).seconds - plain.prefill_s(prompt, sequences=1)
    assert decode_s == pytest.approx(by_hand, rel=2e-3)
    assert decode_s / plain.verify_step_s(1, prompt + length / 2, 4.0) == pytest.approx(verify_steps, rel=2e-3)
    # Memory-bound: the whole decode is about 1 + accepted times faster than plain decoding.
    plain_s = engine_rollout(plain, [length], prompt).seconds - plain.prefill_s(prompt, sequences=1)
    assert plain_s / decode_s == pytest.approx(1 + accepted, rel=2e-3)


def test_where_verifying_is_compute_bound_the_budget_drafts_nothing_and_time_is_plain_decoding():
    spec, plain = spec_of("qwen3-8b", 1.0), PLAIN["qwen3-8b"]
    prompt, lengths = 16, [48] * 256  # a full batch at short contexts: the matmuls bind
    contexts = [256 * (prompt + made) for made in range(48)]
    assert not any(spec.drafts(256, c) for c in contexts)
    assert spec.advance_s(256, contexts[0], 48) == pytest.approx(plain.advance_s(256, contexts[0], 48), rel=1e-12)
    assert engine_rollout(spec, lengths, prompt).seconds == pytest.approx(engine_rollout(plain, lengths, prompt).seconds,
                                                                          rel=1e-12)
    # The same batch drafts as soon as the KV reads make it memory-bound again, and is faster there.
    assert spec.drafts(256, 256 * 3000) and spec.step_s(256, 256 * 3000) < plain.step_s(256, 256 * 3000)


def test_above_max_batch_the_engine_never_drafts():
    spec, plain = spec_of("qwen3-8b", 3.0, max_batch=4), PLAIN["qwen3-8b"]
    assert spec.drafts(4, 4 * 2000) and spec.step_s(4, 4 * 2000) < plain.step_s(4, 4 * 2000)
    assert not spec.drafts(5, 5 * 2000)
    assert spec.step_s(5, 5 * 2000) == plain.step_s(5, 5 * 2000)
    assert spec.advance_s(5, 5 * 2000, 300) == plain.advance_s(5, 5 * 2000, 300)


def test_zero_accepted_is_plain_decoding():
    plain = PLAIN["qwen3-14b"]
    zero = spec_of("qwen3-14b", 0.0, draft=8.0)
    rng = random.Random(3)
    for _ in range(50):
        batch, steps = rng.randint(1, 256), rng.randint(1, 3000)
        context = batch * rng.uniform(0, 6000)
        assert not zero.drafts(batch, context)
        assert zero.step_s(batch, context) == pytest.approx(plain.step_s(batch, context), rel=1e-12)
        assert zero.advance_s(batch, context, steps) == pytest.approx(plain.advance_s(batch, context, steps), rel=1e-12)
    lengths = [rng.randint(1, 4000) for _ in range(300)]
    assert engine_rollout(zero, lengths, 512).seconds == pytest.approx(engine_rollout(plain, lengths, 512).seconds,
                                                                       rel=1e-12)
    assert speculating(plain, SpecConfig()) is plain  # the default: runs without HistoSpec are unchanged


# The closed form: every stretch, including ones where the budget switches drafting on mid-way.
ADVANCE_CASES = [
    ("qwen3-8b", 1.0, 4.0, 256, 256 * 16, 3000),   # compute-bound first (no drafting), then drafting
    ("qwen3-8b", 3.0, 8.0, 1, 0, 5000),
    ("qwen3-14b", 2.0, 4.0, 100, 100 * 300, 2000),
    ("qwen3-32b", 1.0, 4.0, 256, 256 * 500, 1500),
    ("qwen3-32b", 2.5, 3.0, 17, 17 * 9000.5, 777),
    ("qwen3-8b", 0.5, 8.0, 200, 200 * 10, 1),
]


@pytest.mark.parametrize("model, accepted, draft, batch, context, steps", ADVANCE_CASES)
def test_advance_equals_the_sum_of_steps(model, accepted, draft, batch, context, steps):
    spec = spec_of(model, accepted, draft)
    assert spec.advance_s(batch, context, steps) == pytest.approx(slow_advance(spec, batch, context, steps), rel=1e-9)
    whole = spec.advance_s(batch, context, steps)
    cut = steps // 3
    parts = spec.advance_s(batch, context, cut) + spec.advance_s(batch, context + cut * batch, steps - cut)
    assert whole == pytest.approx(parts, rel=1e-12)


def test_the_cases_switch_drafting_on_within_a_stretch():
    # Else the closed form's breaks would go untested.
    spec = spec_of("qwen3-8b", 1.0)
    assert not spec.drafts(256, 256 * 16) and spec.drafts(256, 256 * (16 + 2999))


def test_steps_within_inverts_advance_while_speculating():
    rng = random.Random(11)
    for model in PLAIN:
        spec = spec_of(model, rng.choice([1.0, 2.0, 3.0]))
        for _ in range(30):
            batch = rng.randint(1, 256)
            context = batch * rng.uniform(0, 8000)
            seconds = rng.uniform(0, 60)
            k = spec.steps_within(batch, context, seconds)
            assert spec.advance_s(batch, context, k) <= seconds < spec.advance_s(batch, context, k + 1)


def test_verl_rolls_out_faster_and_trains_the_same():
    plain, train = make_profiles("qwen3-8b")
    lengths = [random.Random(5).randint(100, 6000) for _ in range(1024)]
    base = colocated_step(plain, train, lengths, 512, 4, 8)
    fast = colocated_step(spec_of("qwen3-8b", 2.0), train, lengths, 512, 4, 8)
    assert fast["train_s"] == base["train_s"] and fast["tokens"] == base["tokens"]
    assert base["rollout_s"] / 3.05 < fast["rollout_s"] < base["rollout_s"] / 2


def test_a_run_with_histospec_conserves_tokens_and_is_faster():
    base = SimConfig(policy="rlboost", segment="A", duration_s=600.0)
    plain = simulate(base)
    fast = simulate(replace(base, histospec=SpecConfig(accepted_per_verify=2.0)))
    for r in (plain, fast):
        assert r.tokens_generated == r.tokens + r.wasted_tokens + r.recomputed_tokens
    assert fast.throughput_tokens_per_s > 1.1 * plain.throughput_tokens_per_s
    assert simulate(replace(base, histospec=SpecConfig(draft_tokens=8.0))).throughput_tokens_per_s == \
        plain.throughput_tokens_per_s  # 0 accepted: off


@pytest.mark.parametrize("override, message", [
    ("histospec.accepted_per_verify=-1", "simulate.histospec.accepted_per_verify must be finite and >= 0, got -1"),
    ("histospec.accepted_per_verify=5", "simulate.histospec.accepted_per_verify (5.0) cannot exceed draft_tokens (4.0)"),
    ("histospec.draft_tokens=0", "simulate.histospec.draft_tokens must be finite and > 0, got 0"),
    ("histospec.max_batch=-1", "simulate.histospec.max_batch must be >= 0, got -1"),
])
def test_config_is_validated(override, message):
    cfg = load_config(SimConfig, overrides=[override])
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        cfg.validate()


def test_a_config_built_in_code_refuses_nan_too():
    # the loader refuses nan for every float (test_config walks SimConfig); code that builds the
    # dataclass directly, like the docs table, goes through validate()
    with pytest.raises(ValueError, match="accepted_per_verify must be finite"):
        SpecConfig(accepted_per_verify=float("nan")).validate()


def test_the_docs_table_compares_each_policy_with_and_without_histospec():
    # `python -m rlboost.sim.histospec_table` makes docs/simulator.md's table from these rows.
    base = SimConfig(duration_s=600.0)
    table = rows(base, [2.0], ["qwen3-8b"], "A")
    assert [(r["policy"], r["accepted_per_verify"]) for r in table] == [(p, a) for a in (0.0, 2.0) for p in POLICIES]
    spec = SpecConfig(accepted_per_verify=2.0)
    uncapped = replace(base, offload=replace(base.offload, enforce_cap=False), histospec=spec)
    runs = {("verl", 0.0): simulate(replace(base, policy="verl")), ("verl", 2.0): simulate(replace(base, policy="verl",
            histospec=spec)), ("rlboost", 0.0): simulate(base), ("rlboost", 2.0): simulate(replace(base, histospec=spec)),
            ("rlboost-uncapped", 2.0): simulate(uncapped)}
    for (policy, a), run in runs.items():
        r = next(r for r in table if (r["policy"], r["accepted_per_verify"]) == (policy, a))
        assert r["throughput_tokens_per_s"] == run.throughput_tokens_per_s
        assert r["cost_efficiency_rel_verl"] == run.relative_to(runs[("verl", 0.0)])["cost_efficiency"]
        assert r["throughput_rel_verl_same"] == run.relative_to(runs[("verl", a)])["throughput"]
    boosted = table[4]
    assert boosted["throughput_rel_without"] == pytest.approx(
        runs[("rlboost", 2.0)].throughput_tokens_per_s / runs[("rlboost", 0.0)].throughput_tokens_per_s, rel=1e-12)
    assert boosted["engine_speedup"]["batch 256, 4000 tokens"] == pytest.approx(3.0, rel=1e-3)
    assert markdown(table).splitlines()[6].startswith("| qwen3-8b | rlboost | 2 (draft 4) |")


@pytest.mark.parametrize("argv, message", [
    (["--accepted", "lots"], "error: --accepted: 'lots' is not a number of tokens per verify step"),
    (["--accepted", "nan"], "error: simulate.histospec.accepted_per_verify must be finite and >= 0, got nan"),
    (["--accepted", "3", "--draft-tokens", "2"], "error: simulate.histospec.accepted_per_verify (3.0) cannot exceed"),
])
def test_the_docs_table_refuses_bad_input_before_any_run_in_one_line(argv, message, capsys, monkeypatch):
    monkeypatch.setattr("rlboost.sim.histospec_table.evaluate", lambda *a, **k: pytest.fail("ran before refusing"))
    assert table_main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and len(captured.err.splitlines()) == 1 and captured.err.startswith(message)
