"""The trainer's config: optimizer, GRPO loss and how a step's groups are cut into (micro-)batches."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

LOSS_AGG_MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm")
LOSSES = ("grpo", "decoupled", "m2po")
"""The policy losses (`trainer.loss`, `rlboost/trainer/losses.py`)."""
LR_SCHEDULES = ("constant", "cosine")


@dataclass
class TrainerConfig:
    lr: float = 1e-6
    """AdamW learning rate (veRL: actor.optim.lr)."""
    weight_decay: float = 0.01
    """AdamW decoupled weight decay."""
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    """AdamW betas."""
    eps: float = 1e-8
    """AdamW epsilon, added to the root of the second moment before dividing."""
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
    tis_cap: float = 0.0
    """Truncated importance sampling for the rollout/trainer mismatch (Yao et al. 2025; veRL's
    `tis_imp_ratio_cap`, slime's `--use-tis`): each token's policy-gradient term is weighted by
    min(pi_trainer / pi_rollout, tis_cap), with pi_trainer the trainer's own probability of the token at
    the step's starting weights, and the PPO ratio is taken against pi_trainer instead of the rollout's
    log-prob. Worth it where the engine's numerics differ from the trainer's (vLLM, bf16: docs/engine.md
    measures it); 0 (the default) turns it off and the PPO ratio is against the rollout's log-probs.
    2 is the paper's value. Needs one optimizer step per RL step (`mini_batch_groups` 0 or the whole
    batch): a streamed step has the trainer's starting log-probs only before its first update."""
    loss: str = "grpo"
    """The policy loss per token (`rlboost/trainer/losses.py`): `grpo` (PPO-clip on pi_theta / pi_behav,
    with `tis_cap` its truncated-IS form), `decoupled` (AReaL's decoupled PPO: the clip on
    pi_theta / pi_prox times the capped behaviour weight pi_prox / pi_behav, for stale tokens) or `m2po`
    (no clip; the tokens of largest (log pi_theta / pi_behav)^2 masked until the rest's mean is at most
    `m2_threshold`, for very stale batches). With fresh tokens from an exact engine all three train alike."""
    behaviour_cap: float = 2.0
    """`loss=decoupled`: the cap on the behaviour weight pi_prox / pi_behav (>= 1); a larger weight is
    truncated to it (`actor/tis_clipfrac` counts them)."""
    m2_threshold: float = 0.04
    """`loss=m2po`: tau, the largest mean (log r)^2 of the tokens kept (the paper's 0.04)."""
    kl_coef: float = 0.0
    """Weight of the KL penalty to the frozen initial policy (k3 estimator, veRL's `low_var_kl`);
    0 disables it and no reference model is kept."""

    device: str = "auto"
    """Where the policy trains: auto (CUDA when available, else CPU), cpu, cuda, cuda:N."""
    dtype: str = "auto"
    """Compute precision: `auto` is bf16 autocast where the device supports it (CUDA) and fp32 otherwise;
    `float32` or `bfloat16` force it. Master weights and optimizer state stay fp32. At world_size > 1 the
    same choice is FSDP2's mixed-precision policy (bf16 compute, fp32 gradient reductions)."""

    world_size: int = 1
    """Trainer ranks. 1: the policy trains in the driver's process, as it always did. N > 1: N ranks run as
    Ray actors in one placement group on the reserved resources (a GPU each on CUDA, a CPU each
    otherwise), joined by torch.distributed (NCCL on CUDA, gloo on CPU); the policy, its gradients and
    AdamW's state are sharded with FSDP2 (`trainer/sharding.py`), streamed groups are dealt to the ranks
    as they arrive, and every update equals the world-1 update of the same groups. Each micro-batch then
    runs as one padded batch (`share_prompt` applies at world 1), so every rank launches the same
    collectives whatever its groups."""
    shard_size: int = 0
    """Ranks each parameter is sharded over; 0 means all of them (plain FSDP). A divisor of world_size
    below it gives HSDP: world_size / shard_size replicas, each sharded shard_size ways (e.g. shard
    within a node, replicate across nodes)."""
    collective_timeout_s: float = 600.0
    """A torch.distributed collective that waits longer than this fails (a rank died or hangs), so a
    broken rank fails the step instead of hanging it; the driver names the dead rank sooner when Ray
    reports its death."""
    call_timeout_s: float = 1800.0
    """The driver's limit on waiting for the ranks (world_size > 1): when none of the calls it waits on
    (a micro-batch, an optimizer step, a publish, a checkpoint) has answered for this long, the ranks
    still owing an answer are taken as hung (stopped, or stuck outside a collective), torn down, and
    the run stops with one line naming them. Above any one call's longest time."""

    def validate(self) -> None:
        """Raise ValueError naming the offending field."""
        if not self.lr > 0:
            raise ValueError(f"trainer.lr must be > 0, got {self.lr}")
        if len(self.betas) != 2 or not all(0 <= b < 1 for b in self.betas):
            raise ValueError(f"trainer.betas must be two numbers in [0, 1), got {list(self.betas)}")
        if not self.eps > 0:
            raise ValueError(f"trainer.eps must be > 0, got {self.eps}")
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
        if self.tis_cap != 0 and not self.tis_cap >= 1:
            raise ValueError(f"trainer.tis_cap must be 0 (off) or >= 1, got {self.tis_cap}")
        if self.loss not in LOSSES:
            raise ValueError(f"trainer.loss={self.loss!r}; choose one of {', '.join(LOSSES)}")
        if self.tis_cap and self.loss != "grpo":
            raise ValueError(f"trainer.tis_cap is loss=grpo's truncated-IS form; loss={self.loss} has its own "
                             "weighting (trainer.behaviour_cap for decoupled): set trainer.tis_cap=0")
        if not self.behaviour_cap >= 1:
            raise ValueError(f"trainer.behaviour_cap must be >= 1, got {self.behaviour_cap}")
        if not self.m2_threshold > 0:
            raise ValueError(f"trainer.m2_threshold must be > 0, got {self.m2_threshold}")
        if self.kl_coef < 0:
            raise ValueError(f"trainer.kl_coef must be >= 0, got {self.kl_coef}")
        if self.dtype not in ("auto", "float32", "bfloat16"):
            raise ValueError(f"trainer.dtype={self.dtype!r}; choose auto, float32 or bfloat16")
        if self.world_size < 1:
            raise ValueError(f"trainer.world_size must be >= 1, got {self.world_size}")
        if self.shard_size < 0 or self.shard_size > self.world_size or (
                self.shard_size and self.world_size % self.shard_size):
            raise ValueError(f"trainer.shard_size={self.shard_size} must be 0 (all ranks) or a divisor of "
                             f"trainer.world_size={self.world_size}: the device mesh is replicas x shard_size")
        if not self.collective_timeout_s > 0:
            raise ValueError(f"trainer.collective_timeout_s must be > 0, got {self.collective_timeout_s}")
        if not 0 < self.call_timeout_s < math.inf:
            raise ValueError(f"trainer.call_timeout_s must be a number of seconds > 0, got {self.call_timeout_s}")
