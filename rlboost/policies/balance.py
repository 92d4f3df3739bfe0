"""Continuous load balancing across rollout workers (paper Algorithm 2, balancing half).

Contract: from the current loads, return the moves to make now. Pure and deterministic; inputs are
never mutated. Decisions are computed on running copies of the counts, so after the manager applies
them (a moved pending sample fills a free slot on the target, else joins its pending queue; executing
samples continue from their last token) a second call with the updated loads returns no moves.
`may_move` is a cheap necessary condition for any move: False only where `rebalance` returns none.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from rlboost.policies.dispatch import WorkerLoad


@dataclass(frozen=True)
class Move:
    source: str
    target: str
    count: int
    executing: bool   # False: pending (not started) samples; True: executing samples (they continue from their last token)


class _Busiest:
    """The name with the highest count (the lowest name on ties) among `names`, as `counts` changes.

    A scan per question made the balancer O(workers²); this lazy heap answers in O(log workers).
    An entry is stale once its name's count differs from it; `changed` pushes the fresh one."""

    def __init__(self, counts: dict[str, int], names: Iterable[str]):
        self.counts = counts
        self._heap = [(-counts[n], n) for n in names]
        heapq.heapify(self._heap)

    def changed(self, name: str) -> None:
        heapq.heappush(self._heap, (-self.counts[name], name))

    def top(self, exclude: str | None = None) -> str | None:
        heap, counts, held = self._heap, self.counts, []
        while heap:
            count, name = heap[0]
            if -count != counts[name]:
                heapq.heappop(heap)
            elif name == exclude:
                held.append(heapq.heappop(heap))
            else:
                break
        best = heap[0][1] if heap else None
        for entry in held:
            heapq.heappush(heap, entry)
        return best


def samples_to_move(so_far: dict[str, int], flagged: list[str]) -> list[str]:
    """The order in which a move takes a worker's samples (uid -> tokens so far): those with the fewest
    tokens first (the least to re-prefill), except `flagged` ones (far past their history: where they
    are, they would be the step's tail), which go first, in their order."""
    first = set(flagged)
    return list(flagged) + sorted((uid for uid in so_far if uid not in first), key=lambda uid: (so_far[uid], uid))


class Balancer:
    """Continuous load balancing (paper Algorithm 2)."""

    def __init__(self, default_plateau: int | None = None):
        # default_plateau: B for a worker with no profile yet; None keeps executing samples on it.
        if default_plateau is not None and default_plateau < 0:
            raise ValueError(f"default_plateau must be >= 0, got {default_plateau}")
        self.default_plateau = default_plateau

    def plateau_of(self, name: str, plateaus: Mapping[str, int | None]) -> int | None:
        plateau = plateaus.get(name)
        return self.default_plateau if plateau is None else plateau

    @staticmethod
    def could_move(loads: Iterable[WorkerLoad]) -> bool:
        """False only when no move is possible whatever the plateaus, in O(workers) and without them:
        phase 1 needs a pending sample somewhere, phase 2 an idle worker. Reads only `running` and
        `pending`, so the manager can ask before building the loads."""
        return any(load.pending or not load.running for load in loads)

    def may_move(self, loads: Sequence[WorkerLoad], plateaus: Mapping[str, int | None]) -> bool:
        """False only when `rebalance` is certain to return no move, in O(workers): lets a caller that
        asks after every event skip the full computation."""
        if len({load.name for load in loads}) != len(loads):
            return True  # duplicate names: rebalance keeps the last of each; not worth modelling here
        most_pending = max((load.pending for load in loads), default=0)
        has_empty_queue = has_empty_queue_and_slot = has_idle = has_over_plateau = False
        for load in loads:
            if load.pending:
                continue
            has_empty_queue = True
            has_empty_queue_and_slot = has_empty_queue_and_slot or load.running < load.max_running
            has_idle = has_idle or load.running == 0
            plateau = self.plateau_of(load.name, plateaus)
            has_over_plateau = has_over_plateau or (plateau is not None and load.running > plateau)
        # Phase 1 moves a sample from the worker with the most pending onto one with none; the source
        # keeps at least one unless the target has a free slot.
        if has_empty_queue and (most_pending >= 2 or (most_pending == 1 and has_empty_queue_and_slot)):
            return True
        # Without a phase-1 move the loads reach phase 2 as given: it needs an idle worker and a donor
        # (no pending) running beyond its plateau.
        return has_idle and has_over_plateau

    def rebalance(self, loads: Sequence[WorkerLoad], plateaus: Mapping[str, int | None]) -> list[Move]:
        running = {load.name: load.running for load in loads}
        pending = {load.name: load.pending for load in loads}
        capacity = {load.name: load.max_running for load in loads}
        moved: dict[tuple[str, str, bool], int] = {}  # insertion order = decision order
        if running:
            self._give_pending(running, pending, capacity, moved)
            self._split_executing(running, pending, capacity, plateaus, moved)
        return [Move(source, target, count, executing)
                for (source, target, executing), count in moved.items()]

    @staticmethod
    def _give_pending(running: dict[str, int], pending: dict[str, int], capacity: dict[str, int],
                      moved: dict[tuple[str, str, bool], int]) -> None:
        """1. Give each worker without pending work one pending sample, one per pass, until stable."""
        most = _Busiest(pending, pending)
        moved_any = True
        while moved_any:
            moved_any = False
            for target in sorted((n for n in running if pending[n] == 0), key=lambda n: (running[n], n)):
                source = most.top()
                if pending[source] < 1:
                    break  # nobody has pending work left: no later target of this pass can get any
                has_free_slot = running[target] < capacity[target]
                target_pending_after = 0 if has_free_slot else 1
                # The source must keep at least as much pending as the target gets, or the next call
                # would move the sample straight back.
                if source == target or pending[source] - 1 < target_pending_after:
                    continue
                pending[source] -= 1
                most.changed(source)
                if has_free_slot:
                    running[target] += 1
                else:
                    pending[target] += 1
                    most.changed(target)
                moved[(source, target, False)] = moved.get((source, target, False), 0) + 1
                moved_any = True

    def _split_executing(self, running: dict[str, int], pending: dict[str, int], capacity: dict[str, int],
                         plateaus: Mapping[str, int | None], moved: dict[tuple[str, str, bool], int]) -> None:
        """2. Split executing samples beyond the busiest worker's plateau B onto idle workers."""
        donors = _Busiest(running, [n for n in running if pending[n] == 0])  # pending is fixed from here on
        for idle in sorted(n for n in running if running[n] == 0 and pending[n] == 0):
            busiest = donors.top(exclude=idle)
            if busiest is None:
                continue
            plateau = self.plateau_of(busiest, plateaus)
            if plateau is None:
                continue  # unprofiled and no default: its plateau is unknown, leave it alone
            count = min(max(running[busiest] - plateau, 0), capacity[idle])
            if count > 0:
                running[busiest] -= count
                running[idle] += count
                donors.changed(busiest)
                donors.changed(idle)
                moved[(busiest, idle, True)] = count
