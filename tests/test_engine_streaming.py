"""Tokens stream back in chunks of at most stream_interval, contiguous, tagged, ending exactly once."""

import pytest

from rlboost.engine import EngineConfig, LLMEngine, SamplingParams
from rlboost.models import tiny_model

from conftest import drive, make_engine, random_prompts


@pytest.mark.parametrize("interval", [1, 3, 8])
def test_chunks_bounded_contiguous_and_complete(interval):
    engine = make_engine("qwen3", stream_interval=interval)
    prompts = random_prompts([5, 12, 7], seed=1)
    params = SamplingParams(temperature=0.8, max_tokens=19, seed=5)
    results = drive(engine, {0: [(f"r{i}", p, params) for i, p in enumerate(prompts)]})
    reference = make_engine("qwen3").generate(prompts, params)
    for i, ref in enumerate(reference):
        r = results[f"r{i}"]
        chunks = r["chunks"]
        assert all(1 <= len(c.token_ids) <= interval for c in chunks)
        assert all(len(c.token_ids) == len(c.logprobs) for c in chunks)
        assert [c.finished for c in chunks] == [False] * (len(chunks) - 1) + [True]
        # Every chunk but the last is full: tokens are not held back longer than the interval.
        assert all(len(c.token_ids) == interval for c in chunks[:-1])
        assert r["tokens"] == ref.token_ids and r["logprobs"] == ref.logprobs
        assert r["finish_reason"] == "length" and len(r["tokens"]) == 19


def test_chunks_carry_weight_version():
    engine = LLMEngine(tiny_model("llama"), EngineConfig(device="cpu"), weight_version=7)
    results = drive(engine, {0: [("a", [5, 6, 7], SamplingParams(max_tokens=10))]})
    assert {c.weight_version for c in results["a"]["chunks"]} == {7}


def test_stop_token_ends_and_is_included():
    engine = make_engine("llama", seed=3)
    free = engine.generate([[10, 20, 30]], SamplingParams(temperature=0, max_tokens=12))[0].token_ids
    stop = free[4]
    cut = free.index(stop)
    out = engine.generate([[10, 20, 30]], SamplingParams(temperature=0, max_tokens=12, stop_token_ids=(stop,)))[0]
    assert out.token_ids == free[: cut + 1] and out.finish_reason == "stop"


def test_eos_stops_unless_ignored():
    engine = make_engine("llama", seed=3)
    free = engine.generate([[10, 20, 30]], SamplingParams(temperature=0, max_tokens=12))[0].token_ids
    eos_engine = make_engine("llama", seed=3, eos=[free[2]])
    stopped = eos_engine.generate([[10, 20, 30]], SamplingParams(temperature=0, max_tokens=12))[0]
    assert stopped.token_ids == free[: free.index(free[2]) + 1] and stopped.finish_reason == "stop"
    ignored = eos_engine.generate([[10, 20, 30]], SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))[0]
    assert ignored.token_ids == free and ignored.finish_reason == "length"


def test_generation_stops_at_context_end():
    engine = make_engine("qwen2", max_model_len=20)
    out = engine.generate([list(range(3, 18))], SamplingParams(max_tokens=100))[0]
    assert len(out.token_ids) == 5 and out.finish_reason == "length"


@pytest.mark.parametrize("interval", [1, 4, 8])
def test_unstreamed_tokens_stay_below_interval(interval):
    """Invariant 4's engine half: a worker dying now loses fewer than stream_interval tokens per request,
    because everything older has already been streamed."""
    prompts = random_prompts([4, 9, 6, 13], seed=3)
    for abort_after in (1, 2, 5, 9, 14):
        engine = make_engine("llama", stream_interval=interval)
        for i, p in enumerate(prompts):
            engine.add(f"r{i}", p, SamplingParams(temperature=1.0, max_tokens=40, seed=i))
        streamed = {f"r{i}": 0 for i in range(len(prompts))}
        for _ in range(abort_after):
            for chunk in engine.step():
                streamed[chunk.request_id] += len(chunk.token_ids)
        for rid, partial in engine.abort(list(streamed)).items():
            assert 0 <= len(partial.token_ids) - streamed[rid] < interval
