"""The engine computes what transformers computes: greedy tokens identical to HF generate, log-probs
within 1e-3 of an HF forward pass (fp32), with requests of different lengths joining mid-flight."""

import pytest
import torch

from rlboost.engine import EngineConfig, LLMEngine, SamplingParams
from rlboost.engine import model_runner
from rlboost.models import ModelConfig, load_model, tiny_model

from conftest import drive, hf_greedy, hf_logprobs, make_engine, random_prompts

LOGPROB_TOL = 1e-3


def staggered_arrivals(prompts, params):
    """Requests join at different steps: two at once, then one every few steps."""
    arrivals: dict[int, list] = {}
    for i, prompt in enumerate(prompts):
        arrivals.setdefault(0 if i < 2 else 3 * i - 2, []).append((f"r{i}", prompt, params))
    return arrivals


@pytest.mark.parametrize("eos", [None, 2], ids=["no-eos", "eos"])
def test_greedy_matches_hf_generate(family, eos):
    reference = tiny_model(family, seed=1)
    engine = make_engine(family, seed=1, eos=[eos] if eos else [], stream_interval=4)
    prompts = random_prompts([5, 23, 1, 40, 11, 8], seed=7)
    results = drive(engine, staggered_arrivals(prompts, SamplingParams(temperature=0, max_tokens=24)))
    for i, prompt in enumerate(prompts):
        expected = hf_greedy(reference, prompt, 24, eos=eos)
        assert results[f"r{i}"]["tokens"] == expected, f"request r{i} (prompt length {len(prompt)})"


@pytest.mark.parametrize("temperature", [0.0, 1.0, 0.7])
def test_logprobs_match_hf_forward(family, temperature):
    reference = tiny_model(family, seed=2)
    engine = make_engine(family, seed=2)
    prompts = random_prompts([9, 30, 4], seed=3)
    params = SamplingParams(temperature=temperature, top_k=50, top_p=0.9, max_tokens=20, seed=11)
    results = drive(engine, staggered_arrivals(prompts, params))
    for i, prompt in enumerate(prompts):
        r = results[f"r{i}"]
        expected = hf_logprobs(reference, prompt, r["tokens"], temperature)
        err = (torch.tensor(r["logprobs"]) - expected).abs().max().item()
        assert err < LOGPROB_TOL, f"r{i}: max |logprob error| {err:.2e}"


def test_matches_hf_with_plain_torch_linear(family):
    """engine.cpu_linear=torch (F.linear: also the path on CUDA) computes the same."""
    reference = tiny_model(family, seed=3)
    engine = make_engine(family, seed=3, cpu_linear="torch")
    assert engine.runner.linear is torch.nn.functional.linear
    if torch.backends.mkldnn.is_available():
        assert make_engine(family).runner.linear is model_runner._onednn_linear
    prompts = random_prompts([6, 19], seed=4)
    outs = engine.generate(prompts, SamplingParams(temperature=0, max_tokens=16))
    for prompt, out in zip(prompts, outs):
        assert out.token_ids == hf_greedy(reference, prompt, 16)


def test_kv_cache_growth_keeps_numerics(family):
    """Sequences that outgrow the initial KV capacity and more requests than initial slots."""
    reference = tiny_model(family, seed=4)
    engine = make_engine(family, seed=4, kv_cache_init_len=8, max_num_seqs=5)
    prompts = random_prompts([3, 12, 7, 20, 5, 9, 14], seed=5)  # 7 requests, 5 slots: some wait
    outs = engine.generate(prompts, SamplingParams(temperature=0, max_tokens=30))
    assert engine.cache.capacity >= 50 and engine.cache.slots == 5
    for prompt, out in zip(prompts, outs):
        assert out.token_ids == hf_greedy(reference, prompt, 30)


def test_small_prefill_budget_splits_prefill(family):
    reference = tiny_model(family, seed=5)
    engine = make_engine(family, seed=5, max_num_batched_tokens=16)
    prompts = random_prompts([10, 10, 30, 2], seed=6)
    outs = engine.generate(prompts, SamplingParams(temperature=0, max_tokens=8))
    for prompt, out in zip(prompts, outs):
        assert out.token_ids == hf_greedy(reference, prompt, 8)


def chat_prompts(tokenizer, questions):
    prompts = []
    for q in questions:
        ids = tokenizer.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True,
                                            tokenize=True, return_dict=True)["input_ids"]
        prompts.append(list(ids))
    return prompts


def test_smollm2_greedy_and_logprobs_match_hf(smollm2):
    engine_model = load_model(ModelConfig()).model
    engine = LLMEngine(engine_model, EngineConfig(device="cpu", stream_interval=8),
                       eos_token_ids=smollm2.eos_token_ids)
    questions = ["What is 7 times 8?", "Name a colour of the sky.",
                 "Write one sentence about rivers.", "What is the capital of France?"]
    prompts = chat_prompts(smollm2.tokenizer, questions)
    params = SamplingParams(temperature=0, max_tokens=24)
    results = drive(engine, staggered_arrivals(prompts, params))
    for i, prompt in enumerate(prompts):
        r = results[f"r{i}"]
        assert r["tokens"] == hf_greedy(smollm2.model, prompt, 24, eos=smollm2.eos_token_ids), questions[i]
        err = (torch.tensor(r["logprobs"]) - hf_logprobs(smollm2.model, prompt, r["tokens"])).abs().max()
        assert err < LOGPROB_TOL
    assert "Paris" in smollm2.tokenizer.decode(results["r3"]["tokens"])  # a real model, really loaded


@pytest.mark.gpu
def test_cuda_greedy_matches_hf(family):
    reference = tiny_model(family, seed=6).cuda()
    engine = make_engine(family, seed=6, device="cuda")
    prompts = random_prompts([4, 17, 9], seed=8)
    outs = engine.generate(prompts, SamplingParams(temperature=0, max_tokens=20))
    for prompt, out in zip(prompts, outs):
        assert out.token_ids == hf_greedy(reference, prompt, 20)
        err = (torch.tensor(out.logprobs) - hf_logprobs(reference, prompt, out.token_ids)).abs().max()
        assert err < LOGPROB_TOL
