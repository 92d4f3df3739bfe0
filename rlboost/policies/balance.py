"""Continuous load balancing across rollout workers (paper Algorithm 2, balancing half).

Contract: from the current loads, return the moves to make now. Pure and deterministic; inputs are
never mutated. Decisions are computed on running copies of the counts, so after the manager applies
them (a moved pending sample fills a free slot on the target, else joins its pending queue; executing
samples continue from their last token) a second call with the updated loads returns no moves.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from rlboost.policies.dispatch import WorkerLoad


@dataclass(frozen=True)
class Move:
    source: str
    target: str
    count: int
    executing: bool   # False: pending (not started) samples; True: executing samples (they continue from their last token)


class Balancer:
    """Continuous load balancing (paper Algorithm 2)."""

    def __init__(self, default_plateau: int | None = None):
        # default_plateau: B for a worker with no profile yet; None keeps executing samples on it.
        if default_plateau is not None and default_plateau < 0:
            raise ValueError(f"default_plateau must be >= 0, got {default_plateau}")
        self.default_plateau = default_plateau

    def rebalance(self, loads: Sequence[WorkerLoad], plateaus: Mapping[str, int | None]) -> list[Move]:
        running = {load.name: load.running for load in loads}
        pending = {load.name: load.pending for load in loads}
        capacity = {load.name: load.max_running for load in loads}
        moved: dict[tuple[str, str, bool], int] = {}  # insertion order = decision order

        # 1. Give each worker without pending work one pending sample, one per pass, until stable.
        moved_any = True
        while moved_any:
            moved_any = False
            for target in sorted((n for n in running if pending[n] == 0), key=lambda n: (running[n], n)):
                source = min(running, key=lambda n: (-pending[n], n))
                has_free_slot = running[target] < capacity[target]
                target_pending_after = 0 if has_free_slot else 1
                # The source must keep at least as much pending as the target gets, or the next call
                # would move the sample straight back.
                if source == target or pending[source] - 1 < target_pending_after:
                    continue
                pending[source] -= 1
                if has_free_slot:
                    running[target] += 1
                else:
                    pending[target] += 1
                moved[(source, target, False)] = moved.get((source, target, False), 0) + 1
                moved_any = True

        # 2. Split executing samples beyond the busiest worker's plateau B onto idle workers.
        for idle in sorted(n for n in running if running[n] == 0 and pending[n] == 0):
            donors = [n for n in running if n != idle and pending[n] == 0]
            if not donors:
                continue
            busiest = min(donors, key=lambda n: (-running[n], n))
            plateau = plateaus.get(busiest)
            if plateau is None:
                plateau = self.default_plateau
            if plateau is None:
                continue  # unprofiled and no default: its plateau is unknown, leave it alone
            count = min(max(running[busiest] - plateau, 0), capacity[idle])
            if count > 0:
                running[busiest] -= count
                running[idle] += count
                moved[(busiest, idle, True)] = count

        return [Move(source, target, count, executing)
                for (source, target, executing), count in moved.items()]
