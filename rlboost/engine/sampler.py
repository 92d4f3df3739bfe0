"""Turn next-token logits into tokens and their log-probs, per request, without generator state.

Log-probs are those the trainer recomputes: log_softmax(logits / temperature), or of the raw logits
when greedy, taken before top-k/top-p truncation. Sampling is by inverse CDF on the truncated,
renormalised distribution with one uniform per token from `rng.uniform(seed, position)`, so a draw
depends on nothing but the logits and (seed, position).
"""

from __future__ import annotations

import torch

from rlboost.engine.sampling_params import SamplingParams


def sample(
    logits: torch.Tensor, params: list[SamplingParams], uniforms: list[float]
) -> tuple[list[int], list[float]]:
    """logits: [B, V]; params and uniforms: one per row. Returns (tokens, logprobs) as Python lists."""
    logits = logits.float()
    temperatures = torch.tensor([p.temperature or 1.0 for p in params], device=logits.device)
    scaled = logits / temperatures[:, None]
    logprobs_all = torch.log_softmax(scaled, dim=-1)
    tokens = scaled.argmax(dim=-1)

    rows = [i for i, p in enumerate(params) if not p.greedy]
    if rows:
        index = torch.tensor(rows, device=logits.device)
        u = torch.tensor([uniforms[i] for i in rows], dtype=torch.float64, device=logits.device)
        tokens[index] = _sample_rows(scaled[index], [params[i] for i in rows], u)

    logprobs = logprobs_all.gather(1, tokens[:, None])[:, 0]
    return tokens.tolist(), logprobs.tolist()


def _sample_rows(scaled: torch.Tensor, params: list[SamplingParams], u: torch.Tensor) -> torch.Tensor:
    vocab = scaled.shape[-1]
    if not any(p.top_k > 0 or p.top_p < 1 for p in params):
        return _inverse_cdf(torch.softmax(scaled, dim=-1), u)
    # Truncation needs tokens in descending order; sample a rank, then map it back to a token id.
    sorted_logits, order = scaled.sort(dim=-1, descending=True)
    ranks = torch.arange(vocab, device=scaled.device)
    top_k = torch.tensor([p.top_k if p.top_k > 0 else vocab for p in params], device=scaled.device)
    sorted_logits = sorted_logits.masked_fill(ranks[None, :] >= top_k[:, None], float("-inf"))
    probs = torch.softmax(sorted_logits, dim=-1)
    top_p = torch.tensor([float(p.top_p) for p in params], device=scaled.device)
    mass_before = probs.cumsum(dim=-1) - probs
    probs = probs.masked_fill(mass_before >= top_p[:, None], 0.0)  # the top token always survives
    return order.gather(1, _inverse_cdf(probs, u)[:, None])[:, 0]


def _inverse_cdf(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Index i with cdf[i-1] < u * total <= cdf[i]; u in (0, 1) so a zero-probability token is never hit."""
    cdf = probs.double().cumsum(dim=-1)
    target = u * cdf[:, -1]
    choice = torch.searchsorted(cdf, target[:, None])[:, 0]
    return choice.clamp_(max=probs.shape[-1] - 1)
