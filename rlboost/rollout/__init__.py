"""Rollout: samples and groups, and the colocated (veRL-style) rollout of a step."""

from rlboost.rollout.colocated import ColocatedRollout, RolloutBackend, new_groups, run_colocated, sample_seed
from rlboost.rollout.config import RolloutConfig
from rlboost.rollout.sample import Group, Sample

__all__ = ["ColocatedRollout", "Group", "RolloutBackend", "Sample", "RolloutConfig", "new_groups", "run_colocated", "sample_seed"]
