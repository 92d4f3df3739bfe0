"""The books of the preemptible instances a simulated run rents (`SpotInstances`): which ones exist
and under what names, which the spot trace starts, warns, kills and releases, how long each weight
pull takes, and how many instances the run held over time (what a cloud bills).

Contract: the cluster (`rlboost.sim.cluster`) asks `decide(now, cap)` at each of the trace's
decision times and at each step's start, and carries the actions out through `launch` and `end`; it
starts a pull with `pull` and lands it with `pulled`. What an instance does in a step (boot its
engines, join, serve, get noticed, die with its samples) stays the cluster's: this module only
keeps the books. Pure: no events, no clock; the only randomness is the trace replay's seeded
choice of victims.
"""

from __future__ import annotations

from rlboost.sim.members import SimInstance
from rlboost.sim.pulls import PullTimes
from rlboost.spot.meter import InstanceMeter
from rlboost.spot.trace import ReplayActions, TraceReplay


class SpotInstances:
    """The preemptible instances of one run; `replay` None: the run rents none."""

    def __init__(self, replay: TraceReplay | None, pulls: PullTimes):
        self.replay = replay
        self.pulls = pulls
        self.instances: dict[str, SimInstance] = {}
        """Launched and not ended, by name (booting, pulling and noticed ones included)."""
        self.held = InstanceMeter()
        self.caps: list[tuple[float, int | None]] = []
        """(time, the instance cap from then on), one entry per change the trace replay saw."""
        self.preemptions = 0
        """Instances the trace hard-killed over the run."""
        self.longest_pull_s = pulls.longest_planned_s
        """The longest pull planned or seen: how long the step waits for a pulling instance's share."""
        self._launched = 0

    def decide(self, now: float, cap: int | None) -> ReplayActions | None:
        """What the trace does to the instances at `now` under `cap`; None without a trace."""
        if self.replay is None:
            return None
        if not self.caps or self.caps[-1][1] != cap:
            self.caps.append((now, cap))
        # The replay sees what the runtime's trace provider shows it: the instances that have booted
        # (the manager admitted them) by name, the booting ones as a count. A drop kills booted ones
        # only; a boot in progress holds its slot. Shown booting ones by name, the twin of a run whose
        # instances boot for longer than a step lost them to drops the run never saw, and its offload
        # objective then gave every instance back (docs/staleness.md, the emulated rows).
        booted = [name for name, inst in self.instances.items() if inst.booted]
        return self.replay.step(now, booted, len(self.instances) - len(booted), cap)

    def launch(self, now: float) -> SimInstance:
        """A new instance, booting from `now`; names run i0, i1, ... in launch order."""
        inst = SimInstance(f"i{self._launched}", now)
        self._launched += 1
        self.instances[inst.name] = inst
        self.held.count(+1, now)
        return inst

    def end(self, name: str, now: float, preempted: bool) -> SimInstance:
        """The instance `name` ends at `now`: hard-killed by the trace (preempted) or given back."""
        inst = self.instances.pop(name)
        self.held.count(-1, now)
        if preempted:
            self.preemptions += 1
        return inst

    def pull(self, inst: SimInstance, now: float, version: int) -> float:
        """`inst` starts pulling `version` at `now`: a patch, from the base or whole, by what it holds.
        Returns when the pull lands."""
        inst.pull_started = now
        inst.pull_s = self.pulls.seconds(inst.holds, version)
        return now + inst.pull_s

    def pulled(self, inst: SimInstance, version: int) -> None:
        """`inst`'s pull of `version` landed: it holds those weights."""
        inst.holds = version
        self.longest_pull_s = max(self.longest_pull_s, inst.pull_s)


__all__ = ["SpotInstances"]
