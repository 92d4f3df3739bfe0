"""Reading the workers' report streams: every report taken the moment it arrives, handed over in batches.

`ReportReader` runs in the report relay's process (`rlboost.hybrid.report_relay`), which owns the
streams; the manager's loop takes what it took once a turn. `TurnPacer` paces the manager's turns.

Contract:
- Each worker's stream runs at most `max_unacked_reports` reports ahead of its reader (Ray's
  streaming-generator backpressure, set where the stream starts: `ReportRelay.watch`). Ray
  counts a report acknowledged once the reader has taken its reference off the stream, and the
  worker's `yield` blocks while that many are unacknowledged; a taken reference's report already
  sits in the reader's process (a report is small enough for Ray to carry it inline). So a kill
  loses at most those reports and the tokens generated since the last one: (max_unacked_reports + 1)
  x stream_interval per request (invariant 4).
- `ReportReader` takes the reports on a thread of its own while `run()` is on (the step's): while
  reports keep coming it polls every stream by a cheap peek each, 10 to 50 ms apart (`ACK_S`,
  `ACK_MAX_S`: paced to `POLL_SHARE` of the time), and takes what each holds; a poll that finds nothing
  waits on all of them at once until one has a report. So a report is acknowledged within about 50 ms
  of its arrival, and the reader's cost is a paced poll, not a wait over every stream per report; an acknowledgement paced by the loop's turns (20-200 ms) would idle the
  workers instead.
- `receive(timeout)` (the relay's `take`) returns what was taken since its last call, in each
  stream's order: (handle, report, None) per report, or (handle, None, why) once a stream ended or
  failed (the worker is gone; the stream is closed). It blocks up to `timeout` only when nothing at
  all was taken, and comes back at most once per `turn_s`: a loop that comes back faster handles the
  reports of that time together instead of paying a turn per report. `TurnPacer` sets that gap.
- `drain(handle)` returns what one stream holds now, at once, taken and not yet handled included:
  what a worker sent before a death the manager found by other means (a failed call, the node table,
  a fence), read before the death is declared.
- Fenced workers' streams are read too, so what they still send can be counted and dropped.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from rlboost.hybrid.handles import WorkerHandle, first_line
from rlboost.hybrid.wire import WorkerReport

TURN_S = 0.02
"""Shortest time between two turns while reports keep coming: reports that arrive within a turn are
handled together, at most 20 ms after they arrive (less than the stream_interval decode steps a
report covers: about 60 ms for 8 steps of the emulated Qwen3-8B on an H100). What the manager decides
from a report is unchanged, only when it does."""
MAX_TURN_S = 0.2
"""Longest gap the pacer sets: a decision (a freed slot's next sample, a hand-off) waits at most this."""
ACK_S = 0.01
"""Shortest gap between two polls of the streams while reports keep coming."""
ACK_MAX_S = 0.05
"""Longest: a report waits at most about this long to be acknowledged, inside the gap to a worker's next
report (stream_interval decode steps: 60 ms and more on an H100), so with max_unacked_reports >= 2 no
worker waits on the reader; what came meanwhile is taken in one poll."""
POLL_SHARE = 0.02
"""The reader spaces its polls so that they take about this share of the time (`TurnPacer`): a poll
peeks every stream (about 4 us each), so it costs O(workers), and with many workers polls come further
apart and take more reports each."""
WATCH_S = 0.05
"""The reader looks for new streams (a worker that joined) at least this often: a joiner's stream waits
at most this long for its first acknowledgement."""

Received = tuple[WorkerHandle, WorkerReport | None, str | None]


class TurnPacer:
    """The gap before the next turn: long enough that the loop's own CPU stays within `share` of the
    time (a turn that used c CPU seconds is followed by c (1 - share) / share of waiting, smoothed over
    turns), never below `min_s` nor above `max_s`. Many workers make every turn dearer: their turns
    then come further apart and handle more reports each, so the manager's cost grows with the
    reports, not with workers x turns."""

    def __init__(self, share: float, min_s: float = TURN_S, max_s: float = MAX_TURN_S, smoothing: float = 0.2):
        if not 0 < share < 1:
            raise ValueError(f"the loop's CPU share must be in (0, 1), got {share}")
        self.share, self.min_s, self.max_s, self.smoothing = share, min_s, max_s, smoothing
        self.turn_cpu_s = 0.0

    def gap(self, turn_cpu_s: float) -> float:
        self.turn_cpu_s += self.smoothing * (turn_cpu_s - self.turn_cpu_s)
        return min(self.max_s, max(self.min_s, self.turn_cpu_s * (1 - self.share) / self.share))


@dataclass
class ReaderCounts:
    """What the reader thread did since it was made: the work it pays per report (read by tests and
    benchmarks; plain counters, written by the reader thread only)."""

    polls: int = 0
    """Peeks over every stream (`_take` by a poll, not by a wait)."""
    empty_polls: int = 0
    """Polls that found nothing ready: only these are followed by a wait."""
    waits: int = 0
    """`ray.wait` calls over every stream."""


class ReportReader:
    """`handles()`: the workers whose streams to read (the table's, fenced ones included)."""

    def __init__(self, handles: Callable[[], list[WorkerHandle]], turn_s: float = TURN_S):
        self.handles, self.turn_s = handles, turn_s
        self._last_turn = 0.0
        self._taken: list[tuple[WorkerHandle, object | None, str | None]] = []
        """(handle, a report's reference, None) or (handle, None, why its stream closed), in order."""
        self._lock = threading.Condition()
        """Guards `_taken` and every `next()` on a stream: the reader thread and `drain` both take."""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._failure: BaseException | None = None
        self._cpu_s = 0.0
        self._poll_pacer = TurnPacer(POLL_SHARE, min_s=ACK_S, max_s=ACK_MAX_S)
        self.counts = ReaderCounts()

    # ---- the reader thread ---------------------------------------------------------------------------

    def run(self) -> None:
        """Start taking reports as they arrive (a step begins; a failure of the last step's reader is
        that step's, already raised by its `receive`)."""
        self._stop.clear()
        self._failure = None
        self._thread = threading.Thread(target=self._read, name="report-reader", daemon=True)
        self._thread.start()

    @property
    def running(self) -> bool:
        return self._thread is not None

    def pause(self) -> float:
        """Stop taking reports (the step ended); what was taken stays for the next step's turns.
        Between steps the workers are idle: each stream fills up to its limit and waits. Returns the
        CPU seconds the reader thread used since `run()`: the manager's, beside its loop's."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        return self._cpu_s

    def _read(self) -> None:
        """Poll every stream by a peek (a few microseconds each, no wait), take what is ready, and poll
        again `ACK_S` to `ACK_MAX_S` later while reports keep coming (`POLL_SHARE`); only a poll that found nothing waits, in one
        `ray.wait` over the streams. A wait over N streams costs the reader about 80 + 1.5 N
        microseconds (155 at 64 streams, 470 at 256, Ray 2.60), and waking on every report paid two or
        three of them per report: at 64 instances two thirds of the manager's CPU."""
        import ray

        cpu0 = time.thread_time()
        try:
            while not self._stop.is_set():
                handles = [h for h in self.handles() if h.stream is not None]
                if not handles:
                    self._stop.wait(WATCH_S)
                    continue
                poll_cpu = time.thread_time()
                with self._lock:
                    took = self._take(handles)
                    if took:
                        self._lock.notify_all()
                self.counts.polls += 1
                self.counts.empty_polls += not took
                if took:  # what arrives meanwhile is taken by the next poll, together
                    self._stop.wait(self._poll_pacer.gap(time.thread_time() - poll_cpu))
                    continue
                self.counts.waits += 1
                by_stream = {h.stream: h for h in handles}
                ready = ray.wait(list(by_stream), num_returns=1, timeout=WATCH_S)[0]
                if ready:
                    with self._lock:
                        self._take([by_stream[gen] for gen in ready], woken=True)
                        self._lock.notify_all()
        except BaseException as e:  # noqa: BLE001 - re-raised in the loop thread by `receive`
            with self._lock:
                self._failure = e
                self._lock.notify_all()
        finally:
            self._cpu_s = time.thread_time() - cpu0

    def _take(self, handles: list[WorkerHandle], woken: bool = False) -> int:
        """Every reference the streams of `handles` hold now, in each stream's order; how many items were
        taken. `woken`: `ray.wait` found these streams ready (an ended stream's end counts), so each is
        read once whatever its peek says. Called with the lock held."""
        import ray

        took = 0
        for h in handles:
            first = woken
            while h.stream is not None and (first or _has_next(h.stream)):
                first = False
                took += 1
                try:
                    self._taken.append((h, next(h.stream), None))  # acknowledged: the worker may run ahead again
                except StopIteration:
                    h.stream = None
                    self._taken.append((h, None, "its stream ended"))
                except ray.exceptions.RayError as e:
                    h.stream = None
                    self._taken.append((h, None, f"it died: {first_line(e)}"))
        return took

    # ---- the step's loop thread ----------------------------------------------------------------------

    def receive(self, timeout: float) -> list[Received]:
        self._last_turn = next_turn(self._last_turn, self.turn_s)
        with self._lock:
            if not self._taken and self._failure is None:
                self._lock.wait(timeout)
            if self._failure is not None:
                raise RuntimeError(f"the report reader failed: {first_line(self._failure)}") from self._failure
            taken, self._taken = self._taken, []
        return _fetch(taken)

    def drain(self, h: WorkerHandle) -> list[Received]:
        """Everything `h`'s stream holds now and everything taken of it, in order, without waiting."""
        with self._lock:
            self._take([h])
            mine = [item for item in self._taken if item[0] is h]
            self._taken = [item for item in self._taken if item[0] is not h]
        return _fetch(mine)


def next_turn(last: float, turn_s: float) -> float:
    """Sleep until `turn_s` after `last` (the previous turn's start, monotonic) and return this turn's
    start: a reader comes back at most once per `turn_s`, however fast its caller asks."""
    time.sleep(max(0.0, last + turn_s - time.monotonic()))
    return time.monotonic()


def _has_next(gen) -> bool:
    """Whether `gen` (a Ray streaming generator) has its next item, or its end, to take now: a local
    look at the owner's stream table, no wait. Ray's private calls, under the public one where they are
    gone (a wait of zero over this stream)."""
    try:
        core_worker = gen.worker.core_worker
        ref = gen._generator_ref
    except AttributeError:
        import ray

        return bool(ray.wait([gen], num_returns=1, timeout=0)[0])
    return core_worker.peek_object_ref_stream(ref)[1] or core_worker.is_object_ref_stream_finished(ref)


def _fetch(taken: list[tuple[WorkerHandle, object | None, str | None]]) -> list[Received]:
    """The reports behind taken references, fetched in one call (one by one only when one failed, to
    tell whose), with the closed streams' reasons in their place."""
    import ray

    refs = [ref for _, ref, _ in taken if ref is not None]
    try:
        reports = iter(ray.get(refs)) if refs else iter(())
    except ray.exceptions.RayError:
        reports = None
    out: list[Received] = []
    for h, ref, why in taken:
        if ref is None:
            out.append((h, None, why))
        elif reports is not None:
            out.append((h, next(reports), None))
        else:
            try:
                out.append((h, ray.get(ref), None))
            except ray.exceptions.RayError as e:  # a report left on a node that died with its worker
                h.stream = None
                out.append((h, None, f"it died: {first_line(e)}"))
    return out


__all__ = ["ACK_MAX_S", "ACK_S", "POLL_SHARE", "MAX_TURN_S", "TURN_S", "WATCH_S", "ReaderCounts", "ReportReader",
           "TurnPacer", "next_turn"]
