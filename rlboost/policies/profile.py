"""Online profile of a worker's decode throughput against its batch size.

Contract: observations (batch size, tokens/s) are smoothed per batch size with an exponential moving
average; the plateau is the smallest observed batch size whose smoothed throughput reaches
`tolerance` times the best smoothed throughput seen at any size. The balancer uses it as B: samples
beyond B on one worker add little throughput there and are better run elsewhere. Pure: no clock.
"""

from __future__ import annotations

import math


class ThroughputProfile:
    """Online profile of one worker's decode throughput against its batch size, to find the batch size
    B where throughput plateaus (adding samples beyond B no longer raises tokens/s much)."""

    def __init__(self, tolerance: float = 0.9, smoothing: float = 0.3):
        if not 0.0 < tolerance <= 1.0:
            raise ValueError(f"tolerance must be in (0, 1], got {tolerance}")
        if not 0.0 < smoothing <= 1.0:
            raise ValueError(f"smoothing must be in (0, 1], got {smoothing}")
        self.tolerance = tolerance
        self.smoothing = smoothing
        self._tokens_per_s_by_batch: dict[int, float] = {}
        self._plateau: int | None = None
        self._plateau_stale = False
        # The manager asks every worker's plateau far more often than a report arrives; a cached value
        # keeps that O(1). Only `observe` changes the curve, so it is the only place that invalidates.

    def observe(self, batch_size: int, tokens_per_s: float) -> None:
        # Idle steps and broken measurements carry no information about the curve.
        if batch_size <= 0 or not math.isfinite(tokens_per_s) or tokens_per_s < 0:
            return
        previous = self._tokens_per_s_by_batch.get(batch_size)
        if previous is None:
            self._tokens_per_s_by_batch[batch_size] = float(tokens_per_s)
        else:
            self._tokens_per_s_by_batch[batch_size] = (
                (1.0 - self.smoothing) * previous + self.smoothing * tokens_per_s)
        self._plateau_stale = True

    def plateau(self) -> int | None:
        if self._plateau_stale:
            self._plateau, self._plateau_stale = self._compute_plateau(), False
        return self._plateau

    def _compute_plateau(self) -> int | None:
        if not self._tokens_per_s_by_batch:
            return None
        best = max(self._tokens_per_s_by_batch.values())
        return min(size for size, value in self._tokens_per_s_by_batch.items()
                   if value >= self.tolerance * best)

    def best(self) -> float | None:
        """The highest smoothed tokens/s seen at any batch size."""
        return max(self._tokens_per_s_by_batch.values(), default=None)

    def throughput(self, batch_size: int) -> float | None:
        return self._tokens_per_s_by_batch.get(batch_size)
