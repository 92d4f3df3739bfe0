"""What the training loop and the checkpoints ask of a trainer, whichever runs: the in-process
`Trainer` (world size 1) or the `TrainerGroup` of sharded ranks. Torch-free.

Contract: `train_step` trains on exactly `num_groups` finished groups pulled from `groups` and returns
veRL-named metrics (docs/training.md, "The trainer"; both run the same `BatchSchedule`); `publish` returns
the weights the rollout loads as `version` (a state dict where this process holds them whole, else the manifest
of the version published in the weight store); the checkpoint calls read and write the state that
`rlboost/checkpoint.py` lays out; `close` releases what the trainer holds (its ranks)."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from rlboost.cluster.config import WeightsConfig
    from rlboost.rollout.sample import Group


class PolicyTrainer(Protocol):
    def train_step(self, groups: Iterable[Group], num_groups: int, step: int | None = None) -> dict[str, float]:
        """`step`: the RL step, named in a sharded trainer's errors."""

    def publish(self, version: int, store: WeightsConfig, dtype: str) -> Any:
        """The weights after the last step: a state dict of tensors, or a `WeightManifest` of a version
        put in the weight store as `store` says, in `dtype` (the engines' own)."""

    def save_state(self, folder: Path) -> None:
        """Model and optimizer state (DCP shards: loads at any world size)."""

    def load_state(self, folder: Path) -> None: ...

    def load_unsharded_state(self, hf_folder: Path, optimizer_state: dict) -> None:
        """A checkpoint of an earlier version (no DCP shards): only a world-1 trainer loads one."""

    def export_hf(self, folder: Path) -> None:
        """The policy as an HF checkpoint folder."""

    def scheduler_state(self) -> dict: ...

    def load_scheduler_state(self, scheduler_state: dict) -> None: ...

    def close(self) -> None: ...


__all__ = ["PolicyTrainer"]
