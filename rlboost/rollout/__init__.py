"""Rollout: samples and groups, the backend protocol the training loop uses, and the colocated
(veRL-style) backend. The hybrid backend lives in `rlboost.hybrid`."""

from rlboost.rollout.colocated import ColocatedRollout, RolloutBackend, new_groups, run_colocated, sample_seed
from rlboost.rollout.config import RolloutConfig
from rlboost.rollout.sample import Group, Sample

__all__ = ["ColocatedRollout", "Group", "RolloutBackend", "Sample", "RolloutConfig", "new_groups", "run_colocated",
           "sample_seed"]
