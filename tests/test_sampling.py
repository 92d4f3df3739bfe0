"""Sampling: correct distributions after temperature/top-k/top-p, draws that depend only on
(seed, position), and log-probs of the untruncated tempered distribution."""

import math

import pytest
import torch

from rlboost.engine import SamplingParams
from rlboost.engine.rng import derive_seed, uniform
from rlboost.engine.sampler import sample

from conftest import make_engine, random_prompts

LOGITS = torch.tensor([2.0, 1.5, 1.0, 0.5, 0.0, -0.5, -1.0, -3.0])


def empirical(params: SamplingParams, n: int = 20000) -> torch.Tensor:
    logits = LOGITS.repeat(n, 1)
    tokens, _ = sample(logits, [params] * n, [uniform(s, 0) for s in range(n)])
    return torch.bincount(torch.tensor(tokens), minlength=len(LOGITS)).double() / n


def expected(temperature: float, top_k: int = 0, top_p: float = 1.0) -> torch.Tensor:
    probs = torch.softmax(LOGITS.double() / temperature, -1)
    order = probs.argsort(descending=True)
    keep = torch.zeros_like(probs, dtype=torch.bool)
    mass = 0.0
    for rank, i in enumerate(order.tolist()):
        if (top_k and rank >= top_k) or mass >= top_p:
            break
        keep[i] = True
        mass += probs[i].item()
    probs = torch.where(keep, probs, 0.0)
    return probs / probs.sum()


@pytest.mark.parametrize("temperature,top_k,top_p", [(1.0, 0, 1.0), (0.5, 0, 1.0), (1.3, 3, 1.0),
                                                    (1.0, 0, 0.8), (0.8, 5, 0.6)])
def test_sampled_frequencies_match_distribution(temperature, top_k, top_p):
    freq = empirical(SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p))
    target = expected(temperature, top_k, top_p)
    assert torch.all(freq[target == 0] == 0), "a truncated token was sampled"
    # 20000 draws: the standard error of each frequency is below 0.0036; allow about 4 sigma.
    assert (freq - target).abs().max() < 0.015


def test_logprob_is_of_untruncated_tempered_distribution():
    params = SamplingParams(temperature=0.5, top_k=1)
    tokens, logprobs = sample(LOGITS[None], [params], [0.3])
    assert tokens == [0]
    assert logprobs[0] == pytest.approx(torch.log_softmax(LOGITS / 0.5, -1)[0].item(), abs=1e-6)
    greedy_tokens, greedy_lp = sample(LOGITS[None], [SamplingParams(temperature=0)], [0.3])
    assert greedy_lp[0] == pytest.approx(torch.log_softmax(LOGITS, -1)[0].item(), abs=1e-6)


def test_uniform_is_a_pure_function_of_seed_and_position():
    draws = [uniform(3, t) for t in range(1000)]
    assert draws == [uniform(3, t) for t in range(1000)]
    assert all(0.0 < u < 1.0 for u in draws)
    assert abs(sum(draws) / len(draws) - 0.5) < 0.03
    assert uniform(3, 5) != uniform(4, 5) and uniform(3, 5) != uniform(3, 6) and uniform(3, 5, 1) != uniform(3, 5)
    assert derive_seed(0, 1) != derive_seed(0, 2) and 0 <= derive_seed(0, 1) < 2**63


def test_same_seed_same_tokens_regardless_of_batch_company():
    prompts = random_prompts([7, 4, 11, 5], seed=9)
    params = SamplingParams(temperature=1.0, max_tokens=16, seed=42)
    alone = make_engine("qwen3").generate(prompts[:1], params)[0]
    crowded = make_engine("qwen3").generate(prompts, params)[0]
    assert alone.token_ids == crowded.token_ids
    other_seed = make_engine("qwen3").generate(prompts[:1], SamplingParams(temperature=1.0, max_tokens=16, seed=43))[0]
    assert other_seed.token_ids != alone.token_ids


def test_unseeded_requests_get_distinct_reported_seeds():
    engine = make_engine("llama")
    outs = engine.generate([[5, 6, 7]] * 3, SamplingParams(temperature=1.0, max_tokens=12))
    assert len({o.seed for o in outs}) == 3
    assert len({tuple(o.token_ids) for o in outs}) > 1
    replay = make_engine("llama").generate([[5, 6, 7]], SamplingParams(temperature=1.0, max_tokens=12, seed=outs[1].seed))[0]
    assert replay.token_ids == outs[1].token_ids


def test_top_k_one_and_tiny_top_p_are_greedy():
    prompts = random_prompts([6, 9], seed=4)
    greedy = make_engine("qwen2").generate(prompts, SamplingParams(temperature=0, max_tokens=12))
    for params in (SamplingParams(temperature=1.5, top_k=1, max_tokens=12),
                   SamplingParams(temperature=1.5, top_p=1e-9, max_tokens=12)):
        outs = make_engine("qwen2").generate(prompts, params)
        assert [o.token_ids for o in outs] == [g.token_ids for g in greedy]
        assert all(not math.isclose(a, b) for o, g in zip(outs, greedy) for a, b in zip(o.logprobs[:1], g.logprobs[:1]))
