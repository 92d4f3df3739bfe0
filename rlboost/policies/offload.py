"""Adaptive rollout offload (RLBoost, Algorithm 1): the seeding window T_seed and the instance cap.

Contract: a step starts with n preemptible instances; the reserved workers generate alongside them
for T_seed seconds (`seed_for(n)`), then train on groups as they stream in. After the step the
caller reports its `StepTimings` to `update`, which moves T_seed by (t_wait_train − t_wait_remote)/η
within [min_seed_s, max_seed_s], remembers as M[n] the step's T_seed if it gave the best throughput
seen with n instances held steady, and recomputes the cap on instances worth holding. When n changes,
the next step starts from M[n]. Pure: no clock, no randomness, so the runtime and the simulator share it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from rlboost.policies.handoff import StepOutlook
from rlboost.policies.objective import OBJECTIVES, InstanceValue

_PREFIX = "rollout.hybrid.offload"


@dataclass
class OffloadConfig:
    enabled: bool = True
    """False: T_seed stays at `rollout.hybrid.seed_window_s` and there is no instance cap."""
    eta: float = 2.0
    """η: the damping divisor of the T_seed update; larger moves slower but overshoots less."""
    min_seed_s: float = 0.0
    """Lower bound on T_seed."""
    max_seed_s: float = 120.0
    """Upper bound on T_seed."""
    min_instances: int = 1
    """The instance cap never goes below this, so the step keeps instances to learn from."""
    max_instances: int | None = None
    """The instance cap never goes above this; None: unbounded."""
    memory: bool = True
    """False: M[n] is neither stored nor reused (the rlboost-nomemory ablation)."""
    objective: str = "balanced"
    """What an instance must be worth to be requested or kept (rlboost.policies.objective):
    throughput (the paper's: while it speeds the run up, whatever it costs), balanced (while the run's
    tokens per dollar stays at least the colocated run's: never costlier per token than not using
    spot) or cost (while it raises tokens per dollar). Judged from measured step throughputs and the
    `cost.*` prices; the cap may then go below min_instances, to 0."""
    gate_handoff: bool = True
    """Hand the rollout to the instances only when they would end the step sooner than staying
    colocated, from measured rates (rlboost.policies.handoff); until then the reserved workers keep
    generating beside them. False: the hand-off happens at the window's end whatever the instances
    can do (the paper's controller)."""
    preemption_risk: bool = True
    """Discount what instances are expected to do by the market's recent preemption rate (decayed by
    `risk_decay` per step). False: instances are taken never to be preempted."""
    risk_decay: float = 0.8
    """Weight of the past in the market's preemption rate, per step: 0 keeps only the last step."""
    max_provision_share: float = 0.5
    """No instance is requested while the market preempts one, on average, before it has served as
    long as it took to provision (λ × provisioning time above this share of its expected life): its
    boot and weight pull would be billed for little or no rollout. Retried after `retry_steps`."""
    retry_steps: int = 10
    """Steps after which a cap set by the market's risk or by the objective is lifted, to measure again."""
    enforce_cap: bool = True
    """False: the cap is computed and reported (`spot/cap_advised`, and the report's summary) but the
    provider is not held to it and keeps every instance its market offers. For a demonstration: on
    one machine the instances share the trainer's cores, so the objective would give them back, and
    a run that exists to show preemption, migration and joins would show none of them."""

    def validate(self) -> None:
        if not (self.eta > 0 and math.isfinite(self.eta)):
            raise ValueError(f"{_PREFIX}.eta must be a finite number > 0, got {self.eta}")
        if not (0 <= self.min_seed_s and math.isfinite(self.min_seed_s)):
            raise ValueError(f"{_PREFIX}.min_seed_s must be finite and >= 0, got {self.min_seed_s}")
        if not (self.min_seed_s <= self.max_seed_s and math.isfinite(self.max_seed_s)):
            raise ValueError(f"{_PREFIX}.max_seed_s must be finite and >= min_seed_s, got {self.max_seed_s}")
        if self.min_instances < 0:
            raise ValueError(f"{_PREFIX}.min_instances must be >= 0, got {self.min_instances}")
        if self.max_instances is not None and self.max_instances < self.min_instances:
            raise ValueError(f"{_PREFIX}.max_instances must be >= min_instances, got {self.max_instances}")
        if self.objective not in OBJECTIVES:
            raise ValueError(f"{_PREFIX}.objective={self.objective!r}; valid: {', '.join(OBJECTIVES)}")
        if not (0 < self.max_provision_share and math.isfinite(self.max_provision_share)):
            raise ValueError(f"{_PREFIX}.max_provision_share must be a finite number > 0, got {self.max_provision_share}")
        if self.retry_steps < 1:
            raise ValueError(f"{_PREFIX}.retry_steps must be >= 1, got {self.retry_steps}")
        if not 0 <= self.risk_decay < 1:
            raise ValueError(f"{_PREFIX}.risk_decay must be in [0, 1), got {self.risk_decay}")


@dataclass
class StepTimings:
    """What one finished step measured, in seconds."""
    instances: int  # n: preemptible instances at the step's start
    stable: bool  # n did not change during the step (no preemption, no join)
    wait_train_s: float  # trainer idle waiting for micro-batches after the seeding window
    wait_remote_s: float  # instances idle after their last response until the step ended
    remote_s: float  # how long the instances generated: their first work to their last response
    train_s: float  # the trainer's compute time in the step
    tokens_per_s: float = math.nan  # the step's throughput; M[n] keeps the T_seed of the best (NaN: unknown)
    seed_s: float = math.nan  # the window the step really had when its hand-off was deferred (NaN: as planned)
    tokens: int = 0  # response tokens of the step
    samples: int = 0  # samples of the step
    preemptions: int = 0  # instances preempted during the step
    instance_s: float = 0.0  # instance-seconds the step held (booting and pulling included)
    reserved_worker_tokens_per_s: float = math.nan  # a reserved worker's tokens per second it held samples
    instance_worker_tokens_per_s: float = math.nan  # the same for a preemptible worker (NaN: none generated)
    provision_s: float = math.nan  # mean launch-to-serving time of the instances that became ready (NaN: none)


class OffloadController:
    def __init__(self, cfg: OffloadConfig, initial_seed_s: float, num_reserved: int, *,
                 reserved_usd_per_s: float = 0.0, instance_usd_per_s: float = 0.0):
        """`reserved_usd_per_s`, `instance_usd_per_s`: what the reserved nodes and one instance cost;
        with an instance price of 0 the objective sets no cap (nothing to weigh)."""
        cfg.validate()
        if num_reserved < 0:
            raise ValueError(f"num_reserved must be >= 0, got {num_reserved}")
        self.cfg = cfg
        self.num_reserved = num_reserved  # N_resv, in instance-equivalents of rollout throughput
        self.seed_s = self._clamp(initial_seed_s) if cfg.enabled else float(initial_seed_s)
        self.memory: dict[int, float] = {}  # M[n]: the T_seed of the best step seen with n instances
        self.memory_tokens_per_s: dict[int, float] = {}  # that step's throughput
        self._last_n: int | None = None  # n of the previous step: M[n] is for when n changes
        self._cap: int | None = None  # None until a step has measured the training time
        self._outlook: StepOutlook | None = None  # None until a step has been measured
        self._risk = (0.0, 0.0)  # decayed (preemptions, instance-seconds) of the market
        self._rates = [0.0, 0.0]  # sustained tokens/s of a reserved and of a preemptible worker (0: unknown)
        self.value = InstanceValue(cfg.objective, reserved_usd_per_s, instance_usd_per_s, retry_steps=cfg.retry_steps)
        self.provision_s = math.nan  # the latest measured launch-to-serving time of an instance
        self._short_lived = 0  # steps the market's risk has held the cap at 0 (0: it does not)

    def _clamp(self, seed_s: float) -> float:
        return min(max(float(seed_s), self.cfg.min_seed_s), self.cfg.max_seed_s)

    def seed_for(self, instances: int) -> float:
        # A known n restarts from the best window seen with it: after a preemption or a join, adapting
        # from the previous n's value would take several steps to get back. While n holds, T_seed
        # keeps adapting from where it is.
        changed, self._last_n = instances != self._last_n, instances
        if self.cfg.enabled and self.cfg.memory and changed and instances in self.memory:
            self.seed_s = self.memory[instances]
        return self.seed_s

    def update(self, t: StepTimings) -> float:
        if not self.cfg.enabled:
            return self.seed_s
        times = (t.wait_train_s, t.wait_remote_s, t.remote_s, t.train_s)
        if not all(math.isfinite(x) for x in times):
            return self.seed_s  # a broken measurement says nothing; keep the last decision
        step_seed_s = t.seed_s if math.isfinite(t.seed_s) else self.seed_s
        self._learn_market(t)
        if t.stable:
            self.value.observe(t.instances, t.tokens_per_s)
        # Trainer waiting: the instances are the bottleneck, so the reserved workers should generate
        # longer. Instances idle at the end: the trainer is, so hand it the reserved workers sooner.
        self.seed_s = self._clamp(step_seed_s + (t.wait_train_s - t.wait_remote_s) / self.cfg.eta)
        # A step whose n changed mixes two regimes; its outcome is no lesson for either n.
        if t.stable and self.cfg.memory:
            # unknown throughputs (NaN) cannot be ranked: then the latest steady step's window is kept
            best = self.memory_tokens_per_s.get(t.instances, math.nan)
            if math.isnan(t.tokens_per_s) or math.isnan(best) or t.tokens_per_s >= best:
                self.memory[t.instances] = step_seed_s
                self.memory_tokens_per_s[t.instances] = t.tokens_per_s
        if t.train_s > 0:
            # Instance-seconds of generation the step needed, spread over the training time: the
            # instances that let rollout keep pace with training. More would only sit idle.
            needed = (t.remote_s * t.instances + step_seed_s * self.num_reserved) / t.train_s
            cap = max(math.ceil(needed - 1e-9), self.cfg.min_instances)  # 1e-9: float noise at integers
            self._cap = cap if self.cfg.max_instances is None else min(cap, self.cfg.max_instances)
        return self.seed_s

    def _learn_market(self, t: StepTimings) -> None:
        d = self.cfg.risk_decay
        self._risk = (d * self._risk[0] + t.preemptions, d * self._risk[1] + t.instance_s)
        if math.isfinite(t.provision_s):
            self.provision_s = t.provision_s
        too_risky = self.preemption_rate() * self.provision_s > self.cfg.max_provision_share  # False while NaN
        if self._short_lived:
            self._short_lived += 1
            if self._short_lived > self.cfg.retry_steps:
                self._short_lived, self._risk = 0, (0.0, 0.0)  # measure the market anew
        elif too_risky and self.cfg.preemption_risk:
            self._short_lived = 1
        for i, rate in enumerate((t.reserved_worker_tokens_per_s, t.instance_worker_tokens_per_s)):
            if math.isfinite(rate) and rate > 0:  # the last step's: its workload is the next one's
                self._rates[i] = rate
        if t.samples > 0 and t.train_s > 0:
            self._outlook = StepOutlook(tokens_per_sample=t.tokens / t.samples, train_s=t.train_s)

    def preemption_rate(self) -> float:
        """λ: preemptions per instance-second, over recent steps (0 before any instance-second)."""
        preemptions, seconds = self._risk
        return preemptions / seconds if seconds > 0 else 0.0

    def outlook(self) -> StepOutlook | None:
        """What the next step's hand-off is weighed with (zeros where nothing was measured yet); None:
        no gate."""
        if not (self.cfg.enabled and self.cfg.gate_handoff):
            return None
        risk = self.preemption_rate() if self.cfg.preemption_risk else 0.0
        known = self._outlook or StepOutlook(0.0, 0.0)
        return StepOutlook(known.tokens_per_sample, known.train_s, risk, *self._rates)

    def instance_cap(self) -> int | None:
        """Instances worth holding: the fewest that keep rollout at pace with training, and no more
        than the objective allows; None: no cap."""
        if not self.cfg.enabled:
            return None
        if self._short_lived:
            return 0
        limit = self.value.cap()
        if limit is None or self._cap is None:
            return self._cap if limit is None else limit
        return min(self._cap, limit)

    def state_dict(self) -> dict:
        # JSON turns int keys into strings; store them as strings so a round trip is exact.
        return {"seed_s": self.seed_s, "cap": self._cap, "last_n": self._last_n,
                "memory": {str(n): seed for n, seed in self.memory.items()},
                "memory_tokens_per_s": {str(n): None if math.isnan(v) else v
                                        for n, v in self.memory_tokens_per_s.items()},
                "outlook": None if self._outlook is None else [self._outlook.tokens_per_sample, self._outlook.train_s],
                "risk": list(self._risk), "worker_tokens_per_s": list(self._rates), "value": self.value.state_dict(),
                "provision_s": None if math.isnan(self.provision_s) else self.provision_s,
                "short_lived": self._short_lived}

    def load_state_dict(self, state: dict) -> None:
        self.memory = {int(n): self._clamp(seed) for n, seed in state.get("memory", {}).items()}
        # checkpoints from before the throughput was kept: any step with n beats the stored window
        kept = state.get("memory_tokens_per_s", {})
        self.memory_tokens_per_s = {n: math.nan if kept.get(str(n)) is None else float(kept[str(n)])
                                    for n in self.memory}
        self._last_n = state.get("last_n")
        self._cap = None if state.get("cap") is None else int(state["cap"])
        outlook = state.get("outlook")  # absent from checkpoints written before the hand-off gate
        self._outlook = None if outlook is None else StepOutlook(float(outlook[0]), float(outlook[1]))
        self._risk = tuple(float(x) for x in state.get("risk", (0.0, 0.0)))
        self._rates = [float(x) for x in state.get("worker_tokens_per_s", (0.0, 0.0))]
        self.value.load_state_dict(state.get("value", {}))
        self.provision_s = math.nan if state.get("provision_s") is None else float(state["provision_s"])
        self._short_lived = int(state.get("short_lived", 0))
        if self.cfg.enabled:  # disabled: T_seed stays what the config says
            self.seed_s = self._clamp(state["seed_s"])


__all__ = ["OffloadConfig", "OffloadController", "StepTimings"]
