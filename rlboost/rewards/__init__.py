"""Rewards: the built-in compute_score, custom reward functions loaded from a file, and scoring them in
worker processes (`pool`, `worker`) with a time limit per call and the on_error policy (`scoring`)."""

from rlboost.rewards.builtin import arithmetic_score, compute_score, countdown_score, math_score
from rlboost.rewards.config import RewardConfig
from rlboost.rewards.errors import RewardConfigError, RewardFunctionError
from rlboost.rewards.loading import load_reward_fn
from rlboost.rewards.scoring import RewardScorer, ScoreRequest

__all__ = [
    "compute_score", "arithmetic_score", "countdown_score", "math_score",
    "RewardConfig", "RewardConfigError", "load_reward_fn",
    "RewardFunctionError", "RewardScorer", "ScoreRequest",
]
