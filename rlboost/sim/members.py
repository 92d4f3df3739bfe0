"""The members of a simulated cluster (`rlboost.sim.cluster`): rollout engines, each one worker of a
step, and the preemptible instances that hold them."""

from __future__ import annotations

from dataclasses import dataclass, field

from rlboost.policies.profile import ThroughputProfile
from rlboost.rollout.step_data import PREEMPTIBLE, RESERVED
from rlboost.sim.batching import EngineState


class SimEngine:
    """One rollout engine = one worker of the step."""

    __slots__ = ("name", "instance", "kind", "state", "profile", "gen", "held")

    def __init__(self, name: str, instance: str | None, state: EngineState, profile: ThroughputProfile):
        self.name, self.instance, self.state, self.profile = name, instance, state, profile
        self.kind = RESERVED if instance is None else PREEMPTIBLE
        self.gen = 0  # bumped on every reschedule; older heap entries are stale
        self.held: dict[str, int] = {}
        """Request id -> response tokens its sample held when submitted here."""


@dataclass(slots=True)
class SimInstance:
    """One preemptible instance: booted, then pulling, then serving with its engines."""

    name: str
    launched: float
    engines: list[SimEngine] = field(default_factory=list)
    booted: bool = False
    version: int | None = None  # the weights it serves; None while booting or pulling
    doomed: bool = False
    holds: int | None = None
    """The newest version whose weights it holds, also while pulling a newer one; None: only the base
    model from its own disk (booting, or in its first pull)."""
    pull_started: float = 0.0
    pull_s: float = 0.0  # how long its latest pull takes
    served: bool = False  # it has held the newest weights once: provisioned


__all__ = ["SimEngine", "SimInstance"]
