"""The loop between steps (RLBoost's central loop, docs/elastic.md,
"The offload controller"), shared by the runtime and the simulator.

Contract: `begin(instances)` opens a training step with the n instances held at its start and
returns its `StepPlan` (T_seed and the no-regret outlook); `end(outcome)` closes it with what the
shell measured (`StepOutcome`), builds the controller's `StepTimings` (here and nowhere else),
updates the controller and returns the instance cap the provider may hold for the next step (None:
no cap, also when `offload.enforce_cap` is false: then the controller's cap is only `advised`). Between the two the shell runs the step (`rlboost.rollout.step_state.StepState`). Pure: no
clock, no Ray, no torch; both shells measure in their own seconds (monotonic or simulated).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from rlboost.policies.handoff import StepOutlook
from rlboost.policies.offload import OffloadController, StepTimings


@dataclass(frozen=True)
class StepPlan:
    """How a training step runs its seeding window."""

    seed_window_s: float
    """T_seed: how long the reserved workers generate before they hand off."""
    outlook: StepOutlook | None
    """What the hand-off is weighed with (None: it happens at the window's end)."""


@dataclass(frozen=True)
class StepOutcome:
    """What a finished training step measured, as the shell saw it."""

    instances_start: int
    """Instances held (or booting) when the step started: n of M[n] and of the cap."""
    instances_end: int
    """The same when the step's training ended."""
    preemptions: int
    """Instances preempted during the step (between steps included: they change n too)."""
    wall_s: float
    """From the step's start to the end of its training."""
    train_s: float
    """Trainer compute time (the seeding window and waits for groups excluded)."""
    wait_train_s: float
    """Trainer idle time waiting for groups after it was given the reserved resources."""
    remote_s: float
    """t_remote: the instances' first work to the step's last response (StepState.remote_timings)."""
    wait_remote_s: float
    """t_wait_remote: the step's last response to the end of its training."""
    samples: int
    """Samples of the step."""
    response_tokens: int
    """Response tokens of the step's samples, each counted once: the step's throughput is these over
    `wall_s`."""
    instance_s: float
    """Instance-seconds held during the step (booting and pulling included)."""
    provision_s: Sequence[float] = ()
    """Launch-to-serving times of the instances that became ready during the step."""
    measured: Mapping[str, float] = field(default_factory=dict)
    """What the step itself measured for the controller (`StepStats.offload_measurements()`)."""


def step_timings(o: StepOutcome) -> StepTimings:
    """The controller's view of a step: n held steady means no preemption and as many instances at
    the end as at the start."""
    return StepTimings(
        instances=o.instances_start, stable=o.instances_end == o.instances_start and o.preemptions == 0,
        wait_train_s=o.wait_train_s, wait_remote_s=o.wait_remote_s, remote_s=o.remote_s, train_s=o.train_s,
        tokens_per_s=o.response_tokens / max(o.wall_s, 1e-9), samples=o.samples, preemptions=o.preemptions,
        instance_s=o.instance_s, provision_s=math.fsum(o.provision_s) / len(o.provision_s) if o.provision_s else math.nan,
        **o.measured)


class OffloadLoop:
    """Algorithm 1 around the steps: T_seed before a step, the controller's update and the cap after it."""

    def __init__(self, controller: OffloadController):
        self.controller = controller
        self.cap: int | None = None
        """The cap set after the last step (None: none yet, or no cap)."""
        self.advised: int | None = None
        """The controller's cap after the last step, enforced or not (None: none yet, or no cap)."""

    def begin(self, instances: int) -> StepPlan:
        """A training step starts with `instances` instances held or booting."""
        return StepPlan(self.controller.seed_for(instances), self.controller.outlook())

    def end(self, outcome: StepOutcome) -> int | None:
        """The step's training ended: learn from it; returns the cap on instances for the next step."""
        self.controller.update(step_timings(outcome))
        self.advised = self.controller.instance_cap()
        self.cap = self.advised if self.controller.cfg.enforce_cap else None
        return self.cap


__all__ = ["OffloadLoop", "StepOutcome", "StepPlan", "step_timings"]
