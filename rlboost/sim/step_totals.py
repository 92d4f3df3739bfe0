"""What the simulated cluster (`rlboost.sim.cluster`) counts while one training step runs (`StepTotals`),
and the two summaries made of those counts: the step's `StepRecord` (the run's result) and the
`StepOutcome` the offload loop learns from.

Contract: the cluster opens a `StepTotals` when a step starts, with the run's running counters at
that instant (decode tokens made, instance-seconds held), adds to it as events happen (preemptions,
provisioning times, trainer compute and waits, the rollout's end, the remote timings), takes
`outcome(...)` when the step's training ends and `record(...)` when the next step starts (a step
lasts until its successor's weights are on the reserved engines). Plain data and arithmetic: no
events, no clock; every time is the simulated one the cluster passes in.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from rlboost.policies.offload_loop import StepOutcome
from rlboost.rollout.step_data import StepStats
from rlboost.sim.records import StepRecord


@dataclass
class StepTotals:
    """The counters of one simulated step, from its start to the next step's start."""

    step: int
    """The step's index (the workload's step; its weights are version `step`)."""
    start_s: float
    """When the step started: its weights on the reserved engines."""
    tokens_before: int
    """Decode tokens the run's engines had made before the step (the step made the rest)."""
    instance_s_before: float
    """Instance-seconds the run had held before the step (the step is billed the rest)."""
    seed_s: float = 0.0
    """T_seed the step ran with: the offload loop's seeding window, or the fixed one (0 without a
    hand-off: the disaggregated layout)."""
    instances_start: int = 0
    """Instances launched and not ended once the step's start was replayed (booting ones included)."""
    instances_end: int = 0
    """The same when the step's training ended."""
    preemptions: int = 0
    """Instances the trace hard-killed from the step's start to the next step's start."""
    provision_s: list[float] = field(default_factory=list)
    """Launch-to-serving seconds of each instance that first held the newest weights during the step."""
    rollout_end_s: float | None = None
    """When the step's last sample finished; None while the rollout is under way."""
    train_s: float = 0.0
    """Trainer compute seconds (waits excluded)."""
    wait_train_s: float = 0.0
    """Seconds the trainer waited for groups after it was given the reserved GPUs."""
    remote_s: float = 0.0
    """t_remote: the instances' first work in the step to its last response (set when training ends)."""
    wait_remote_s: float = 0.0
    """t_wait_remote: the step's last response to the end of its training (set when training ends)."""

    def instance_s(self, held_s: float) -> float:
        """Instance-seconds of the step so far, from `held_s`, those the run has held until now."""
        return held_s - self.instance_s_before

    def outcome(self, now: float, *, held_s: float, samples: int, response_tokens: int,
                measured: Mapping[str, float]) -> StepOutcome:
        """What the offload loop learns from the step, its training having ended at `now`. The
        outcome shares `provision_s` (instances that serve later in the step still count)."""
        return StepOutcome(
            instances_start=self.instances_start, instances_end=self.instances_end, preemptions=self.preemptions,
            wall_s=now - self.start_s, train_s=self.train_s, wait_train_s=self.wait_train_s, remote_s=self.remote_s,
            wait_remote_s=self.wait_remote_s, samples=samples, response_tokens=response_tokens,
            instance_s=self.instance_s(held_s), provision_s=self.provision_s, measured=measured)

    def record(self, end_s: float, stats: StepStats, *, colocated: bool, tokens_made: int, tokens_trained: int,
               instance_s: float, usd: float, cap: int | None) -> StepRecord:
        """The step's record, the next step starting at `end_s`. `tokens_made`: the run's decode tokens
        until now; `instance_s` and `usd`: what the step was billed; `cap`: the instance cap set after it."""
        rollout_s = self.rollout_end_s - self.start_s
        # With a hand-off the reserved engines generated for the window; else (disaggregated, or a
        # fallback that gave them the work back) to the rollout's end.
        reserved_rollout_s = stats.seed_s if colocated and not stats.fallback else rollout_s
        return StepRecord(
            step=self.step, start_s=self.start_s, end_s=end_s, rollout_s=rollout_s, train_s=self.train_s,
            seed_s=self.seed_s, reserved_rollout_s=reserved_rollout_s,
            tokens_generated=tokens_made - self.tokens_before, tokens_trained=tokens_trained,
            instances_start=self.instances_start, instances_end=self.instances_end, preemptions=self.preemptions,
            migrations=sum(stats.migrated.values()), wasted_tokens=stats.wasted_tokens,
            recomputed_tokens=stats.recomputed_tokens, wait_train_s=self.wait_train_s,
            wait_remote_s=self.wait_remote_s, usd=usd, cap=cap, instance_s=instance_s, migrated=dict(stats.migrated),
            in_flight_at_preemption=stats.in_flight_at_preemption, remote_s=self.remote_s)


__all__ = ["StepTotals"]
