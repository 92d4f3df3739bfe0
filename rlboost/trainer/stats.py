"""What a training step measured: sums over its micro-batches, turned into veRL's actor metrics.

Torch-free: `add_mismatch` only calls tensor methods, and `totals` / `merged` move plain Python
between a sharded trainer's ranks and its driver. A world-1 trainer's stats are one rank's: at world
size N each rank sums its own groups, the loss numerators and gradient norms are all-reduced at every
optimizer step (so equal on every rank), and the driver merges the ranks' `totals()`."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    from rlboost.trainer.losses import TokenLoss

LOG_WEIGHT_BOUND = 20.0
"""|log w| is clamped here before exp(), as the losses clamp their ratios."""


class TrainStepStats:
    """One training step's sums (one rank's share at world size > 1)."""

    def __init__(self):
        self.pg_numerator = 0.0
        """Policy-loss numerator of the current mini-batch (reset at each optimizer step)."""
        self.kl_numerator = 0.0
        """KL-loss numerator of the current mini-batch (reset at each optimizer step)."""
        self.tokens = 0.0
        """Response tokens trained."""
        self.clipped = 0.0
        """Tokens whose PPO ratio was clipped."""
        self.approx_kl = 0.0
        """Sum over tokens of the approximate KL to the behaviour policy."""
        self.entropy = 0.0
        """Sum over tokens of the policy's entropy."""
        self.advantages: list[float] = []
        """Every sample's advantage, in training order."""
        self.pg_losses: list[float] = []
        """Per optimizer step: the mini-batch's policy loss (numerator over the global normaliser)."""
        self.kl_losses: list[float] = []
        """Per optimizer step: the mini-batch's KL loss."""
        self.grad_norms: list[float] = []
        """Per optimizer step: the global gradient norm before clipping (its length counts the steps)."""
        self.skipped = 0
        """Optimizer steps skipped for a non-finite gradient norm."""
        self.probs_diff_sum = 0.0
        """Sum of |pi_trainer - pi_rollout| over the tokens trained before the step's first update."""
        self.probs_diff_max = 0.0
        """Largest |pi_trainer - pi_rollout| of those tokens."""
        self.mismatch_tokens = 0.0
        """How many tokens `probs_diff_sum` covers."""
        self.tis_weight = 0.0
        """With a capped behaviour weight (`trainer.tis_cap`, `loss=decoupled`): sum over tokens of the
        weight applied."""
        self.tis_truncated = 0.0
        """With a capped behaviour weight: tokens whose weight the cap truncated."""
        self.behav_weight = 0.0
        """Sum over tokens of the behaviour weight w = pi_trainer / pi_behav (uncapped), the trainer's
        log-probs at the forward that trained the token: staleness and engine mismatch in one number."""
        self.behav_weight_sq = 0.0
        """Sum over tokens of w^2 (the effective sample size's denominator)."""
        self.behav_weight_max = 0.0
        """The largest w of the step."""
        self.m2_masked = 0.0
        """`loss=m2po`: tokens its second-moment mask dropped."""
        self.m2_tokens = 0.0
        """`loss=m2po`: tokens its mask was computed over (the masked fraction's denominator; 0 under
        another loss, which then reports no masked fraction)."""

    def add_mismatch(self, trainer_logp: torch.Tensor, rollout_logp: torch.Tensor, mask: torch.Tensor) -> None:
        """|pi_trainer - pi_rollout| per token (veRL's `training/rollout_probs_diff_*`)."""
        diff = (trainer_logp.float().exp() - rollout_logp.exp()).abs() * mask
        self.probs_diff_sum += diff.sum().item()
        self.probs_diff_max = max(self.probs_diff_max, diff.max().item() if diff.numel() else 0.0)
        self.mismatch_tokens += mask.sum().item()

    def add_behaviour(self, trainer_logp: torch.Tensor, behaviour_logp: torch.Tensor, mask: torch.Tensor,
                      token: TokenLoss) -> None:
        """The behaviour weights of one forward's tokens, and what the loss did with them."""
        weight = (trainer_logp.float() - behaviour_logp).clamp(-LOG_WEIGHT_BOUND, LOG_WEIGHT_BOUND).exp() * mask
        self.behav_weight += weight.sum().item()
        self.behav_weight_sq += weight.pow(2).sum().item()
        self.behav_weight_max = max(self.behav_weight_max, weight.max().item() if weight.numel() else 0.0)
        if token.weight is not None:
            self.tis_weight += (token.weight * mask).sum().item()
            self.tis_truncated += (token.truncated * mask).sum().item()
        if token.masked is not None:
            self.m2_masked += (token.masked * mask).sum().item()
            self.m2_tokens += mask.sum().item()

    def end_mini_batch(self, denominator: float, grad_norm: float) -> None:
        self.pg_losses.append(self.pg_numerator / denominator)
        self.kl_losses.append(self.kl_numerator / denominator)
        self.grad_norms.append(grad_norm)
        self.pg_numerator = self.kl_numerator = 0.0

    def totals(self) -> dict:
        """What a rank hands the driver at the end of a step (plain Python, picklable)."""
        return dict(vars(self))

    @classmethod
    def merged(cls, parts: list[dict]) -> TrainStepStats:
        """One step's stats from every rank's `totals()`: sums add up and advantages concatenate; the
        per-mini-batch losses and gradient norms are global already (all-reduced), hence equal on all."""
        out = cls()
        for key in ("tokens", "clipped", "approx_kl", "entropy", "probs_diff_sum", "mismatch_tokens", "tis_weight",
                    "tis_truncated", "behav_weight", "behav_weight_sq", "m2_masked", "m2_tokens"):
            setattr(out, key, sum(p[key] for p in parts))
        out.probs_diff_max = max(p["probs_diff_max"] for p in parts)
        out.behav_weight_max = max(p["behav_weight_max"] for p in parts)
        out.advantages = [a for p in parts for a in p["advantages"]]
        for key in ("pg_losses", "kl_losses", "grad_norms", "skipped"):
            setattr(out, key, parts[0][key])
        return out

    def metrics(self, lr: float) -> dict[str, float]:
        """veRL-named actor metrics; `lr`: the learning rate after the step."""
        tokens = max(self.tokens, 1.0)
        adv = self.advantages or [0.0]
        tis = {"actor/tis_weight_mean": self.tis_weight / tokens,
               "actor/tis_clipfrac": self.tis_truncated / tokens} if self.tis_weight else {}
        # every m2po step reports its fraction, 0 included: a gap in the curve would read as a missing step
        m2po = {"actor/m2po_masked_frac": self.m2_masked / self.m2_tokens} if self.m2_tokens else {}
        return tis | m2po | {
            "actor/behav_weight_mean": self.behav_weight / tokens,
            "actor/behav_weight_max": self.behav_weight_max,
            "actor/ess": ess(self.behav_weight, self.behav_weight_sq, self.tokens),
            "training/rollout_probs_diff_mean": self.probs_diff_sum / max(self.mismatch_tokens, 1.0),
            "training/rollout_probs_diff_max": self.probs_diff_max,
            "actor/pg_loss": sum(self.pg_losses) / max(len(self.pg_losses), 1),
            "actor/kl_loss": sum(self.kl_losses) / max(len(self.kl_losses), 1),
            "actor/pg_clipfrac": self.clipped / tokens,
            "actor/ppo_kl": self.approx_kl / tokens,
            "actor/entropy": self.entropy / tokens,
            "actor/grad_norm": sum(self.grad_norms) / max(len(self.grad_norms), 1),
            "actor/lr": lr,
            "actor/optimizer_steps": float(len(self.grad_norms)),
            "actor/skipped_steps": float(self.skipped),
            "critic/advantages/mean": sum(adv) / len(adv),
            "critic/advantages/max": max(adv),
            "critic/advantages/min": min(adv),
        }


def ess(weight_sum: float, weight_sq_sum: float, tokens: float) -> float:
    """The normalised effective sample size of importance weights, (sum w)^2 / (N sum w^2), in (0, 1]:
    1 when every weight is equal, near 0 when a few tokens carry the batch (VCPO, arXiv 2602.17616: its
    collapse foretells a diverging run). 1 for an empty step."""
    return weight_sum ** 2 / (tokens * weight_sq_sum) if tokens and weight_sq_sum else 1.0


__all__ = ["TrainStepStats", "ess"]
