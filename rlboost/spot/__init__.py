"""Preemptible (spot) instances, without a runtime: availability traces, their replay, and cost.

Pure code (no Ray, no torch, no wall clock, no global randomness), so the real instance provider and a
simulator drive the same objects.
"""

from rlboost.spot.cost import CostConfig, CostMeter
from rlboost.spot.replay_clock import ProgressClock
from rlboost.spot.trace import (
    BUNDLED_TRACE,
    SEGMENTS,
    ReplayActions,
    SpotTrace,
    TraceConfig,
    TraceReplay,
    load_trace,
)

__all__ = [
    "BUNDLED_TRACE",
    "SEGMENTS",
    "CostConfig",
    "CostMeter",
    "ProgressClock",
    "ReplayActions",
    "SpotTrace",
    "TraceConfig",
    "TraceReplay",
    "load_trace",
]
