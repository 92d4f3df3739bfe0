"""The no-regret seeding hand-off: whether the instances serving a step should take its remaining
rollout now, or the step should stay colocated a while longer.

Contract: at the end of the seeding window (and again every `StepConfig.handoff_check_s` while it
is deferred) the step asks `handoff_pays(...)` with what it has measured: the tokens still to
generate, the decode rates of the reserved workers and of the instances serving the step, and the
`StepOutlook` the offload controller learned from earlier steps (training time, tokens per sample,
the market's preemption rate). The answer compares two ends of the step:

- hand off: the instances generate the rest while the trainer trains on the groups as they come:
  the step ends at max(rest / R_inst, t_train);
- stay colocated: reserved workers and instances generate the rest together, then the trainer
  trains on everything: rest / (R_res + R_inst) + t_train.

R_inst is discounted by the market's preemption risk: an instance preempted after a fraction of
the horizon has served only that fraction, so the expected capacity over a horizon h is
(1 − e^(−λh)) / (λh) of the nominal one. The hand-off happens only when it is expected to end the
step sooner; as the rest shrinks it always does (its end tends to t_train, the colocated one to
t_train plus the rest), so a deferred hand-off comes later in the step, never never.

Pure: numbers in, a bool out; no clock, no Ray, no torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class StepOutlook:
    """What earlier steps say about the coming one (`OffloadController.outlook()`)."""

    tokens_per_sample: float
    """Mean response tokens per sample of the last step: the rest of a step is its samples times
    this, less what they already hold."""
    train_s: float
    """Trainer compute time of the last step."""
    preemptions_per_instance_s: float = 0.0
    """λ: preemptions per instance-second the market showed recently (0: none seen)."""
    reserved_worker_tokens_per_s: float = 0.0
    """Sustained decode rate of one reserved worker: its tokens over the seconds it held samples, tail
    included, in earlier steps (0: not measured)."""
    instance_worker_tokens_per_s: float = 0.0
    """The same for one preemptible worker (0: not measured; then taken as a reserved worker's)."""


def expected_capacity(horizon_s: float, preemptions_per_instance_s: float) -> float:
    """The fraction of an instance's nominal capacity expected over `horizon_s` when it is preempted
    at rate λ: (1 − e^(−λh)) / (λh), 1 for λ = 0."""
    x = preemptions_per_instance_s * horizon_s
    if x <= 1e-12:
        return 1.0
    return -math.expm1(-x) / x


def handoff_pays(rest_tokens: float, reserved_tokens_per_s: float, instance_tokens_per_s: float,
                 outlook: StepOutlook) -> bool:
    """Whether handing the rest of the rollout to the instances ends the step sooner than staying
    colocated (module docstring). Unknown rates (<= 0) cannot be compared: the reserved workers'
    unknown means no evidence against the hand-off (it happens, as the paper's controller does);
    the instances' unknown means nothing to hand to."""
    if instance_tokens_per_s <= 0:
        return False
    if reserved_tokens_per_s <= 0 or rest_tokens <= 0:
        return True
    nominal_s = rest_tokens / instance_tokens_per_s
    instances = instance_tokens_per_s * expected_capacity(nominal_s, outlook.preemptions_per_instance_s)
    handoff_end = max(rest_tokens / instances, outlook.train_s)
    colocated_end = rest_tokens / (reserved_tokens_per_s + instances) + outlook.train_s
    return handoff_end < colocated_end


def workers_should_hand_off(rest_tokens: float, reserved_workers: int, instance_workers: int,
                            outlook: StepOutlook) -> bool:
    """`handoff_pays` for whole workers at the outlook's sustained per-worker rates (an instance's,
    unmeasured, is a reserved worker's: the same engine). Before any step was measured: as if every
    worker were as fast and the colocated rollout took as long as training (then the instances must be
    at least 0.62 of the reserved workers, the root of n_i (n_r + n_i) = n_r²)."""
    reserved_rate = outlook.reserved_worker_tokens_per_s
    if reserved_rate <= 0 or outlook.tokens_per_sample <= 0 or outlook.train_s <= 0:
        return handoff_pays(reserved_workers, reserved_workers, instance_workers, StepOutlook(0.0, 1.0))
    instance_rate = outlook.instance_worker_tokens_per_s or reserved_rate
    return handoff_pays(rest_tokens, reserved_workers * reserved_rate, instance_workers * instance_rate, outlook)


__all__ = ["StepOutlook", "expected_capacity", "handoff_pays", "workers_should_hand_off"]
