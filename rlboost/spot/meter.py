"""What a cloud bills for preemptible instances: how many were held over time, and the instance-seconds
(booting and pulling included). One meter for the runtime's fleet (`rlboost.hybrid.fleet`, on the
monotonic clock) and the simulator (`rlboost.sim.spot_instances`, on simulated time).

Contract: `count(delta, now)` is called as instances start (+) and end (-), at times that never go
back (ValueError otherwise: a book kept out of order bills the wrong seconds); `seconds(now)` is the
instance-seconds held from the meter's start to `now`, so a window's bill is the difference of two
readings. Pure: the caller owns the clock (and, from several threads, the lock).
"""

from __future__ import annotations


class InstanceMeter:
    """Instances alive over time and the instance-seconds they were held."""

    def __init__(self, start: float = 0.0):
        """`start`: the time the meter starts from (0 for simulated time; a monotonic reading for the
        runtime's)."""
        self.timeline: list[tuple[float, int]] = [(start, 0)]
        """(time, instances alive from then on), one entry per change."""
        self.live = 0
        self._seconds = 0.0
        self._since = start

    def seconds(self, now: float) -> float:
        """Instance-seconds held from the start to `now`."""
        return self._seconds + self.live * (now - self._since)

    def count(self, delta: int, now: float) -> None:
        """`delta` instances started (+) or ended (-) at `now`."""
        if now < self._since:
            raise ValueError(f"instance count changed at {now}, before the last change at {self._since}")
        if self.live + delta < 0:
            raise ValueError(f"{-delta} instances ended at {now} while {self.live} were alive")
        self._seconds = self.seconds(now)
        self._since = now
        self.live += delta
        if self.timeline[-1][0] == now:
            self.timeline[-1] = (now, self.live)
        else:
            self.timeline.append((now, self.live))


__all__ = ["InstanceMeter"]
