"""What an instance must be worth to be kept: the offload objective (`rollout.hybrid.offload.objective`).

Contract: after every steady step (no join, no preemption) the controller reports the instances it
held and its throughput (`observe`); they build a table of throughput by instance count (a running
mean, then an exponential one of weight `smoothing`: one step is ±10% noise against a price margin
of a few percent). A count is judged once `judge_after` steps were seen with it (the controller
learns its window meanwhile). `cap()` then says how many instances the objective allows, from
measured throughputs and the prices alone:

- throughput: no limit from prices (the paper's controller: instances while they speed up the run);
- balanced: the n-th instance is kept while the run's tokens per dollar at n stays at least the
  colocated run's (0 instances): the run is never costlier per token than not using spot, and as
  fast as that allows;
- cost: the n-th instance is kept while it raises tokens per dollar over n − 1 instances.

Tokens per dollar at n = throughput(n) / (reserved $/s + n × instance $/s). When the comparison's
other side was never measured: with one instance the cap drops to 0 for a step to measure it (that
step is the colocated baseline itself, so exploring costs no regret); with more, the instances are
taken to pay, so instances dearer than they are worth go unnoticed in a market that never leaves
the run without any (docs/simulator.md, "No regret on scarce markets"). A limit is lifted again
after `retry_steps` steps, so a market whose prices or speeds moved is measured anew. Pure: no clock.
"""

from __future__ import annotations

import math

OBJECTIVES = ("throughput", "balanced", "cost")


class InstanceValue:
    def __init__(self, objective: str, reserved_usd_per_s: float, instance_usd_per_s: float,
                 smoothing: float = 0.1, retry_steps: int = 10, judge_after: int = 3):
        if objective not in OBJECTIVES:
            raise ValueError(f"objective={objective!r}; valid: {', '.join(OBJECTIVES)}")
        if reserved_usd_per_s < 0 or instance_usd_per_s < 0:
            raise ValueError("prices must be >= 0")
        self.objective = objective
        self.reserved_usd_per_s, self.instance_usd_per_s = reserved_usd_per_s, instance_usd_per_s
        self.smoothing, self.retry_steps, self.judge_after = smoothing, retry_steps, judge_after
        self.tokens_per_s: dict[int, float] = {}
        """Smoothed throughput of steady steps by instance count."""
        self.steps: dict[int, int] = {}
        """Steady steps seen by instance count."""
        self.limit: int | None = None
        """The cap the objective set; None: none."""
        self._limit_age = 0

    def observe(self, instances: int, tokens_per_s: float) -> None:
        """A finished steady step with `instances`."""
        if math.isfinite(tokens_per_s) and tokens_per_s > 0:
            seen = self.steps.get(instances, 0) + 1
            self.steps[instances] = seen
            # a running mean over the first 1 / smoothing steps, an exponential average after
            weight = max(1.0 / seen, self.smoothing)
            old = self.tokens_per_s.get(instances, tokens_per_s)
            self.tokens_per_s[instances] = (1 - weight) * old + weight * tokens_per_s
        if self.limit is not None:
            self._limit_age += 1
            if self._limit_age >= self.retry_steps:
                self.limit = None  # measure again: the market or the workload may have moved
        if self.objective == "throughput" or self.instance_usd_per_s == 0:
            return
        if instances >= 1 and self._pays(instances) is False:
            if self.limit is None or instances - 1 < self.limit:
                self.limit, self._limit_age = instances - 1, 0
        if self.limit is not None and self._pays(self.limit + 1):
            self.limit = None  # both sides measured now, and the count above the limit pays

    def tokens_per_usd(self, instances: int) -> float | None:
        tps = self.tokens_per_s.get(instances)
        if tps is None:
            return None
        usd_per_s = self.reserved_usd_per_s + instances * self.instance_usd_per_s
        return tps / usd_per_s if usd_per_s > 0 else math.inf

    def _pays(self, n: int) -> bool | None:
        """Whether the n-th instance meets the objective: None when n was never measured; False when
        the comparison's other side was never measured and is worth a step to explore."""
        here = self.tokens_per_usd(n)
        if here is None or self.steps.get(n, 0) < self.judge_after:
            return None  # the controller needs a few steps at n to learn its window: judge it after
        reference = 0 if self.objective == "balanced" else n - 1
        there = self.tokens_per_usd(reference)
        if there is None:
            # exploring n - 1 costs a step with one instance fewer: for n = 1 that is the colocated
            # step itself, never a regret; above, the instances present are taken to pay
            return False if n == 1 else True
        return here >= there

    def cap(self) -> int | None:
        """The most instances the objective allows now; None: no limit."""
        return self.limit

    def state_dict(self) -> dict:
        return {"tokens_per_s": {str(n): v for n, v in self.tokens_per_s.items()}, "limit": self.limit,
                "limit_age": self._limit_age, "steps": {str(n): v for n, v in self.steps.items()}}

    def load_state_dict(self, state: dict) -> None:
        self.tokens_per_s = {int(n): float(v) for n, v in state.get("tokens_per_s", {}).items()}
        self.limit = state.get("limit")
        self._limit_age = int(state.get("limit_age", 0))
        self.steps = {int(n): int(v) for n, v in state.get("steps", {}).items()}


__all__ = ["OBJECTIVES", "InstanceValue"]
