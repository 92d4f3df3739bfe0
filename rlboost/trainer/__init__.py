"""GRPO training of an HF causal LM on streamed groups of rollout samples."""

from rlboost.trainer.config import LOSS_AGG_MODES, TrainerConfig
from rlboost.trainer.trainer import Trainer

__all__ = ["Trainer", "TrainerConfig", "LOSS_AGG_MODES"]
