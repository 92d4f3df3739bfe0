"""Weight pulls: which version each worker must serve, and the pulls that get it there
(docs/elastic.md, "Weights: published once, pulled, verified"; invariant 5 of docs/hybrid.md,
"Invariants and the tests that check them").

Contract: `publish(manifest)` makes a version the one to serve; `start(handle)` starts a pull of it on a
worker that does not hold it (one pull per worker at a time); `poll(handles, now)` collects finished
pulls and returns what they mean: a worker now `ready` at the current version, or one to declare
`dead` (it died during the pull, failed it more than `retries` times, hung past the timeout, or serves
weights that fail the store's checksum); `settle(table, now)` polls and tells the worker table. A failed pull is retried by the next `start`. A worker joins
the dispatch only once it reports exactly the current version with the store's checksum: a torn or
foreign version is never served. `refusal(handle)` says why a new worker cannot be admitted at all.
Runs in the thread that owns the manager's state; the Ray calls are non-blocking.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from rlboost.run_log import event
from rlboost.hybrid.handles import PREEMPTIBLE, Call, WorkerHandle, WorkerState, first_line
from rlboost.cluster.manifest import PullResult, WeightManifest

if TYPE_CHECKING:
    from rlboost.hybrid.worker_table import WorkerTable


@dataclass
class PullStats:
    """What the pulls did since the stats were last taken (weights/* and spot/* metrics)."""

    pulls: list[tuple[str, float, int, str]] = field(default_factory=list)
    """(worker, seconds, bytes fetched, mode) of every verified pull; mode `full`, `patch` (from the version
    it served) or `from_base` (from the base model on its own disk)."""
    provision_s: list[float] = field(default_factory=list)
    """Launch to first verified weights, of every instance that became ready."""
    pull_failures: int = 0
    refused: list[tuple[str, str]] = field(default_factory=list)
    """(worker, why) of workers turned away: another model, or a version that fails its checksum."""


@dataclass
class PullEvent:
    handle: WorkerHandle
    ready: bool
    """True: it now serves the current version; False: declare it dead for `reason`."""
    reason: str = ""
    seconds: float = 0.0
    """How long the pull took (ready events)."""


class PullTracker:
    def __init__(self, timeout_s: float = 120.0, retries: int = 2, call_timeout_s: float = 120.0,
                 stage: bool = False):
        """`stage`: a busy worker keeps generating on the version it serves and swaps the pulled one in
        once idle (`RolloutWorker.pull`; bounded staleness); False: it loads at once, as a step needs."""
        self.timeout_s, self.retries, self.call_timeout_s, self.stage = timeout_s, retries, call_timeout_s, stage
        self.manifest: WeightManifest | None = None
        """The version workers must serve."""
        self.longest_s = 0.0
        """The longest verified pull so far: how long a pulling worker may keep its share of a dispatch."""
        self.stats = PullStats()

    def take_stats(self) -> PullStats:
        stats, self.stats = self.stats, PullStats()
        return stats

    def publish(self, manifest: WeightManifest) -> None:
        self.manifest = manifest

    def refusal(self, h: WorkerHandle) -> str:
        """Why `h` cannot be admitted ("" if it can): it serves another model, or claims the current
        version with other bytes."""
        m = self.manifest
        if m is None:
            return ""
        if h.fingerprint != m.fingerprint:
            return f"serves model {h.fingerprint}, the run's is {m.fingerprint}"
        if h.version == m.version and h.checksum != m.checksum:
            return f"claims version {h.version} with checksum {h.checksum or '-'}, the store's is {m.checksum}"
        return ""

    def start(self, h: WorkerHandle, now: float) -> None:
        """Pull the current version on `h` unless it holds it or a pull is in flight."""
        m = self.manifest
        if m is None or h.pull is not None or not h.alive or h.version == m.version:
            return
        h.pull = Call(h.actor.pull.remote(m, self.timeout_s, self.stage), now, m.version)
        if h.state is WorkerState.SERVING:
            h.state = WorkerState.PULLING

    def pulling_since(self, h: WorkerHandle, version: int) -> float | None:
        """When `h` started pulling `version`, if it is pulling it."""
        return h.pull.sent if h.pull is not None and h.pull.version == version else None

    def poll(self, handles: list[WorkerHandle], now: float) -> list[PullEvent]:
        """Finished pulls, failed ones to retry, and hung ones; starts the next pull where one is due."""
        import ray

        events: list[PullEvent] = []
        if self.manifest is None:
            return events
        calls = {h.pull.ref: h for h in handles if h.alive and h.pull is not None}
        done = ray.wait(list(calls), num_returns=len(calls), timeout=0)[0] if calls else []
        for ref in done:
            h = calls[ref]
            h.pull = None
            try:
                result: PullResult = ray.get(ref)
            except ray.exceptions.RayActorError as e:
                events.append(PullEvent(h, False, f"it died during a weight pull: {first_line(e)}"))
                continue
            except ray.exceptions.RayError as e:
                self.stats.pull_failures += 1
                h.pull_failures += 1
                if h.pull_failures > self.retries:
                    events.append(PullEvent(h, False, f"weight pull failed {h.pull_failures} times: {first_line(e)}"))
                continue
            event = self._verified(h, result, now)
            if event is not None:
                events.append(event)
        dead = {id(e.handle) for e in events if not e.ready}
        for h in handles:
            if not h.alive or id(h) in dead:
                continue
            if h.pull is not None and now - h.pull.sent > self.timeout_s + self.call_timeout_s:
                events.append(PullEvent(h, False, f"no answer to a weight pull in {now - h.pull.sent:.0f}s"))
            elif h.pull is None and h.version != self.manifest.version:
                self.start(h, now)
        return events

    def settle(self, table: WorkerTable, now: float) -> None:
        """Poll the table's live workers' pulls: the ready ones are reported to the table's listener,
        the failed ones declared dead."""
        for e in self.poll(table.alive(), now):
            if e.ready:
                table.ready(e.handle, e.seconds, now)
            else:
                table.declare_dead(e.handle, e.reason, now)

    def _verified(self, h: WorkerHandle, result: PullResult, now: float) -> PullEvent | None:
        m = self.manifest
        if result.version == m.version and result.checksum != m.checksum:
            self.stats.refused.append((h.name, f"version {result.version} with checksum {result.checksum}, the "
                                               f"store's is {m.checksum}"))
            return PullEvent(h, False, "it serves weights that fail the store's checksum")
        h.version, h.checksum, h.pull_failures = result.version, result.checksum, 0
        self.longest_s = max(self.longest_s, result.seconds)
        self.stats.pulls.append((h.name, result.seconds, result.nbytes, result.mode))
        if result.note:
            event("worker %s pulled v%d in full: %s", h.name, result.version, result.note)
        if h.version != m.version:
            return None  # an older version arrived after a newer one was published: the next pull is due
        if h.ready is None:
            h.ready = now
            if h.kind == PREEMPTIBLE:
                self.stats.provision_s.append(now - h.launched)
                event("instance %s joined: weights v%d pulled in %.1f s, serving %.1f s after its launch",
                      h.name, h.version, result.seconds, now - h.launched)
        if h.state in (WorkerState.JOINING, WorkerState.PULLING):
            h.state = WorkerState.SERVING
        return PullEvent(h, True, seconds=result.seconds)


__all__ = ["PullEvent", "PullStats", "PullTracker"]
