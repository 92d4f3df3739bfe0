"""The trainer's config: optimizer, GRPO loss and how a step's groups are cut into (micro-)batches."""

from __future__ import annotations

from dataclasses import dataclass, field

LOSS_AGG_MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm")
LR_SCHEDULES = ("constant", "cosine")


@dataclass
class TrainerConfig:
    lr: float = 1e-6
    """AdamW learning rate (veRL: actor.optim.lr)."""
    weight_decay: float = 0.01
    """AdamW decoupled weight decay."""
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    """AdamW betas."""
    grad_clip: float = 1.0
    """Clip the global gradient norm to this before each optimizer step; 0 disables clipping. A step whose
    gradient norm is not finite is skipped (counted in `actor/skipped_steps`)."""
    lr_warmup_steps: int = 0
    """Optimizer steps of linear warm-up from 0 to `lr`."""
    lr_schedule: str = "constant"
    """After warm-up: `constant`, or `cosine` decay to 10% of `lr` at the run's last optimizer step."""

    mini_batch_groups: int = 0
    """GRPO groups (prompts) per optimizer step (veRL: actor.ppo_mini_batch_size); 0 means all the groups
    of an RL step, i.e. one optimizer step per RL step."""
    micro_batch_groups: int = 1
    """Groups per forward/backward pass; gradients accumulate across micro-batches of a mini-batch."""
    share_prompt: bool = True
    """Run each group's prompt once and its `n` responses on top of the prompt's keys and values
    (`trainer/logprobs.py`): the same log-probs and gradients up to float rounding, the prompt's share
    of the compute cut n-fold. False: every sample's prompt and response in one padded batch."""

    clip_ratio_low: float = 0.2
    """PPO clip: the ratio is clipped below at 1 - clip_ratio_low."""
    clip_ratio_high: float = 0.2
    """PPO clip: the ratio is clipped above at 1 + clip_ratio_high (raise it for DAPO's clip-higher)."""
    loss_agg_mode: str = "token-mean"
    """How per-token losses become one number: `token-mean` (over all tokens of the mini-batch),
    `seq-mean-token-mean` (each response's token mean, averaged over responses) or
    `seq-mean-token-sum-norm` (each response's token sum / max_response_length, averaged over responses;
    Dr. GRPO)."""
    norm_adv_by_std: bool = True
    """GRPO advantage = (reward - group mean) / (group std + eps); False drops the division (Dr. GRPO)."""
    kl_coef: float = 0.0
    """Weight of the KL penalty to the frozen initial policy (k3 estimator, veRL's `low_var_kl`);
    0 disables it and no reference model is kept."""

    device: str = "auto"
    """Where the policy trains: auto (CUDA when available, else CPU), cpu, cuda, cuda:N."""
    dtype: str = "auto"
    """Compute precision: `auto` is bf16 autocast where the device supports it (CUDA) and fp32 otherwise;
    `float32` or `bfloat16` force it. Master weights and optimizer state stay fp32."""

    def validate(self) -> None:
        """Raise ValueError naming the offending field."""
        if not self.lr > 0:
            raise ValueError(f"trainer.lr must be > 0, got {self.lr}")
        if len(self.betas) != 2 or not all(0 <= b < 1 for b in self.betas):
            raise ValueError(f"trainer.betas must be two numbers in [0, 1), got {list(self.betas)}")
        if self.grad_clip < 0:
            raise ValueError(f"trainer.grad_clip must be >= 0 (0 disables), got {self.grad_clip}")
        if self.lr_warmup_steps < 0:
            raise ValueError(f"trainer.lr_warmup_steps must be >= 0, got {self.lr_warmup_steps}")
        if self.lr_schedule not in LR_SCHEDULES:
            raise ValueError(f"trainer.lr_schedule={self.lr_schedule!r}; choose one of {', '.join(LR_SCHEDULES)}")
        if self.mini_batch_groups < 0:
            raise ValueError(f"trainer.mini_batch_groups must be >= 0 (0 = all), got {self.mini_batch_groups}")
        if self.micro_batch_groups < 1:
            raise ValueError(f"trainer.micro_batch_groups must be >= 1, got {self.micro_batch_groups}")
        if self.mini_batch_groups and self.micro_batch_groups > self.mini_batch_groups:
            raise ValueError(f"trainer.micro_batch_groups ({self.micro_batch_groups}) cannot exceed "
                             f"trainer.mini_batch_groups ({self.mini_batch_groups})")
        if not (self.clip_ratio_low >= 0 and self.clip_ratio_high >= 0):
            raise ValueError("trainer.clip_ratio_low and trainer.clip_ratio_high must be >= 0")
        if self.loss_agg_mode not in LOSS_AGG_MODES:
            raise ValueError(f"trainer.loss_agg_mode={self.loss_agg_mode!r}; choose one of {', '.join(LOSS_AGG_MODES)}")
        if self.kl_coef < 0:
            raise ValueError(f"trainer.kl_coef must be >= 0, got {self.kl_coef}")
        if self.dtype not in ("auto", "float32", "bfloat16"):
            raise ValueError(f"trainer.dtype={self.dtype!r}; choose auto, float32 or bfloat16")
