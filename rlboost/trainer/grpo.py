"""GRPO's maths as pure tensor functions: advantages, the PPO-clip loss, the k3 KL, loss aggregation.

Aggregation is split into a numerator and a denominator so that a mini-batch streamed in
micro-batches, in any arrival order, gets exactly the full-batch gradient: each micro-batch
back-propagates its *numerator* (a plain sum over its sequences), and the accumulated gradient is
divided once by the mini-batch's total *denominator* at the optimizer step. The denominator (tokens
for `token-mean`, sequences otherwise) is only known when the mini-batch is complete, which is why
it cannot be applied per micro-batch.
"""

from __future__ import annotations

import torch


def group_advantages(rewards: torch.Tensor, norm_by_std: bool = True, eps: float = 1e-6) -> torch.Tensor:
    """Advantages of one GRPO group's rewards [n]: reward minus the group mean, divided by the group's
    (unbiased) std when `norm_by_std`. A group of one sample, or of equal rewards, gets zeros."""
    if rewards.numel() < 2:
        return torch.zeros_like(rewards)
    centred = rewards - rewards.mean()
    if norm_by_std:
        centred = centred / (rewards.std() + eps)
    return centred


def ppo_clip_loss(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor,
                  clip_low: float, clip_high: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-token PPO-clip loss. `logp`, `old_logp`: [B, T]; `advantages`: [B] or [B, T].
    Returns (loss [B, T], clipped [B, T] as 0/1 floats, approx KL old→new [B, T])."""
    if advantages.dim() == 1:
        advantages = advantages[:, None]
    log_ratio = (logp - old_logp).clamp(-20.0, 20.0)  # exp() of a wild ratio would overflow
    ratio = log_ratio.exp()
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    loss = torch.maximum(unclipped, clipped)
    return loss, (clipped > unclipped).float(), -log_ratio.detach()


def kl_k3(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimate of KL(policy || reference): exp(r) - r - 1 with r = ref - policy; unbiased,
    non-negative, low variance (Schulman's k3, veRL's `low_var_kl`), clamped like veRL."""
    r = (ref_logp - logp).clamp(-20.0, 20.0)
    return (r.exp() - r - 1.0).clamp(-10.0, 10.0)


def aggregate_parts(values: torch.Tensor, mask: torch.Tensor, mode: str,
                    max_response_length: int) -> tuple[torch.Tensor, float]:
    """(numerator, denominator) of aggregating per-token `values` [B, T] under `mask` [B, T].

    The aggregated loss of a set of sequences is sum(numerators) / sum(denominators) over any split
    of the set into parts, which is what makes streamed accumulation exact.
    """
    mask = mask.to(values.dtype)
    if mode == "token-mean":
        return (values * mask).sum(), float(mask.sum().item())
    token_sums = (values * mask).sum(dim=-1)
    if mode == "seq-mean-token-mean":
        per_seq = token_sums / mask.sum(dim=-1).clamp(min=1.0)
    elif mode == "seq-mean-token-sum-norm":
        per_seq = token_sums / max_response_length
    else:
        raise ValueError(f"unknown loss aggregation mode {mode!r}")
    return per_seq.sum(), float(values.shape[0])
