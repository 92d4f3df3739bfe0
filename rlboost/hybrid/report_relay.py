"""The report relay: the workers' report streams read in a process of their own, handed to the manager in batches.

Contract:
- `ReportRelay` is a Ray actor on the manager's node (no CPU reserved). It owns every worker's report
  stream (`watch` starts it, with Ray's backpressure at `max_unacked_reports`) and reads them all with a
  `ReportReader` (`rlboost.hybrid.streams`): every report is taken, so acknowledged, the moment it
  arrives, and fetched there. What Ray charges per report, 95-220 us to take an item off a stream
  under backpressure and the fetch of each report as an object of its own (docs/simulator.md, "The
  manager's overhead"), is the relay's process's, not the manager's.
- `take(timeout)` returns what was taken since the last call, each stream's in its order: (name, report,
  None) per report, or (name, None, why) once a stream ended or failed. It waits up to `timeout` only
  when nothing was taken. The manager calls it once a turn: one actor call and one list to unpickle a
  turn, whatever the number of workers and reports.
- `drain(name)` returns at once what one stream holds now and what was taken of it: what a worker sent
  before a death the manager found by other means.
- `hold(name)` stops reading one stream until `resume(name)`, as a reader fallen behind on it would (its
  reports wait in Ray, as many as backpressure lets it send): a test's fault. It returns once a round of
  the reader has started without it.
- `run()` / `pause()` bracket a step, as the reader's do; `pause()` returns the relay process's CPU
  seconds since `run()` (its reader, its calls and Ray's own threads): what relaying cost, beside the
  manager's loop.
- Invariant 4 is unchanged: a report is in transit (and lost with its worker) until the relay takes it,
  at most `max_unacked_reports` per worker; once taken it sits in the relay's process on the manager's
  machine, which a worker's death does not reach. A relay that dies fails the step, as the manager's
  death would.

`RelayedReports` is the manager's side: the reader's interface (`run`, `pause`, `receive`, `drain`) over
the relay, with the reports addressed to the table's handles by name. It starts the relay at `start`
(the fleet's, once the cluster is up) or at the first `watch`: a manager built before Ray starts builds
nothing.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from rlboost.hybrid.handles import WorkerHandle, first_line
from rlboost.hybrid.streams import TURN_S, ReportReader, next_turn
from rlboost.hybrid.wire import WorkerReport

CALL_LIMIT_S = 60.0
"""Longest the manager waits for the relay's answer beyond what it asked the relay to wait: a relay that
misses it is stuck, and the step fails naming it."""
BOOT_LIMIT_S = 300.0
"""Longest the first call waits for the relay's process to start (on a machine booting many workers at
once it queues behind some of them)."""
HOLD_ROUND_S = 5.0
"""Longest `hold` waits for the reader's next round (it runs every 50 ms at the longest)."""


@dataclass
class _Stream:
    """One worker's stream, as the relay's reader reads it."""

    name: str
    stream: object | None


class ReportRelay:
    """Wrapped as a Ray actor by `RelayedReports`; usable in-process too (within a Ray driver)."""

    def __init__(self):
        self._streams: dict[str, _Stream] = {}
        self._held: set[str] = set()
        self._rounds = threading.Condition()
        self._round = 0
        self.reader = ReportReader(self._handles, turn_s=0.0)  # the manager's turns pace `take`
        self._cpu0 = time.process_time()

    def _handles(self) -> list[_Stream]:
        with self._rounds:
            self._round += 1
            self._rounds.notify_all()
            return [s for s in self._streams.values() if s.stream is not None and s.name not in self._held]

    def watch(self, name: str, actor, max_unacked_reports: int) -> None:
        """Start reading `actor`'s report stream (its `stream()` method), at most `max_unacked_reports`
        reports ahead of this relay (0: no backpressure)."""
        stream = actor.stream.options(num_returns="streaming",
                                      _generator_backpressure_num_objects=max_unacked_reports or -1).remote()
        with self._rounds:
            self._streams[name] = _Stream(name, stream)

    def run(self) -> None:
        self._cpu0 = time.process_time()
        self.reader.run()

    def pause(self) -> float:
        self.reader.pause()
        return time.process_time() - self._cpu0

    def take(self, timeout: float) -> list[tuple[str, WorkerReport | None, str | None]]:
        return self._handed([(s.name, report, why) for s, report, why in self.reader.receive(timeout)])

    def drain(self, name: str) -> list[tuple[str, WorkerReport | None, str | None]]:
        s = self._streams.get(name)
        return self._handed([(name, report, why) for _, report, why in self.reader.drain(s)] if s else [])

    def hold(self, name: str) -> None:
        with self._rounds:
            self._held.add(name)
            if self.reader.running:
                now = self._round
                self._rounds.wait_for(lambda: self._round > now, timeout=HOLD_ROUND_S)

    def resume(self, name: str) -> None:
        with self._rounds:
            self._held.discard(name)

    def pid(self) -> int:
        return os.getpid()

    def _handed(self, items: list[tuple[str, WorkerReport | None, str | None]]):
        """`items`, about to be handed over: a stream whose end is among them is forgotten (a stream is
        kept until then, so that `drain` finds what was taken of it)."""
        with self._rounds:
            for name, report, _ in items:
                if report is None:
                    self._streams.pop(name, None)
        return items


class RelayedReports:
    """The manager's reader: `ReportReader`'s interface over a `ReportRelay`. `lookup(name)`: the table's
    handle of that name (None: reaped; its last items are dropped)."""

    def __init__(self, lookup: Callable[[str], WorkerHandle | None], turn_s: float = TURN_S):
        self.lookup, self.turn_s = lookup, turn_s
        self._relay = None
        self._lock = threading.Lock()
        """Guards the relay's start and `_running`: workers join from any thread, mid-step too."""
        self._running = False
        self._booted = False
        self._last_turn = 0.0

    def _call(self, method: str, *args, wait_s: float = 0.0):
        import ray

        ref = getattr(self._relay, method).remote(*args)
        try:
            return ray.get(ref, timeout=wait_s + CALL_LIMIT_S)
        except (ray.exceptions.RayError, TimeoutError) as e:
            raise RuntimeError(f"the report relay failed in {method}: {first_line(e)}") from e

    def start(self) -> None:
        """Boot the relay on this machine (the manager's, never an instance's), without waiting: called
        once the cluster is up and before the first worker boots, so that its boot does not queue
        behind theirs (Ray starts a few worker processes at a time)."""
        with self._lock:
            self._start()

    def _start(self) -> None:
        if self._relay is not None:
            return
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        here = ray.get_runtime_context().get_node_id()
        self._relay = ray.remote(ReportRelay).options(
            num_cpus=0, max_concurrency=8,
            scheduling_strategy=NodeAffinitySchedulingStrategy(here, soft=False)).remote()
        self._booted = False
        if self._running:  # started by the step's first worker, mid-step
            self._call("run", wait_s=BOOT_LIMIT_S)

    def watch(self, h: WorkerHandle, max_unacked_reports: int) -> None:
        """Read `h`'s stream from now on (any thread); returns once the relay reads it. Starts the relay
        if `start` did not."""
        with self._lock:
            self._start()
            if not self._booted:
                self._call("pid", wait_s=BOOT_LIMIT_S)
                self._booted = True
        self._call("watch", h.name, h.actor, max_unacked_reports)
        h.streaming = True

    def run(self) -> None:
        """Start taking reports as they arrive (a step begins)."""
        with self._lock:
            self._running = True
            if self._relay is not None:
                self._call("run")

    def pause(self) -> float:
        """Stop taking reports (the step ended): what was taken stays for the next step. Returns the
        relay's CPU seconds since `run()`."""
        with self._lock:
            was, self._running = self._running, False
            return self._call("pause") if was and self._relay is not None else 0.0

    def receive(self, timeout: float) -> list[tuple[WorkerHandle, WorkerReport | None, str | None]]:
        """As `ReportReader.receive`, at most once per `turn_s`: one call to the relay."""
        self._last_turn = next_turn(self._last_turn, self.turn_s)
        if self._relay is None:
            time.sleep(timeout)
            return []
        return self._addressed(self._call("take", timeout, wait_s=timeout))

    def drain(self, h: WorkerHandle) -> list[tuple[WorkerHandle, WorkerReport | None, str | None]]:
        return self._addressed(self._call("drain", h.name)) if self._relay is not None else []

    @contextlib.contextmanager
    def held(self, name: str):
        """Inside: `name`'s stream is not read (from the relay's next round on)."""
        self._call("hold", name, wait_s=HOLD_ROUND_S)
        try:
            yield
        finally:
            self._call("resume", name)

    def close(self) -> None:
        import ray

        relay, self._relay = self._relay, None
        if relay is not None:
            ray.kill(relay, no_restart=True)

    def _addressed(self, items) -> list[tuple[WorkerHandle, WorkerReport | None, str | None]]:
        out = []
        for name, report, why in items:
            h = self.lookup(name)
            if h is None:
                continue  # reaped: nothing of it counts any more
            if report is None:
                h.streaming = False
            out.append((h, report, why))
        return out


__all__ = ["BOOT_LIMIT_S", "CALL_LIMIT_S", "HOLD_ROUND_S", "RelayedReports", "ReportRelay"]
