"""abort() returns the exact partial output; prompt + partial resubmitted continues exactly (invariant 3)."""

import pytest

from rlboost.engine import SamplingParams

from conftest import make_engine, random_prompts


def run_until(engine, steps):
    chunks = []
    for _ in range(steps):
        chunks += engine.step()
    return chunks


@pytest.mark.parametrize("temperature", [0.0, 1.0], ids=["greedy", "sampled"])
def test_abort_then_resume_equals_uninterrupted(family, temperature):
    prompts = random_prompts([6, 15, 9, 3], seed=2)
    params = [SamplingParams(temperature=temperature, top_p=0.95, max_tokens=25, seed=100 + i) for i in range(4)]
    reference = make_engine(family, seed=1).generate(prompts, params)

    engine = make_engine(family, seed=1, stream_interval=4)
    for i, (prompt, p) in enumerate(zip(prompts, params)):
        engine.add(f"r{i}", prompt, p)
    streamed = run_until(engine, 9)  # 1 prefill + 8 decode steps: 9 tokens each, 8 streamed
    partial = engine.abort(["r1", "r3"])
    assert set(partial) == {"r1", "r3"}
    for rid in ("r1", "r3"):
        i = int(rid[1])
        out = partial[rid]
        # Exact partial output: every token so far, including the one not yet streamed.
        assert out.token_ids == reference[i].token_ids[:9]
        assert out.logprobs == pytest.approx(reference[i].logprobs[:9], abs=1e-5)
        assert sum(len(c.token_ids) for c in streamed if c.request_id == rid) == 8
        assert out.seed == params[i].seed and out.prompt_token_ids == prompts[i]

    # The survivors keep going undisturbed (their slots were compacted under them).
    while engine.has_unfinished():
        streamed += engine.step()
    for i in (0, 2):
        tokens = [t for c in streamed if c.request_id == f"r{i}" for t in c.token_ids]
        assert tokens == reference[i].token_ids

    # Resume the aborted ones elsewhere: a fresh engine, prompt + partial, max_tokens reduced.
    other = make_engine(family, seed=1)
    for rid in ("r1", "r3"):
        i, out = int(rid[1]), partial[rid]
        p = SamplingParams(temperature=temperature, top_p=0.95, max_tokens=25 - len(out.token_ids), seed=out.seed)
        rest = other.generate([out.prompt_token_ids + out.token_ids], p)[0]
        assert out.token_ids + rest.token_ids == reference[i].token_ids
        assert out.logprobs + rest.logprobs == pytest.approx(reference[i].logprobs, abs=1e-4)


def test_abort_waiting_and_unknown_requests():
    engine = make_engine("llama", max_num_seqs=1)
    engine.add("running", [5, 6], SamplingParams(max_tokens=5))
    engine.add("queued", [7, 8], SamplingParams(max_tokens=5))
    engine.step()
    assert engine.num_running == 1 and engine.num_waiting == 1
    out = engine.abort(["queued", "never-added"])
    assert list(out) == ["queued"] and out["queued"].token_ids == []
    assert engine.num_waiting == 0
    while engine.has_unfinished():
        engine.step()
    assert engine.abort(["running"]) == {}  # finished already: nothing to hand back


def test_aborted_id_can_be_reused():
    engine = make_engine("qwen2")
    engine.add("x", [5, 6, 7], SamplingParams(temperature=0, max_tokens=6))
    engine.step()
    engine.abort(["x"])
    engine.add("x", [5, 6, 7], SamplingParams(temperature=0, max_tokens=6))
    while engine.has_unfinished():
        engine.step()
    assert engine.num_running == 0
