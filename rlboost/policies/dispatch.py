"""Join-shortest-queue dispatch of samples to rollout workers (paper Algorithm 2, assignment half).

Contract: given the workers that may take work now and their loads, decide which worker each sample goes
to. Pure and deterministic: no clock, no randomness, inputs are never mutated. A worker takes a sample
while it has a free slot (running < max_running), or else, if it queues (`queue`), while its pending
count is below the cap Theta; samples that fit nowhere are left out of the result and keep waiting in the manager.
Workers about to take work (`incoming`: pulling the step's weights, seconds from serving) count in
the decision as the empty workers they will be; the samples that fall to them are left out too, so
the ready workers do not take the incoming ones' share of the step and leave them idle.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class WorkerLoad:
    """What the manager knows about one rollout worker that may take work now."""
    name: str
    running: int        # samples executing on it (holding a KV-cache slot)
    pending: int        # samples assigned to it but queued behind its running ones
    max_running: int    # its batch capacity (engine.max_num_seqs), or the slots it may use of it
    queue: bool = True  # it may take samples beyond its slots, queued behind the running ones (up to Theta)


def _occupancy(running: int, max_running: int) -> float:
    # A worker without slots counts as full rather than dividing by zero.
    return running / max_running if max_running > 0 else 1.0


class JSQDispatcher:
    """Join-shortest-queue with a cap Θ (max_pending) of pending samples per worker."""

    def __init__(self, max_pending: int):
        if max_pending < 0:
            raise ValueError(f"max_pending must be >= 0, got {max_pending}")
        self.max_pending = max_pending

    def assign(self, sample_ids: Sequence[str], loads: Sequence[WorkerLoad],
               incoming: Sequence[WorkerLoad] = ()) -> dict[str, str]:
        """Map sample id -> worker name, in the order given (see the module docstring for the rule);
        samples that fall to an `incoming` worker are left out."""
        # Mutable copies [running, pending] so the queues grow as samples are assigned.
        counts = {load.name: [load.running, load.pending] for load in (*loads, *incoming)}
        capacity = {load.name: load.max_running for load in (*loads, *incoming)}
        queues = {load.name: load.queue for load in (*loads, *incoming)}
        held = {load.name for load in incoming}
        if len(counts) != len(loads) + len(incoming):
            raise ValueError("worker names must be unique across loads and incoming")
        assignment: dict[str, str] = {}
        for sample_id in sample_ids:
            open_workers = [name for name, (running, pending) in counts.items()
                            if running < capacity[name] or (queues[name] and pending < self.max_pending)]
            if not open_workers:
                break  # every later sample would find the same full workers
            chosen = min(open_workers, key=lambda name: (
                counts[name][1], _occupancy(counts[name][0], capacity[name]), name))
            if counts[chosen][0] < capacity[chosen]:
                counts[chosen][0] += 1
            else:
                counts[chosen][1] += 1
            assignment[sample_id] = chosen
        return {sample_id: name for sample_id, name in assignment.items() if name not in held}
