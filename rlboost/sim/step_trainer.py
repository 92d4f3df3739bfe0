"""The trainer's side of one simulated training step (`StepTrainer`): the groups whose samples all
finished, waiting in the order they finished, the one group it trains at a time, and its time spent
training and waiting, counted in the step's `StepTotals`.

Contract: the cluster (`rlboost.sim.cluster`) makes one per step, hands it the trainer's GPUs with
`release` (colocated: when the step releases the reserved GPUs or its rollout ends; disaggregated: at
once), queues each finished group on `ready`, and whenever `can_train()` (and the reserved GPUs are
not generating again after a fallback, the cluster's call) starts the next group with `start`, whose
seconds it schedules; `finish` lands it. Waits count from the release or the last group's end to
the next group's start. Plain bookkeeping: no events, no clock; every time is the simulated one
passed in.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from rlboost.sim.step_totals import StepTotals


class StepTrainer:
    """The trainer of one step of `groups` groups; its compute and waits go to `totals`."""

    def __init__(self, totals: StepTotals, groups: int):
        self.totals = totals
        self.groups = groups
        self.ready: deque[int] = deque()
        """Groups whose samples all finished and that are not trained yet, in the order they finished."""
        self.training: int | None = None
        """The group being trained; None while the trainer is idle."""
        self.trained = 0
        """Groups trained so far."""
        self.released = False
        """The trainer holds its GPUs (colocated: the reserved ones, released by the rollout)."""
        self.idle_since: float | None = None
        """When the trainer last ran out of work (its release, or its last group's end); None while training."""

    def release(self, now: float) -> None:
        """The trainer gets its GPUs at `now` and waits for groups from then on."""
        self.released = True
        self.idle_since = now

    def can_train(self) -> bool:
        """It holds its GPUs, trains nothing, and a finished group waits."""
        return self.released and self.training is None and bool(self.ready)

    def start(self, now: float, seconds_of: Callable[[int], float]) -> tuple[int, float]:
        """Start training the oldest finished group at `now`: (the group, its seconds by `seconds_of`)."""
        g = self.ready.popleft()
        if self.idle_since is not None:
            self.totals.wait_train_s += now - self.idle_since
            self.idle_since = None
        seconds = seconds_of(g)
        self.totals.train_s += seconds
        self.training = g
        return g, seconds

    def finish(self, now: float) -> bool:
        """The group in training is done at `now`; True when it was the step's last."""
        self.training = None
        self.trained += 1
        if self.trained < self.groups:
            self.idle_since = now
            return False
        return True


__all__ = ["StepTrainer"]
