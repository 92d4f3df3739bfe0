"""What a simulated run records: one `StepRecord` per training step (the instances it held over time
are `rlboost.spot.meter.InstanceMeter`'s, shared with the runtime). Plain data and arithmetic; the
cluster (`rlboost.sim.cluster`) fills them in."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class StepRecord:
    """One training step of a simulated run. Steps tile the run: a step lasts from its start (the
    reserved engines hold its weights) to the next step's start (its own weights are on them)."""

    step: int
    """Step index (the workload's step)."""
    start_s: float
    """When the step's rollout started."""
    end_s: float
    """When the next step could start: training done and the new weights on the reserved engines."""
    rollout_s: float
    """From the start to the step's last finished sample."""
    train_s: float
    """Trainer compute time (waits excluded)."""
    seed_s: float
    """T_seed of the step: the seeding window the controller chose (0 for the baselines)."""
    reserved_rollout_s: float
    """How long the reserved engines generated: the window, or the whole rollout without a hand-off."""
    tokens_generated: int
    """Decode tokens made on every engine during the step: responses + wasted + recomputed."""
    tokens_trained: int
    """Response tokens of the step's samples, each counted once (what throughput counts)."""
    instances_start: int
    """Instances launched and not ended when the step started (booting ones included)."""
    instances_end: int
    """The same when the step's training ended."""
    preemptions: int
    """Instances hard-killed by the trace during the step."""
    migrations: int
    """Samples moved to another engine: preempted, seed hand-off, rebalanced, noticed, released."""
    wasted_tokens: int
    """Tokens generated on killed instances and never streamed back (<= stream_interval per sample)."""
    recomputed_tokens: int
    """Tokens thrown away by migration=recompute (streamed, then discarded at a preemption)."""
    wait_train_s: float
    """Trainer idle time waiting for groups after it was given the reserved GPUs."""
    wait_remote_s: float
    """t_wait_remote: from the step's last response to the end of its training (0 without instances)."""
    usd: float
    """What the step cost: reserved nodes for end_s - start_s, instances for their seconds in it."""
    cap: int | None = None
    """The instance cap the controller set after the step (None: no cap)."""
    instance_s: float = 0.0
    """Instance-seconds billed in the step."""
    migrated: dict[str, int] = field(default_factory=dict)
    """Migrations by reason: preempted, seed_handoff, rebalanced, noticed, released (as the runtime's
    migration/* metrics)."""
    in_flight_at_preemption: int = 0
    """Samples held by instances when they were hard-killed (the bound on waste is per such sample)."""
    remote_s: float = 0.0
    """t_remote: from the first work an instance got in the step to its last response (0 when no
    instance got any)."""
    rollout_window: tuple[float, float] | None = None
    """(start, end) of the generation of the step's samples where it ran ahead of the step itself
    (verl-async: the rollout k versions ahead of the trainer); None: within the step."""


__all__ = ["StepRecord"]
