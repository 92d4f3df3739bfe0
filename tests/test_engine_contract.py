"""The engine contract (DESIGN.md 2.1, `rlboost.engine.protocol`), one suite for every backend: rlboost's
own engine and vLLM (marked `vllm`: run when vLLM is installed, skipped with one line saying how
otherwise). Both serve the same tiny Qwen3 (seeded) and are held to HF transformers' greedy tokens and
the trainer's log-probs (log_softmax(logits / T) of one forward pass over the sequence)."""

from __future__ import annotations

import pytest
import torch

from rlboost.engine import EngineConfig, EngineStateError, InvalidRequestError, LLMEngine, SamplingParams
from rlboost.engine.protocol import EngineBackend
from rlboost.models import ModelConfig, load_model

from conftest import hf_greedy, hf_logprobs, random_prompts

FAMILY = "qwen3"  # head_dim 32: a size vLLM's CPU attention supports (tiny Llama's 16 is not)
MAX_LEN = 64
BACKENDS = ["rlboost", pytest.param("vllm", marks=pytest.mark.vllm)]


def tiny(seed: int = 0):
    """The tiny model `tiny:qwen3` names (its vocabulary is the byte tokenizer's 259 ids)."""
    return load_model(ModelConfig(path=f"tiny:{FAMILY}", seed=seed)).model


@pytest.fixture(scope="module")
def reference():
    return tiny()


@pytest.fixture(scope="module")
def vllm_engine(tmp_path_factory):
    """One vLLM engine for the module (it takes seconds to start); each test gets it idle."""
    from rlboost.engine.factory import make_engine

    with pytest.MonkeyPatch.context() as env:  # the tiny model's folder goes here, for this module only
        env.setenv("RLBOOST_CACHE", str(tmp_path_factory.mktemp("cache")))
        engine = make_engine(ModelConfig(path=f"tiny:{FAMILY}"),
                             EngineConfig(backend="vllm", device="cpu", max_model_len=MAX_LEN, max_num_seqs=8))
    yield engine
    engine.shutdown()


@pytest.fixture(params=BACKENDS)
def engine(request, reference):
    if request.param == "rlboost":
        yield LLMEngine(tiny(), EngineConfig(device="cpu", max_model_len=MAX_LEN, max_num_seqs=8))
        return
    engine = request.getfixturevalue("vllm_engine")
    yield engine
    # leave it as the next test expects: idle, awake, the reference weights, the default interval
    engine.abort(list(engine.progress()))
    engine.wake()
    engine.config.stream_interval = EngineConfig().stream_interval
    if engine.weight_version != 0:
        engine.load_weights(dict(reference.named_parameters()), version=0)


def run(engine, requests, steps=None):
    """Add (id, prompt, params) requests, step (until every request in the engine ends, or `steps`
    times); the chunks per request."""
    for rid, prompt, params in requests:
        engine.add(rid, prompt, params)
    chunks = {rid: [] for rid, _, _ in requests}
    n = 0
    while engine.has_unfinished() and (steps is None or n < steps):
        for c in engine.step():
            chunks.setdefault(c.request_id, []).append(c)
        n += 1
    return chunks


def tokens_of(chunks):
    return [t for c in chunks for t in c.token_ids], [lp for c in chunks for lp in c.logprobs]


def test_is_an_engine_backend(engine):
    assert isinstance(engine, EngineBackend)


def test_it_says_whether_its_kv_cache_binds_before_its_sequences(engine):
    """vLLM's blocks hold a number of tokens that long samples fill before max_num_seqs do (at least one
    full context); rlboost's cache grows per sequence up to max_model_len, for every one: None."""
    if isinstance(engine, LLMEngine):
        assert engine.kv_capacity_tokens is None
    else:
        assert isinstance(engine.kv_capacity_tokens, int) and engine.kv_capacity_tokens >= MAX_LEN


@pytest.mark.parametrize("interval", [1, 3])
def test_streaming_bounded_chunks_greedy_equals_hf(engine, reference, interval):
    engine.config.stream_interval = interval
    prompts = random_prompts([5, 12, 7], seed=1)
    greedy = SamplingParams(temperature=0, max_tokens=11)
    chunks = run(engine, [(f"r{i}", p, greedy) for i, p in enumerate(prompts)])
    for i, prompt in enumerate(prompts):
        cs = chunks[f"r{i}"]
        assert all(1 <= len(c.token_ids) <= interval and len(c.logprobs) == len(c.token_ids) for c in cs)
        assert all(len(c.token_ids) == interval for c in cs[:-1]), "no token held back past the interval"
        assert [c.offset for c in cs] == [sum(len(c.token_ids) for c in cs[:j]) for j in range(len(cs))]
        assert [c.finished for c in cs] == [False] * (len(cs) - 1) + [True]
        assert cs[-1].finish_reason == "length" and {c.weight_version for c in cs} == {engine.weight_version}
        tokens, logprobs = tokens_of(cs)
        assert tokens == hf_greedy(reference, prompt, 11)
        # greedy: log_softmax of the raw logits
        assert logprobs == pytest.approx(hf_logprobs(reference, prompt, tokens).tolist(), abs=1e-4)


def test_sampled_logprobs_are_what_the_trainer_recomputes(engine, reference):
    """log_softmax(logits / T) of the sampled token, T != 1: the PPO ratio's behaviour log-prob."""
    prompts = random_prompts([6, 9], seed=4)
    params = [SamplingParams(temperature=0.7, max_tokens=20, seed=11 + i) for i in range(2)]
    chunks = run(engine, [(f"s{i}", p, params[i]) for i, p in enumerate(prompts)])
    again = run(engine, [(f"t{i}", p, params[i]) for i, p in enumerate(prompts)])
    for i, prompt in enumerate(prompts):
        tokens, logprobs = tokens_of(chunks[f"s{i}"])
        assert len(tokens) == 20 and tokens_of(again[f"t{i}"])[0] == tokens, "same seed, same sample"
        expected = hf_logprobs(reference, prompt, tokens, temperature=0.7)
        assert logprobs == pytest.approx(expected.tolist(), abs=1e-4)
    assert tokens_of(chunks["s0"])[0] != hf_greedy(reference, prompts[0], 20), "it sampled"


def test_stop_token_ends_the_response_and_is_included(engine, reference):
    prompt = random_prompts([8], seed=7)[0]
    free = hf_greedy(reference, prompt, 12)
    stop = free[5]
    chunks = run(engine, [("s", prompt, SamplingParams(temperature=0, max_tokens=12, stop_token_ids=(stop,)))])["s"]
    assert tokens_of(chunks)[0] == free[: free.index(stop) + 1]
    assert chunks[-1].finished and chunks[-1].finish_reason == "stop"


def test_abort_returns_exact_partials_survivors_undisturbed(engine, reference):
    engine.config.stream_interval = 4
    prompts = random_prompts([6, 15, 9], seed=2)
    greedy = SamplingParams(temperature=0, max_tokens=25)
    expected = [hf_greedy(reference, p, 25) for p in prompts]
    chunks = run(engine, [(f"r{i}", p, greedy) for i, p in enumerate(prompts)], steps=10)
    progress = engine.progress()
    partials = engine.abort(["r1", "r2", "never-added"])
    assert set(partials) == {"r1", "r2"}
    for rid in ("r1", "r2"):
        i, out = int(rid[1]), partials[rid]
        streamed = sum(len(c.token_ids) for c in chunks[rid])
        assert out.token_ids == expected[i][: len(out.token_ids)] and len(out.token_ids) == progress[rid]
        assert 0 <= len(out.token_ids) - streamed < 4, "what was not streamed stays below the interval"
        assert out.token_ids[:streamed] == tokens_of(chunks[rid])[0]
        assert out.logprobs == pytest.approx(hf_logprobs(reference, prompts[i], out.token_ids).tolist(), abs=1e-4)
        assert out.prompt_token_ids == prompts[i] and out.weight_version == engine.weight_version
    while engine.has_unfinished():
        for c in engine.step():
            chunks[c.request_id].append(c)
    assert tokens_of(chunks["r0"])[0] == expected[0]
    assert engine.abort(["r0"]) == {}, "a finished request has nothing to hand back"


@pytest.mark.parametrize("temperature", [0.0, 1.0], ids=["greedy", "sampled"])
def test_resume_as_prompt_plus_partial(engine, reference, temperature):
    """Invariant 3 on every backend: right prefix, max_tokens overall, log-probs aligned; exact under
    greedy decoding, and sampled too where the backend says `exact_continuation`."""
    prompts = random_prompts([7, 11], seed=3)
    params = [SamplingParams(temperature=temperature, max_tokens=24, seed=50 + i) for i in range(2)]
    uninterrupted = run(engine, [(f"u{i}", p, params[i]) for i, p in enumerate(prompts)])
    run(engine, [(f"a{i}", p, params[i]) for i, p in enumerate(prompts)], steps=6)
    partials = engine.abort(["a0", "a1"])
    resumed = {}
    for i, prompt in enumerate(prompts):
        out = partials[f"a{i}"]
        assert 0 < len(out.token_ids) < 24
        rest = SamplingParams(temperature=temperature, max_tokens=24 - len(out.token_ids), seed=out.seed)
        engine.add(f"b{i}", prompt + out.token_ids, rest, prompt_len=len(prompt))
        resumed[i] = out
    chunks = run(engine, [])  # to the end of the resumed requests
    for i, prompt in enumerate(prompts):
        out = resumed[i]
        tokens, logprobs = tokens_of(chunks[f"b{i}"])
        full, full_logprobs = out.token_ids + tokens, out.logprobs + logprobs
        assert len(full) == 24, "max_tokens respected overall"
        assert full[: len(out.token_ids)] == tokens_of(uninterrupted[f"u{i}"])[0][: len(out.token_ids)]
        # every log-prob is the trainer's for its token, across the seam
        assert full_logprobs == pytest.approx(
            hf_logprobs(reference, prompt, full, temperature=temperature).tolist(), abs=1e-4)
        if temperature == 0 or engine.exact_continuation:
            assert full == tokens_of(uninterrupted[f"u{i}"])[0]


# What one RL step moves in a patched version: a few tensors, among them ones vLLM holds differently.
MOVED = ["model.embed_tokens.weight",               # tied: the LM head moves with it
         "model.layers.0.self_attn.q_proj.weight",  # part of vLLM's fused qkv_proj
         "model.layers.1.mlp.up_proj.weight"]       # part of vLLM's fused gate_up_proj


def next_version(state, seed):
    """`state` with the MOVED tensors changed: a complete new version."""
    gen = torch.Generator().manual_seed(seed)
    return {n: t + 0.05 * torch.randn(t.shape, generator=gen) if n in MOVED else t.clone() for n, t in state.items()}


def served(engine, prompts, max_tokens=12):
    """Greedy token ids and log-probs of each prompt, generated by `engine`."""
    chunks = run(engine, [(f"g{i}", p, SamplingParams(temperature=0, max_tokens=max_tokens))
                          for i, p in enumerate(prompts)])
    return [tokens_of(chunks[f"g{i}"]) for i in range(len(prompts))]


@pytest.mark.parametrize("embedding_name", ["model.embed_tokens.weight", "lm_head.weight"])
def test_partial_load_serves_what_a_full_load_serves(engine, embedding_name):
    v1 = {n: p.detach().clone() for n, p in tiny(seed=9).named_parameters()}
    v2 = next_version(v1, seed=1)
    names = [embedding_name if n == "model.embed_tokens.weight" else n for n in MOVED]  # a tied weight by either name
    prompts = random_prompts([5, 13], seed=2)
    engine.load_weights(v1, version=1)
    on_v1 = served(engine, prompts)
    engine.load_weights(v2, version=2, names=names)
    assert engine.weight_version == 2
    partial = served(engine, prompts)
    engine.load_weights(v2, version=2)
    assert partial == served(engine, prompts), "a partial load serves exactly what a full load of v2 serves"
    assert [tokens for tokens, _ in partial] != [tokens for tokens, _ in on_v1]
    v2_model = tiny()
    v2_model.load_state_dict(v2, strict=False)  # tied: lm_head is the embedding
    assert [tokens for tokens, _ in partial] == [hf_greedy(v2_model, p, 12) for p in prompts]


def test_partial_load_copies_only_the_names(engine):
    v1 = {n: p.detach().clone() for n, p in tiny(seed=9).named_parameters()}
    prompts = random_prompts([5, 13], seed=2)
    engine.load_weights(v1, version=1)
    on_v1 = served(engine, prompts)
    engine.load_weights(next_version(v1, seed=1), version=2, names=MOVED[1:])
    without_embedding = served(engine, prompts)
    engine.load_weights(next_version(v1, seed=1), version=3, names=[])  # nothing named: only the tag moves
    assert engine.weight_version == 3
    assert served(engine, prompts) == without_embedding != on_v1
    engine.load_weights(v1, version=4, names=MOVED[1:])  # back to v1: the embedding never left it
    assert served(engine, prompts) == on_v1


def test_partial_load_refuses_unknown_names_and_an_incomplete_state(engine):
    state = dict(tiny(seed=9).named_parameters())
    with pytest.raises(ValueError, match=r"names \['model.layers.0.mlp.nope.weight'\] are not parameters"):
        engine.load_weights(state, version=3, names=["model.norm.weight", "model.layers.0.mlp.nope.weight"])
    incomplete = {k: v for k, v in state.items() if k != "model.layers.1.mlp.up_proj.weight"}
    with pytest.raises(ValueError, match=r"missing keys \['model.layers.1.mlp.up_proj.weight'\].*whole version"):
        engine.load_weights(incomplete, version=3, names=["model.layers.1.mlp.up_proj.weight"])
    assert engine.weight_version == 0, "a refused load keeps the version"


def test_load_weights_in_place_refused_mid_request(engine):
    new = tiny(seed=9)
    state = dict(new.named_parameters())  # tied embeddings once, as the trainer publishes them
    prompts = random_prompts([5, 13], seed=2)
    engine.add("busy", prompts[0], SamplingParams(max_tokens=4))
    with pytest.raises(EngineStateError, match="1 requests are unfinished"):
        engine.load_weights(state, version=3)
    engine.abort(["busy"])
    with pytest.raises(ValueError, match="missing keys"):
        engine.load_weights({k: v for k, v in state.items() if "layers.1." not in k}, version=3)
    bad = dict(state)
    bad["model.norm.weight"] = torch.zeros(3)
    with pytest.raises(ValueError, match="model.norm.weight"):
        engine.load_weights(bad, version=3)
    assert engine.weight_version == 0, "a refused swap keeps the version"
    engine.load_weights(state, version=3)
    assert engine.weight_version == 3
    greedy = SamplingParams(temperature=0, max_tokens=12)
    chunks = run(engine, [(f"r{i}", p, greedy) for i, p in enumerate(prompts)])
    for i, p in enumerate(prompts):
        assert tokens_of(chunks[f"r{i}"])[0] == hf_greedy(new, p, 12)
        assert {c.weight_version for c in chunks[f"r{i}"]} == {3}


BAD_REQUESTS = [
    (list(range(3, 3 + MAX_LEN)), SamplingParams(), f"prompt has {MAX_LEN} tokens but the context is {MAX_LEN}"),
    ([5, 300, 7], SamplingParams(), "token id 300 at prompt position 1 is outside the vocabulary"),
    ([5, 2.5], SamplingParams(), "prompt_token_ids must be integers"),
    ([], SamplingParams(), "empty prompt"),
    ([5, 6], SamplingParams(temperature=-1), "temperature must be"),
    ([5, 6], SamplingParams(top_p=0.0), "top_p must be in (0, 1]"),
    ([5, 6], SamplingParams(max_tokens=0), "max_tokens must be"),
]


def test_bad_requests_named_others_unaffected(engine, reference):
    good = random_prompts([6], seed=1)[0]
    greedy = SamplingParams(temperature=0, max_tokens=12)
    engine.add("good", good, greedy)
    engine.step()
    for prompt, params, message in BAD_REQUESTS:
        with pytest.raises(InvalidRequestError) as err:
            engine.add("bad", prompt, params)
        assert "request 'bad'" in str(err.value) and message in str(err.value)
    with pytest.raises(InvalidRequestError, match="request 'good': a request with this id is already"):
        engine.add("good", good, greedy)
    chunks = run(engine, [])  # to the end of the good request
    assert engine.progress() == {}
    # its first token was made before the bad requests but not yet chunked (fewer than the interval)
    assert tokens_of(chunks["good"])[0] == hf_greedy(reference, good, 12)


def test_sleep_refuses_work_until_wake(engine):
    engine.add("x", [5, 6, 7], SamplingParams(max_tokens=3))
    with pytest.raises(EngineStateError, match="sleep"):
        engine.sleep()
    engine.abort(["x"])
    engine.sleep()
    assert engine.asleep
    with pytest.raises(EngineStateError, match="asleep"):
        engine.add("y", [5, 6], SamplingParams(max_tokens=3))
    engine.wake()
    chunks = run(engine, [("y", [5, 6], SamplingParams(max_tokens=3))])
    assert len(tokens_of(chunks["y"])[0]) == 3
