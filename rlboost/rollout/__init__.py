"""Rollout: samples and groups, and the colocated (veRL-style) rollout of a step."""

from rlboost.rollout.colocated import new_groups, run_colocated, sample_seed
from rlboost.rollout.config import RolloutConfig
from rlboost.rollout.sample import Group, Sample

__all__ = ["Group", "Sample", "RolloutConfig", "new_groups", "run_colocated", "sample_seed"]
