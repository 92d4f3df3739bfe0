"""`spec/*` metrics of a step from the engines' speculation counters (one engine or many workers)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from rlboost.engine.protocol import SpecStats


def merged(stats: Iterable[SpecStats]) -> SpecStats:
    """The counters of several engines added up."""
    total = SpecStats()
    for s in stats:
        for f in dataclasses.fields(SpecStats):
            setattr(total, f.name, getattr(total, f.name) + getattr(s, f.name))
    return total


def spec_metrics(stats: SpecStats, history_prompts: int) -> dict[str, float]:
    metrics = {"spec/verify_steps": float(stats.verify_steps),
               "spec/step_fraction": stats.verify_steps / stats.decode_steps if stats.decode_steps else 0.0,
               "spec/acceptance_rate": stats.accepted / stats.drafted if stats.drafted else 0.0,
               "spec/accepted_tokens_per_step": stats.accepted / stats.verifications if stats.verifications else 0.0,
               "spec/history_prompts": float(history_prompts),
               "spec/sibling_tokens": float(stats.sibling_tokens)}
    if stats.verify_s > 0:
        # plain decoding's measured time for the same tokens over the time the verification steps took
        metrics["spec/speedup"] = stats.plain_equivalent_s / stats.verify_s
    return metrics
