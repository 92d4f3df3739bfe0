"""The policy loss per token, one type per kind behind one call (`trainer.loss`): what the trainer
back-propagates for each response token, given the policy's log-probs and the behaviour log-probs the
engine recorded when it sampled the token (`Sample.logprobs`, of whatever weight version made it).

- `grpo` (`PPOClip`): PPO-clip on pi_theta / pi_behav, today's GRPO. With `trainer.tis_cap` it is the
  truncated-importance-sampling form below, restricted to one optimizer step per RL step.
- `decoupled` (`Decoupled`): decoupled PPO (AReaL, arXiv 2505.24298): the clip on pi_theta / pi_prox,
  times the behaviour weight min(pi_prox / pi_behav, cap), detached. pi_prox is the proximal policy: the
  weights at the start of the token's mini-batch, whose log-probs are the forward's own, detached (each
  mini-batch is one optimizer step, so no extra forward is needed; with one mini-batch per RL step,
  the default, it is the step's starting policy). The weight carries stale tokens (made by older
  versions) and the engine/trainer numerical mismatch back to pi_prox; the cap bounds its variance. A
  weight above the cap is truncated to it, as TIS does (AReaL drops such tokens instead).
- `m2po` (`M2PO`, arXiv 2510.01161): no clip; the ratio r = pi_theta / pi_behav, with the tokens of
  largest (log r)^2 masked out until the mean (log r)^2 of the rest is at most tau (`trainer.m2_threshold`):
  only extreme outliers are dropped, however stale the batch. The mask is computed over the tokens of
  one forward (a micro-batch): streamed micro-batches see no later tokens; with one micro-batch per
  mini-batch it is the paper's.

Every kind returns a `TokenLoss`; its `weight` and `masked`, where the kind has them, feed the step's
metrics. With behaviour log-probs equal to the trainer's at the step's start (k = 0, an exact engine),
`decoupled` has weight 1 and the same loss and gradient as `grpo`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

import torch

from rlboost.trainer.config import LOSSES
from rlboost.trainer.grpo import ppo_clip_loss

LOG_RATIO_BOUND = 20.0
"""|log r| beyond this is clamped before exp(): a wild ratio would overflow."""


@dataclass
class TokenLoss:
    """One forward's per-token loss [B, T] and what the step's metrics read from it (all [B, T])."""

    loss: torch.Tensor
    clipped: torch.Tensor
    """1 where the PPO clip bound the token (0 for a loss without a clip)."""
    approx_kl: torch.Tensor
    """The approximate KL of the ratio the loss takes (detached)."""
    weight: torch.Tensor | None = None
    """The behaviour weight applied (detached, after its cap), for kinds that weight tokens."""
    truncated: torch.Tensor | None = None
    """1 where the cap truncated the weight."""
    masked: torch.Tensor | None = None
    """1 where M2PO's second-moment mask dropped the token."""


class PolicyLoss(Protocol):
    def __call__(self, logp: torch.Tensor, behaviour_logp: torch.Tensor, advantages: torch.Tensor,
                 mask: torch.Tensor) -> TokenLoss:
        """`logp`: the policy's log-probs [B, T] (with grad); `behaviour_logp`: the engine's [B, T];
        `advantages`: [B] or [B, T]; `mask`: 1 on response tokens [B, T]."""


@dataclass
class PPOClip:
    clip_low: float
    clip_high: float

    def __call__(self, logp, behaviour_logp, advantages, mask) -> TokenLoss:
        loss, clipped, approx_kl = ppo_clip_loss(logp, behaviour_logp, advantages, self.clip_low, self.clip_high)
        return TokenLoss(loss, clipped, approx_kl)


@dataclass
class Decoupled:
    clip_low: float
    clip_high: float
    cap: float
    """The largest behaviour weight pi_prox / pi_behav (>= 1)."""

    def __call__(self, logp, behaviour_logp, advantages, mask) -> TokenLoss:
        prox_logp = logp.detach()
        log_weight = (prox_logp - behaviour_logp).clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND)
        weight = log_weight.clamp(max=math.log(self.cap)).exp()
        loss, clipped, approx_kl = ppo_clip_loss(logp, prox_logp, advantages, self.clip_low, self.clip_high)
        return TokenLoss(loss * weight, clipped, approx_kl, weight=weight,
                         truncated=(log_weight > math.log(self.cap)).float())


@dataclass
class M2PO:
    threshold: float
    """tau: the largest mean (log r)^2 of the tokens kept."""

    def __call__(self, logp, behaviour_logp, advantages, mask) -> TokenLoss:
        if advantages.dim() == 1:
            advantages = advantages[:, None]
        log_ratio = (logp - behaviour_logp).clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND)
        keep = second_moment_mask(log_ratio.detach(), mask, self.threshold)
        loss = -advantages * log_ratio.exp() * keep
        return TokenLoss(loss, torch.zeros_like(loss), -log_ratio.detach(),
                         masked=(mask.to(keep.dtype) - keep).clamp(min=0.0))


def second_moment_mask(log_ratio: torch.Tensor, mask: torch.Tensor, threshold: float) -> torch.Tensor:
    """M2PO's mask: 1 on the tokens kept, 0 elsewhere. Among the tokens under `mask`, those of largest
    (log r)^2 are dropped one by one until the mean (log r)^2 of the rest is at most `threshold`: the
    fewest drops that meet it, which is dropping the j largest for the smallest such j (sorted once)."""
    m2 = log_ratio.float().pow(2)
    on = mask.bool()
    values = m2[on]
    keep = torch.zeros_like(m2)
    if values.numel() == 0:
        return keep
    ordered, order = values.sort()  # ascending: keeping the k smallest is dropping the rest
    means = ordered.cumsum(0) / torch.arange(1, len(ordered) + 1, dtype=ordered.dtype, device=ordered.device)
    fits = (means <= threshold).nonzero()
    kept = int(fits[-1].item()) + 1 if len(fits) else 0
    # the prefix means of a sorted sequence never fall, so the largest prefix that fits is the answer
    chosen = torch.zeros_like(values)
    chosen[order[:kept]] = 1.0
    keep[on] = chosen
    return keep


def make_loss(kind: str, clip_low: float, clip_high: float, tis_cap: float, behaviour_cap: float,
              m2_threshold: float) -> PolicyLoss:
    """The loss `trainer.loss` names (`tis_cap` > 0 turns `grpo` into its truncated-IS form)."""
    if kind == "decoupled":
        return Decoupled(clip_low, clip_high, behaviour_cap)
    if kind == "m2po":
        return M2PO(m2_threshold)
    if kind != "grpo":
        raise ValueError(f"trainer.loss={kind!r}; choose one of {', '.join(LOSSES)}")
    return Decoupled(clip_low, clip_high, tis_cap) if tis_cap else PPOClip(clip_low, clip_high)


__all__ = ["M2PO", "Decoupled", "PPOClip", "PolicyLoss", "TokenLoss", "make_loss", "second_moment_mask"]
