"""What a run costs in dollars (`cost.*`), step by step and in total.

The run is charged for its reserved nodes for the whole wall-clock time, and for each preemptible
instance for the seconds it existed, at its type's hourly price. `CostMeter.charge_step` turns one
step's wall time, instance-seconds and generated tokens into `cost/*` metrics and keeps running
totals; `state_dict`/`load_state_dict` carry the totals across a resume. Pure: no clock, the caller
measures the seconds.

Default prices are the RLBoost paper's: an on-demand 8xH100 node at $83.79/h (reserved), a spot
8xH100 at $21.28/h, i.e. $5.32/h for the 2xH100 preemptible instance the paper rents.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

SECONDS_PER_HOUR = 3600.0


@dataclass
class CostConfig:
    """Prices the run is charged at (`cost.*`)."""

    reserved_usd_per_hour: float = 83.79
    """Price of one reserved node per hour: on-demand 8xH100, the RLBoost paper's price."""
    reserved_nodes: int = 1
    """Reserved nodes the run is charged for, for its whole wall-clock time."""
    instance_type: str = "spot-2xH100"
    """The type preemptible instances are charged as when a step reports their seconds as one number."""
    instance_usd_per_hour: dict[str, float] = field(default_factory=lambda: {"spot-2xH100": 5.32})
    """Hourly price per preemptible instance type ($21.28/h per spot 8xH100 = $5.32 per 2xH100)."""

    def validate(self) -> None:
        """Raise ValueError naming the offending field."""
        if not (math.isfinite(self.reserved_usd_per_hour) and self.reserved_usd_per_hour >= 0):
            raise ValueError(f"cost.reserved_usd_per_hour must be >= 0, got {self.reserved_usd_per_hour}")
        if self.reserved_nodes < 0:
            raise ValueError(f"cost.reserved_nodes must be >= 0, got {self.reserved_nodes}")
        for name, price in self.instance_usd_per_hour.items():
            if not (isinstance(price, (int, float)) and math.isfinite(price) and price >= 0):
                raise ValueError(f"cost.instance_usd_per_hour.{name} must be a price >= 0, got {price!r}")
        if self.instance_type not in self.instance_usd_per_hour:
            raise ValueError(f"cost.instance_type={self.instance_type!r} has no price in cost.instance_usd_per_hour "
                             f"(priced: {', '.join(sorted(self.instance_usd_per_hour)) or 'none'})")


    def reserved_usd_per_s(self) -> float:
        """What the reserved nodes cost per second, together."""
        return self.reserved_nodes * self.reserved_usd_per_hour / SECONDS_PER_HOUR

    def instance_usd_per_s(self) -> float:
        """What one preemptible instance of `instance_type` costs per second."""
        return self.instance_usd_per_hour[self.instance_type] / SECONDS_PER_HOUR


class CostMeter:
    """Charges steps and keeps the run's totals: usd, tokens, reserved_usd, preemptible_usd, wall_s,
    and instance_s (instance-seconds by type)."""

    def __init__(self, cfg: CostConfig):
        cfg.validate()
        self.cfg = cfg
        self.usd = 0.0
        self.tokens = 0
        self.reserved_usd = 0.0
        self.preemptible_usd = 0.0
        self.wall_s = 0.0
        self.instance_s: dict[str, float] = {}

    def reserved_only_usd(self, wall_s: float) -> float:
        """What the reserved nodes alone cost for `wall_s` (the price of a colocated run that long)."""
        return self.cfg.reserved_nodes * self.cfg.reserved_usd_per_hour * wall_s / SECONDS_PER_HOUR

    def charge_step(self, wall_s: float, instance_s: dict[str, float] | float, tokens: int) -> dict[str, float]:
        """Charge one step of `wall_s` seconds during which preemptible instances ran `instance_s`
        instance-seconds (by type; a plain number is of cfg.instance_type) and `tokens` were generated.

        Returns cost/usd, cost/reserved_usd, cost/preemptible_usd and cost/tokens_per_usd for this
        step, and cost/total_usd, cost/total_tokens_per_usd for the run so far. A tokens-per-dollar
        figure is 0.0 when its cost is 0 (free prices): there is no finite rate to report.
        """
        by_type = {self.cfg.instance_type: instance_s} if isinstance(instance_s, (int, float)) else dict(instance_s)
        if not (math.isfinite(wall_s) and wall_s >= 0):
            raise ValueError(f"charge_step: wall_s must be >= 0, got {wall_s}")
        if tokens < 0:
            raise ValueError(f"charge_step: tokens must be >= 0, got {tokens}")
        for kind, seconds in by_type.items():
            if kind not in self.cfg.instance_usd_per_hour:
                raise ValueError(f"charge_step: instance type {kind!r} has no price in cost.instance_usd_per_hour "
                                 f"(priced: {', '.join(sorted(self.cfg.instance_usd_per_hour))})")
            if not (math.isfinite(seconds) and seconds >= 0):
                raise ValueError(f"charge_step: instance-seconds of {kind!r} must be >= 0, got {seconds}")

        reserved = self.reserved_only_usd(wall_s)
        preemptible = sum(self.cfg.instance_usd_per_hour[k] * s / SECONDS_PER_HOUR for k, s in by_type.items())
        usd = reserved + preemptible
        self.usd += usd
        self.tokens += int(tokens)
        self.reserved_usd += reserved
        self.preemptible_usd += preemptible
        self.wall_s += wall_s
        for kind, seconds in by_type.items():
            self.instance_s[kind] = self.instance_s.get(kind, 0.0) + seconds
        return {
            "cost/usd": usd,
            "cost/reserved_usd": reserved,
            "cost/preemptible_usd": preemptible,
            "cost/tokens_per_usd": _per_usd(tokens, usd),
            "cost/total_usd": self.usd,
            "cost/total_tokens_per_usd": _per_usd(self.tokens, self.usd),
        }

    def state_dict(self) -> dict:
        """The totals, JSON-serialisable, for a checkpoint."""
        return {
            "usd": self.usd,
            "tokens": self.tokens,
            "reserved_usd": self.reserved_usd,
            "preemptible_usd": self.preemptible_usd,
            "wall_s": self.wall_s,
            "instance_s": dict(self.instance_s),
        }

    def load_state_dict(self, state: dict) -> None:
        """Restore totals saved by `state_dict`, so a resumed run keeps counting from them."""
        missing = {"usd", "tokens", "reserved_usd", "preemptible_usd", "wall_s", "instance_s"} - set(state)
        if missing:
            raise ValueError(f"cost meter state lacks {', '.join(sorted(missing))}")
        self.usd = float(state["usd"])
        self.tokens = int(state["tokens"])
        self.reserved_usd = float(state["reserved_usd"])
        self.preemptible_usd = float(state["preemptible_usd"])
        self.wall_s = float(state["wall_s"])
        self.instance_s = {str(k): float(v) for k, v in state["instance_s"].items()}


def _per_usd(tokens: int, usd: float) -> float:
    return tokens / usd if usd > 0 else 0.0
