"""When the step's decisions may be skipped: the StepState's CPU gates, in one place.

The step decides on every turn of its shell (hundreds per second in the runtime, at every event in the
simulator), but its decisions are pure functions of a few inputs: who may take work, what each worker
holds, the plateaus, who is owed a share. `DecisionGates` counts changes to those inputs, and remembers
the inputs at which a decision found nothing to do or a derived value was computed, so an unchanged
step costs O(1) per turn. Correctness rests on one rule: every event that changes a worker's samples
calls `changed()`, and every change of who may take work calls `changed(members=True)`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


class DecisionGates:
    __slots__ = ("changes", "members", "_idle", "_derived")

    def __init__(self):
        self.changes = 0
        """Bumped whenever what the dispatcher or the balancer would decide may have changed: a worker's
        status, acceptance or samples."""
        self.members = 0
        """Bumped whenever who may take work changes (a worker's status or acceptance)."""
        self._idle: dict[str, tuple] = {}
        """Decision -> (changes, *inputs) at which it last found nothing to do."""
        self._derived: dict[str, tuple[int, object]] = {}
        """Value -> (members, the value) computed from the membership."""

    def changed(self, members: bool = False) -> None:
        """A worker's samples changed, or (`members`) who may take work."""
        self.changes += 1
        if members:
            self.members += 1

    def idle(self, decision: str, *inputs) -> bool:
        """Whether `decision` found nothing to do at these inputs with nothing changed since: it would
        find nothing again (the policies are pure)."""
        return self._idle.get(decision) == (self.changes, *inputs)

    def found_nothing(self, decision: str, *inputs) -> None:
        self._idle[decision] = (self.changes, *inputs)

    def per_membership(self, value: str, compute: Callable[[], T], keep: Callable[[T], bool] | None = None) -> T:
        """`compute()`, recomputed only when who may take work has changed, or when `keep` says the
        value went stale for another reason (time)."""
        hit = self._derived.get(value)
        if hit is None or hit[0] != self.members or (keep is not None and not keep(hit[1])):
            hit = (self.members, compute())
            self._derived[value] = hit
        return hit[1]


__all__ = ["DecisionGates"]
