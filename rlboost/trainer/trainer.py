"""The GRPO trainer: consumes a step's finished groups as they arrive and updates the policy.

Contract (DESIGN.md 2.6):
- `train_step(groups, num_groups)` pulls exactly `num_groups` finished groups from any iterable, in
  the order it yields them (a list in colocated mode, a live stream in hybrid mode). Every
  `micro_batch_groups` groups run one forward/backward; gradients accumulate; the optimizer steps
  when a mini-batch of `mini_batch_groups` groups is complete (or the step's groups run out).
- The accumulated gradient equals the full-batch gradient of the same samples for every loss
  aggregation mode, whatever the arrival order: micro-batches back-propagate un-normalised sums and
  the gradient is divided by the mini-batch's normaliser just before the optimizer step.
- With `share_prompt` (the default) each group's prompt runs once and its `n` responses on the prompt's
  keys and values (`logprobs.shared_prompt_logprobs`): the same log-probs and gradients as the padded
  batch up to float rounding, with a fraction of the compute.
- Behaviour log-probs are the ones the engine streamed with each token (the step's weights); the
  trainer's own log-probs use the same temperature, so the PPO ratio starts at 1 up to the engine's
  numerics. Where those differ (vLLM, bf16), `tis_cap` takes the ratio against the trainer's own starting
  log-probs and weighs each token by the truncated ratio pi_trainer / pi_rollout (`_tis_loss`); the
  mismatch is reported either way (`training/rollout_probs_diff_*`).
- `weights()` is the state dict the engine loads after the step (version k+1).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from pathlib import Path

import torch
from transformers import PreTrainedModel

from rlboost.engine.engine import resolve_device
from rlboost.rollout.sample import Group
from rlboost.trainer import state
from rlboost.trainer.config import TrainerConfig
from rlboost.trainer.grpo import aggregate_parts, group_advantages, kl_k3, ppo_clip_loss
from rlboost.trainer.logprobs import pad_batch, response_logprobs, shared_prompt_logprobs


def use_bf16(dtype: str, device: torch.device) -> bool:
    if dtype == "bfloat16":
        return True
    return dtype == "auto" and device.type == "cuda" and torch.cuda.is_bf16_supported()


class Trainer:
    """Owns the policy being trained (its own copy: the engine fuses its model's weights in place)."""

    def __init__(self, model: PreTrainedModel, config: TrainerConfig, *, temperature: float,
                 max_response_length: int, total_optimizer_steps: int, pad_token_id: int = 0,
                 ref_model: PreTrainedModel | None = None):
        config.validate()
        self.config = config
        self.device = resolve_device(config.device, key="trainer.device")
        self.bf16 = use_bf16(config.dtype, self.device)
        self.share_prompt = config.share_prompt
        self.model = self._place_policy(model)
        self.ref_model = None
        if config.kl_coef > 0:
            if ref_model is None:
                raise ValueError("trainer.kl_coef > 0 needs a reference model")
            self.ref_model = self._place_reference(ref_model)
        self.temperature = temperature
        self.max_response_length = max_response_length
        self.pad_token_id = pad_token_id
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(self.params, lr=config.lr, betas=tuple(config.betas),
                                           eps=config.eps, weight_decay=config.weight_decay)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda i: lr_factor(i, config, total_optimizer_steps))

    def _place_policy(self, model: PreTrainedModel) -> PreTrainedModel:
        """The policy on its device, fp32 master weights, in training mode (sharded on a rank)."""
        return model.to(self.device, dtype=torch.float32).train()

    def _place_reference(self, model: PreTrainedModel) -> PreTrainedModel:
        return model.to(self.device).eval().requires_grad_(False)

    def train_step(self, groups: Iterable[Group], num_groups: int, step: int | None = None) -> dict[str, float]:
        """Train on `num_groups` groups pulled from `groups`; returns veRL-named actor metrics. `step`
        (the RL step) is for the sharded trainer's error messages; one process has no rank to name."""
        cfg = self.config
        mini_size = cfg.mini_batch_groups or num_groups
        check_tis(cfg, mini_size, num_groups)
        stats = _StepStats()
        micro: list[Group] = []
        consumed = in_mini = 0
        denominator = 0.0
        self.optimizer.zero_grad(set_to_none=True)
        for group in groups:
            check_finished(group)
            micro.append(group)
            consumed += 1
            in_mini += 1
            at_boundary = in_mini == mini_size or consumed == num_groups
            if len(micro) == cfg.micro_batch_groups or at_boundary:
                denominator += self._accumulate(micro, stats)
                micro = []
            if at_boundary:
                self._optimizer_step(denominator, stats)
                denominator, in_mini = 0.0, 0
            if consumed == num_groups:
                break
        if consumed != num_groups:
            raise RuntimeError(f"the rollout delivered {consumed} groups, the step expected {num_groups}")
        return stats.metrics(self.optimizer.param_groups[0]["lr"])

    def _accumulate(self, groups: list[Group], stats: "_StepStats") -> float:
        """Forward/backward one micro-batch; returns its share of the mini-batch normaliser."""
        cfg = self.config
        samples = [s for g in groups for s in g.samples]
        advantages = torch.cat([
            group_advantages(torch.tensor([float(s.reward) for s in g.samples]), cfg.norm_adv_by_std)
            for g in groups]).to(self.device)
        batch = pad_batch([s.prompt_ids for s in samples], [s.response_ids for s in samples],
                          self.pad_token_id, self.device)
        mask = batch["response_mask"]
        old_logp = torch.zeros(mask.shape, dtype=torch.float32)
        for b, s in enumerate(samples):
            old_logp[b, :len(s.logprobs)] = torch.tensor(s.logprobs)
        old_logp = old_logp.to(self.device)

        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.bf16):
            logp, entropy = self._logprobs(self.model, samples, batch, with_entropy=True)
        if not stats.grad_norms:  # no update yet this step: logp is the starting weights', as the rollout's were
            stats.add_mismatch(logp.detach(), old_logp, mask)
        if cfg.tis_cap:
            token_loss, clipped, approx_kl = self._tis_loss(logp, old_logp, advantages, mask, stats)
        else:
            token_loss, clipped, approx_kl = ppo_clip_loss(logp, old_logp, advantages, cfg.clip_ratio_low,
                                                           cfg.clip_ratio_high)
        numerator, denominator = aggregate_parts(token_loss, mask, cfg.loss_agg_mode, self.max_response_length)
        total = numerator
        if self.ref_model is not None:
            with torch.no_grad(), torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.bf16):
                ref_logp, _ = self._logprobs(self.ref_model, samples, batch)
            kl_numerator, _ = aggregate_parts(kl_k3(logp, ref_logp), mask, cfg.loss_agg_mode,
                                              self.max_response_length)
            total = total + cfg.kl_coef * kl_numerator
            stats.kl_numerator += kl_numerator.item()
        total.backward()

        stats.pg_numerator += numerator.item()
        stats.tokens += mask.sum().item()
        stats.clipped += (clipped * mask).sum().item()
        stats.approx_kl += (approx_kl * mask).sum().item()
        stats.entropy += entropy.sum().item()
        stats.advantages.extend(advantages.tolist())
        return denominator

    def _tis_loss(self, logp, rollout_logp, advantages, mask, stats: "_StepStats"):
        """PPO-clip against the trainer's own starting log-probs, each token weighted by the truncated
        ratio min(pi_trainer / pi_rollout, tis_cap) (`TrainerConfig.tis_cap`). The step has one
        optimizer step (checked before it starts), so `logp` detached *is* the starting policy."""
        cfg = self.config
        start_logp = logp.detach()
        log_ratio = start_logp - rollout_logp
        weight = log_ratio.clamp(max=math.log(cfg.tis_cap)).exp()
        token_loss, clipped, approx_kl = ppo_clip_loss(logp, start_logp, advantages, cfg.clip_ratio_low,
                                                       cfg.clip_ratio_high)
        stats.tis_weight += (weight * mask).sum().item()
        stats.tis_truncated += ((log_ratio > math.log(cfg.tis_cap)) * mask).sum().item()
        return token_loss * weight, clipped, approx_kl

    def _logprobs(self, model, samples, batch: dict[str, torch.Tensor], with_entropy: bool = False):
        if self.share_prompt:
            return shared_prompt_logprobs(model, [s.prompt_ids for s in samples], [s.response_ids for s in samples],
                                          self.temperature, with_entropy, self.pad_token_id, self.device)
        return response_logprobs(model, batch, self.temperature, with_entropy)

    def _optimizer_step(self, denominator: float, stats: "_StepStats") -> None:
        denominator = max(self._global_sums(denominator, stats), 1e-8)
        for p in self.params:
            if p.grad is not None:
                p.grad.div_(denominator)
        max_norm = self.config.grad_clip if self.config.grad_clip > 0 else math.inf
        grad_norm = torch.nn.utils.clip_grad_norm_(self.params, max_norm)
        # sharded gradients give a replicated DTensor: every rank holds the same global norm
        grad_norm = (grad_norm.full_tensor() if hasattr(grad_norm, "full_tensor") else grad_norm).item()
        if math.isfinite(grad_norm):
            self.optimizer.step()
        else:
            stats.skipped += 1  # one NaN gradient would otherwise poison the weights for good
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        stats.end_mini_batch(denominator, grad_norm)

    def _global_sums(self, denominator: float, stats: "_StepStats") -> float:
        """The mini-batch's normaliser (and the loss numerators in `stats`) over every rank: here,
        one rank holds the whole mini-batch. A sharded rank all-reduces them."""
        return denominator

    def weights(self) -> dict[str, torch.Tensor]:
        """The policy's parameters by name, for `LLMEngine.load_weights`."""
        return {name: p.detach() for name, p in self.model.named_parameters()}

    # -- checkpoints (`rlboost/checkpoint.py`; the same calls on a `TrainerGroup`) --

    def save_state(self, folder: Path) -> None:
        """Model and optimizer state into `folder` (torch.distributed.checkpoint: loads at any world size)."""
        state.save_state(self.model, self.optimizer, folder)

    def load_state(self, folder: Path) -> None:
        state.load_state(self.model, self.optimizer, folder)

    def export_hf(self, folder: Path) -> None:
        """The policy as an HF checkpoint folder."""
        self.model.save_pretrained(folder)

    def scheduler_state(self) -> dict:
        return self.scheduler.state_dict()

    def load_scheduler_state(self, scheduler_state: dict) -> None:
        self.scheduler.load_state_dict(scheduler_state)


def check_finished(group: Group) -> None:
    if not group.finished:
        raise ValueError(f"group {group.index} reached the trainer with unfinished samples")


def check_tis(config: TrainerConfig, mini_size: int, num_groups: int) -> None:
    """TIS weighs tokens by the trainer's starting log-probs, at hand only before a step's first update."""
    if config.tis_cap and mini_size < num_groups:
        raise ValueError(f"trainer.tis_cap needs one optimizer step per RL step, but trainer.mini_batch_groups="
                         f"{mini_size} splits the step's {num_groups} groups: set trainer.mini_batch_groups=0")


def lr_factor(step: int, config: TrainerConfig, total_steps: int) -> float:
    """Multiplier of `lr` at optimizer step `step` (0-based): linear warm-up, then constant or cosine."""
    if step < config.lr_warmup_steps:
        return (step + 1) / (config.lr_warmup_steps + 1)
    if config.lr_schedule == "constant":
        return 1.0
    span = max(1, total_steps - config.lr_warmup_steps)
    progress = min(1.0, (step - config.lr_warmup_steps) / span)
    return 0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * progress))


class _StepStats:
    """Sums over a step's micro-batches, turned into veRL's actor metrics at the end."""

    def __init__(self):
        self.pg_numerator = self.kl_numerator = 0.0
        self.tokens = self.clipped = self.approx_kl = self.entropy = 0.0
        self.advantages: list[float] = []
        self.pg_losses: list[float] = []
        self.kl_losses: list[float] = []
        self.grad_norms: list[float] = []
        self.skipped = 0
        # rollout/trainer mismatch on the tokens trained before the step's first update
        self.probs_diff_sum = self.probs_diff_max = self.mismatch_tokens = 0.0
        self.tis_weight = self.tis_truncated = 0.0

    def add_mismatch(self, trainer_logp: torch.Tensor, rollout_logp: torch.Tensor, mask: torch.Tensor) -> None:
        """|pi_trainer - pi_rollout| per token (veRL's `training/rollout_probs_diff_*`)."""
        diff = (trainer_logp.float().exp() - rollout_logp.exp()).abs() * mask
        self.probs_diff_sum += diff.sum().item()
        self.probs_diff_max = max(self.probs_diff_max, diff.max().item() if diff.numel() else 0.0)
        self.mismatch_tokens += mask.sum().item()

    def end_mini_batch(self, denominator: float, grad_norm: float) -> None:
        self.pg_losses.append(self.pg_numerator / denominator)
        self.kl_losses.append(self.kl_numerator / denominator)
        self.grad_norms.append(grad_norm)
        self.pg_numerator = self.kl_numerator = 0.0

    def totals(self) -> dict:
        """What a rank hands the driver at the end of a step (plain Python, picklable)."""
        return dict(vars(self))

    @classmethod
    def merged(cls, parts: list[dict]) -> "_StepStats":
        """One step's stats from every rank's `totals()`: sums add up and advantages concatenate; the
        per-mini-batch losses and gradient norms are global already (all-reduced), hence equal on all."""
        out = cls()
        for key in ("tokens", "clipped", "approx_kl", "entropy", "probs_diff_sum", "mismatch_tokens", "tis_weight",
                    "tis_truncated"):
            setattr(out, key, sum(p[key] for p in parts))
        out.probs_diff_max = max(p["probs_diff_max"] for p in parts)
        out.advantages = [a for p in parts for a in p["advantages"]]
        for key in ("pg_losses", "kl_losses", "grad_norms", "skipped"):
            setattr(out, key, parts[0][key])
        return out

    def metrics(self, lr: float) -> dict[str, float]:
        tokens = max(self.tokens, 1.0)
        adv = self.advantages or [0.0]
        tis = {"actor/tis_weight_mean": self.tis_weight / tokens,
               "actor/tis_clipfrac": self.tis_truncated / tokens} if self.tis_weight else {}
        return tis | {
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
