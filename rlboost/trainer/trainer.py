"""The GRPO trainer: consumes a step's finished groups as they arrive and updates the policy.

Contract (docs/training.md, "The trainer"):
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
  numerics. The loss per token is `trainer.loss`'s (`trainer/losses.py`): where the engine's numerics
  differ (vLLM, bf16), `tis_cap` takes the ratio against the trainer's own starting log-probs and weighs
  each token by the truncated ratio pi_trainer / pi_rollout; for stale tokens, `decoupled` and `m2po`.
  The mismatch is reported either way (`training/rollout_probs_diff_*`), and the behaviour weight
  pi_trainer / pi_behav of every token with its effective sample size (`actor/behav_*`, `actor/ess`).
- The step is driven through public calls, in this order: `begin_step`, then per event of the step's
  `BatchSchedule` (`trainer/schedule.py`) `micro_batch` or `optimizer_step`, then `end_step`;
  `train_step` runs them at world size 1, a sharded rank's driver runs them on every rank.
- Where the policy lives is a `Placement`: `LocalPlacement` (the whole model in this process, the
  default) or a sharded rank's (`trainer/sharding.py`). It places the policy and the reference,
  computes padded-batch log-probs, and sums the step's normaliser and loss numerators over the ranks.
- `weights()` is the state dict the engine loads after the step (version k+1); `publish` hands it
  over as the trainer protocol's (`trainer/protocol.py`) weights to publish.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Protocol

import torch
from transformers import PreTrainedModel

from rlboost.engine.engine import resolve_device
from rlboost.rollout.sample import Group
from rlboost.trainer import state
from rlboost.trainer.config import TrainerConfig
from rlboost.trainer.grpo import aggregate_parts, group_advantages, kl_k3
from rlboost.trainer.losses import make_loss
from rlboost.trainer.logprobs import pad_batch, response_logprobs, shared_prompt_logprobs
from rlboost.trainer.schedule import BatchSchedule, MicroBatch
from rlboost.trainer.stats import TrainStepStats


def use_bf16(dtype: str, device: torch.device) -> bool:
    if dtype == "bfloat16":
        return True
    return dtype == "auto" and device.type == "cuda" and torch.cuda.is_bf16_supported()


class Placement(Protocol):
    """Where a `Trainer`'s policy lives: `LocalPlacement` below, or a sharded rank's
    (`trainer/sharding.py`)."""

    autocast: bool
    """Compute in bf16 under torch's autocast when `trainer.dtype` asks for it."""
    shares_prompts: bool
    """`trainer.share_prompt` may apply (a micro-batch's number of forwards may depend on its data)."""

    def place_policy(self, model: PreTrainedModel, device: torch.device) -> PreTrainedModel: ...

    def place_reference(self, model: PreTrainedModel, device: torch.device) -> PreTrainedModel: ...

    def logprobs(self, model: PreTrainedModel, batch: dict[str, torch.Tensor], temperature: float,
                 with_entropy: bool):
        """Response log-probs (and entropies) of a padded batch (`logprobs.response_logprobs`)."""

    def global_sums(self, sums: list[float]) -> list[float]:
        """The mini-batch's normaliser and loss numerators summed over every rank."""


class LocalPlacement:
    """The whole policy in this process (world size 1)."""

    autocast = True
    shares_prompts = True

    def place_policy(self, model: PreTrainedModel, device: torch.device) -> PreTrainedModel:
        """The policy on its device, fp32 master weights, in training mode."""
        return model.to(device, dtype=torch.float32).train()

    def place_reference(self, model: PreTrainedModel, device: torch.device) -> PreTrainedModel:
        return model.to(device).eval().requires_grad_(False)

    def logprobs(self, model: PreTrainedModel, batch: dict[str, torch.Tensor], temperature: float,
                 with_entropy: bool):
        return response_logprobs(model, batch, temperature, with_entropy)

    def global_sums(self, sums: list[float]) -> list[float]:
        return sums  # one rank holds the whole mini-batch


class Trainer:
    """Owns the policy being trained (its own copy: the engine fuses its model's weights in place)."""

    def __init__(self, model: PreTrainedModel, config: TrainerConfig, *, temperature: float,
                 max_response_length: int, total_optimizer_steps: int, pad_token_id: int = 0,
                 ref_model: PreTrainedModel | None = None, placement: Placement | None = None):
        config.validate()
        self.config = config
        self.placement = placement or LocalPlacement()
        self.device = resolve_device(config.device, key="trainer.device")
        self.bf16 = self.placement.autocast and use_bf16(config.dtype, self.device)
        self.share_prompt = self.placement.shares_prompts and config.share_prompt
        self.model = self.placement.place_policy(model, self.device)
        self.ref_model = None
        if config.kl_coef > 0:
            if ref_model is None:
                raise ValueError("trainer.kl_coef > 0 needs a reference model")
            self.ref_model = self.placement.place_reference(ref_model, self.device)
        self.temperature = temperature
        self.max_response_length = max_response_length
        self.pad_token_id = pad_token_id
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(self.params, lr=config.lr, betas=tuple(config.betas),
                                           eps=config.eps, weight_decay=config.weight_decay)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda i: lr_factor(i, config, total_optimizer_steps))
        self.stats = TrainStepStats()
        self.denominator = 0.0
        """The current mini-batch's loss normaliser, summed over its micro-batches so far."""

    def train_step(self, groups: Iterable[Group], num_groups: int, step: int | None = None) -> dict[str, float]:
        """Train on `num_groups` groups pulled from `groups`; returns veRL-named actor metrics. `step`
        (the RL step) is for the sharded trainer's error messages; one process has no rank to name."""
        cfg = self.config
        schedule = BatchSchedule(num_groups, cfg.micro_batch_groups, cfg.mini_batch_groups, tis_cap=cfg.tis_cap)
        self.begin_step()
        for group in groups:
            for event in schedule.add(group):
                if isinstance(event, MicroBatch):
                    self.micro_batch(event.per_rank[0])
                else:
                    self.optimizer_step()
            if schedule.done:
                break
        schedule.finish()
        return self.end_step().metrics(self.lr)

    # -- one step's calls (`train_step`'s, and a sharded rank's in lock-step with the others) --

    def begin_step(self) -> None:
        self.stats, self.denominator = TrainStepStats(), 0.0
        self.optimizer.zero_grad(set_to_none=True)

    def micro_batch(self, groups: Sequence[Group]) -> None:
        """Forward/backward one micro-batch of finished groups; gradients accumulate."""
        self.denominator += self._accumulate(groups, self.stats)

    def optimizer_step(self) -> None:
        """The mini-batch is complete: divide the gradient by its normaliser and step."""
        self._optimizer_step(self.denominator, self.stats)
        self.denominator = 0.0

    def end_step(self) -> TrainStepStats:
        return self.stats

    @property
    def lr(self) -> float:
        """The learning rate of the next optimizer step."""
        return self.optimizer.param_groups[0]["lr"]

    def _accumulate(self, groups: Sequence[Group], stats: TrainStepStats) -> float:
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
        token = self.loss(logp, old_logp, advantages, mask)
        stats.add_behaviour(logp.detach(), old_logp, mask, token)
        numerator, denominator = aggregate_parts(token.loss, mask, cfg.loss_agg_mode, self.max_response_length)
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
        stats.clipped += (token.clipped * mask).sum().item()
        stats.approx_kl += (token.approx_kl * mask).sum().item()
        stats.entropy += entropy.sum().item()
        stats.advantages.extend(advantages.tolist())
        return denominator

    @property
    def loss(self):
        """The policy loss per token (`trainer.loss`, `rlboost.trainer.losses`), read from the config at
        each use: a driver may change its fields between steps (`TrainerGroup.reconfigure`)."""
        cfg = self.config
        return make_loss(cfg.loss, cfg.clip_ratio_low, cfg.clip_ratio_high, cfg.tis_cap, cfg.behaviour_cap,
                         cfg.m2_threshold)

    def _logprobs(self, model, samples, batch: dict[str, torch.Tensor], with_entropy: bool = False):
        if self.share_prompt:
            return shared_prompt_logprobs(model, [s.prompt_ids for s in samples], [s.response_ids for s in samples],
                                          self.temperature, with_entropy, self.pad_token_id, self.device)
        return self.placement.logprobs(model, batch, self.temperature, with_entropy)

    def _optimizer_step(self, denominator: float, stats: TrainStepStats) -> None:
        denominator, stats.pg_numerator, stats.kl_numerator = self.placement.global_sums(
            [denominator, stats.pg_numerator, stats.kl_numerator])
        denominator = max(denominator, 1e-8)
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

    def weights(self) -> dict[str, torch.Tensor]:
        """The policy's parameters by name, for `LLMEngine.load_weights`."""
        return {name: p.detach() for name, p in self.model.named_parameters()}

    def publish(self, version: int, store=None, dtype: str | None = None) -> dict[str, torch.Tensor]:
        """The weights the rollout loads as `version`: this process holds them whole (`weights()`); the
        rollout puts them in the weight store, if it uses one."""
        return self.weights()

    def close(self) -> None:
        """Nothing to release: the policy lives in this process."""

    # -- checkpoints (`rlboost/checkpoint.py`; the same calls on a `TrainerGroup`) --

    def save_state(self, folder: Path) -> None:
        """Model and optimizer state into `folder` (torch.distributed.checkpoint: loads at any world size)."""
        state.save_state(self.model, self.optimizer, folder)

    def load_state(self, folder: Path) -> None:
        state.load_state(self.model, self.optimizer, folder)

    def load_unsharded_state(self, hf_folder: Path, optimizer_state: dict) -> None:
        """A checkpoint of an earlier version: weights from its HF folder, the optimizer's state dict."""
        state.load_unsharded_state(self.model, self.optimizer, hf_folder, optimizer_state)

    def export_hf(self, folder: Path) -> None:
        """The policy as an HF checkpoint folder."""
        self.model.save_pretrained(folder)

    def scheduler_state(self) -> dict:
        return self.scheduler.state_dict()

    def load_scheduler_state(self, scheduler_state: dict) -> None:
        self.scheduler.load_state_dict(scheduler_state)


def lr_factor(step: int, config: TrainerConfig, total_steps: int) -> float:
    """Multiplier of `lr` at optimizer step `step` (0-based): linear warm-up, then constant or cosine."""
    if step < config.lr_warmup_steps:
        return (step + 1) / (config.lr_warmup_steps + 1)
    if config.lr_schedule == "constant":
        return 1.0
    span = max(1, total_steps - config.lr_warmup_steps)
    progress = min(1.0, (step - config.lr_warmup_steps) / span)
    return 0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * progress))
