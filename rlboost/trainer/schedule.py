"""Where a training step's groups fall: micro-batch passes and optimizer steps, as events.

Pure (no torch, no Ray, no clock): both trainer drivers feed it the groups as they arrive and run
what it returns, the in-process `Trainer` at world size 1 and the sharded `TrainerGroup` at N.

Contract (docs/training.md, "The trainer"):
- A step expects exactly `num_groups` finished groups (`check_finished` on each; `finish` raises when
  the rollout delivered fewer). A mini-batch is `mini_batch_groups` groups (0: the whole step); the
  step's last mini-batch is whatever is left.
- Each group is dealt to a rank as it arrives (`deal(i)`, i its index in the mini-batch; round-robin
  by default). As soon as every rank holds `micro_batch_groups` groups, one `MicroBatch` runs a
  micro-batch on every rank together. When a mini-batch is complete, the groups still held run in
  further `MicroBatch`es (a rank with none left gets `None`: a dummy pass, for sharded ranks run in
  lock-step), then one `OptimizerStep`. At world size 1 this is: a micro-batch every
  `micro_batch_groups` groups, and the mini-batch's remainder as one more.
- TIS needs one optimizer step per RL step (`check_tis`), refused before any group is trained.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rlboost.rollout.sample import Group


@dataclass(frozen=True)
class MicroBatch:
    """One forward/backward pass on every rank together."""

    per_rank: tuple[list[Group] | None, ...]
    """Rank r's groups for this pass; None: rank r has none left in this mini-batch (a dummy pass)."""


@dataclass(frozen=True)
class OptimizerStep:
    """The mini-batch is complete: every rank steps its optimizer."""

    index: int
    """0-based, within the training step."""


class BatchSchedule:
    """One training step's schedule. `add` each arriving group and run the events it returns, in order;
    stop pulling groups once `done`; `finish` checks the step got all its groups."""

    def __init__(self, num_groups: int, micro_batch_groups: int, mini_batch_groups: int, *, tis_cap: float = 0.0,
                 world_size: int = 1, deal: Callable[[int], int] | None = None):
        self.num_groups = num_groups
        self.micro = micro_batch_groups
        self.mini_size = mini_batch_groups or num_groups
        check_tis(tis_cap, self.mini_size, num_groups)
        self.world_size = world_size
        self.deal = deal or (lambda i: i % world_size)
        self.queues: list[list[Group]] = [[] for _ in range(world_size)]
        self.consumed = 0
        """Groups added so far."""
        self.in_mini = 0
        """Groups added to the current mini-batch."""
        self.optimizer_steps = 0

    @property
    def done(self) -> bool:
        return self.consumed == self.num_groups

    def add(self, group: Group) -> list[MicroBatch | OptimizerStep]:
        check_finished(group)
        rank = self.deal(self.in_mini)
        if not 0 <= rank < self.world_size:
            raise ValueError(f"dealt group {group.index} to rank {rank} of {self.world_size}")
        self.queues[rank].append(group)
        self.consumed += 1
        self.in_mini += 1
        events: list[MicroBatch | OptimizerStep] = []
        while all(len(q) >= self.micro for q in self.queues):  # every rank has a micro-batch: run them together
            events.append(self._pass())
        if self.in_mini == self.mini_size or self.done:
            while any(self.queues):  # the rest of the mini-batch; a rank with nothing left runs a dummy pass
                events.append(self._pass())
            events.append(OptimizerStep(self.optimizer_steps))
            self.optimizer_steps += 1
            self.in_mini = 0
        return events

    def finish(self) -> None:
        """Raise if the groups ran out before the step had all it expected."""
        if not self.done:
            raise RuntimeError(f"the rollout delivered {self.consumed} groups, the step expected {self.num_groups}")

    def _pass(self) -> MicroBatch:
        per_rank = tuple(q[:self.micro] or None for q in self.queues)
        for q in self.queues:
            del q[:self.micro]
        return MicroBatch(per_rank)


def optimizer_steps(num_groups: int, mini_batch_groups: int) -> int:
    """Optimizer steps in a training step of `num_groups` groups (mini-batches of `mini_batch_groups`,
    0: the whole step; the last one takes what is left)."""
    mini = mini_batch_groups or num_groups
    return -(-num_groups // mini)


def check_finished(group: Group) -> None:
    if not group.finished:
        raise ValueError(f"group {group.index} reached the trainer with unfinished samples")


def check_tis(tis_cap: float, mini_size: int, num_groups: int) -> None:
    """TIS weighs tokens by the trainer's starting log-probs, at hand only before a step's first update."""
    if tis_cap and mini_size < num_groups:
        raise ValueError(f"trainer.tis_cap needs one optimizer step per RL step, but trainer.mini_batch_groups="
                         f"{mini_size} splits the step's {num_groups} groups: set trainer.mini_batch_groups=0")


__all__ = ["BatchSchedule", "MicroBatch", "OptimizerStep", "check_finished", "check_tis", "optimizer_steps"]
