"""Reading the workers' report streams, in batches.

Contract: `ReportReader.receive(handles, timeout)` returns what the open streams of `handles` hold now,
in the order each stream produced it: (handle, report, None) per report, or (handle, None, why) when a
stream ended or failed (the worker is gone; the stream is closed). It blocks up to `timeout` only when
nothing at all is ready. Fenced workers' streams are read too, so what they still send can be counted
and dropped. Every turn costs one wait over all streams and one fetch per round of reports, O(workers):
turns are at least `turn_s` apart, so a loop that comes back faster handles the reports of that time
together instead of paying a turn per report. `TurnPacer` sets that gap from what the turns cost.
`drain(handle)` returns what one stream holds now, at once: what a worker sent before a death the
manager found by other means (a failed call, the node table, a fence), read before the death is declared.
"""

from __future__ import annotations

import time

from rlboost.hybrid.handles import WorkerHandle, first_line
from rlboost.hybrid.wire import WorkerReport

TURN_S = 0.02
"""Shortest time between two turns while reports keep coming: reports that arrive within a turn are
handled together, at most 20 ms after they arrive (less than the stream_interval decode steps a
report covers: about 60 ms for 8 steps of the emulated Qwen3-8B on an H100). What the manager decides
from a report is unchanged, only when it does."""
MAX_TURN_S = 0.2
"""Longest gap the pacer sets: a decision (a freed slot's next sample, a hand-off) waits at most this."""


class TurnPacer:
    """The gap before the next turn: long enough that the loop's own CPU stays within `share` of the
    time (a turn that used c CPU seconds is followed by c (1 - share) / share of waiting, smoothed over
    turns), never below `min_s` nor above `max_s`. Many workers make every turn dearer (each waits on
    every stream): their turns then come further apart and handle more reports each, so the manager's
    cost grows with the reports, not with workers x turns."""

    def __init__(self, share: float, min_s: float = TURN_S, max_s: float = MAX_TURN_S, smoothing: float = 0.2):
        if not 0 < share < 1:
            raise ValueError(f"the loop's CPU share must be in (0, 1), got {share}")
        self.share, self.min_s, self.max_s, self.smoothing = share, min_s, max_s, smoothing
        self.turn_cpu_s = 0.0

    def gap(self, turn_cpu_s: float) -> float:
        self.turn_cpu_s += self.smoothing * (turn_cpu_s - self.turn_cpu_s)
        return min(self.max_s, max(self.min_s, self.turn_cpu_s * (1 - self.share) / self.share))


class ReportReader:
    def __init__(self, turn_s: float = TURN_S):
        self.turn_s = turn_s
        self._last_turn = 0.0

    def receive(self, handles: list[WorkerHandle], timeout: float
                ) -> list[tuple[WorkerHandle, WorkerReport | None, str | None]]:
        import ray

        streams = {h.stream: h for h in handles if h.stream is not None}
        if not streams:
            time.sleep(timeout)
            return []
        time.sleep(max(0.0, self._last_turn + self.turn_s - time.monotonic()))
        self._last_turn = time.monotonic()
        waitable = list(streams)
        # Whatever is there already, in one call; block (until the first report) only when nothing is.
        ready, _ = ray.wait(waitable, num_returns=len(waitable), timeout=0)
        if not ready:
            ready, _ = ray.wait(waitable, num_returns=1, timeout=timeout)
        # Drain what is ready, in rounds of one report per stream: a round costs one wait and one fetch
        # for all of them. Nothing may stay behind: a death declared by other means drops whatever of
        # its stream is still unread.
        out: list[tuple[WorkerHandle, WorkerReport | None, str | None]] = []
        handles_ready = [streams[gen] for gen in ready]
        while handles_ready:
            self._one_round(handles_ready, out)
            open_ = [h for h in handles_ready if h.stream is not None]
            again = ray.wait([h.stream for h in open_], num_returns=len(open_), timeout=0)[0] if open_ else []
            handles_ready = [streams[gen] for gen in again]
        return out

    def drain(self, h: WorkerHandle) -> list[tuple[WorkerHandle, WorkerReport | None, str | None]]:
        """Everything `h`'s stream holds now, in order, without waiting for a turn or a report."""
        import ray

        out: list[tuple[WorkerHandle, WorkerReport | None, str | None]] = []
        while h.stream is not None and ray.wait([h.stream], num_returns=1, timeout=0)[0]:
            self._one_round([h], out)
        return out

    @staticmethod
    def _one_round(handles: list[WorkerHandle], out: list) -> None:
        """The next report of each of `handles`, whose streams have one ready, fetched in one call."""
        import ray

        taken = []
        for h in handles:
            try:
                taken.append((h, next(h.stream)))
            except StopIteration:
                h.stream = None
                out.append((h, None, "its stream ended"))
            except ray.exceptions.RayError as e:
                h.stream = None
                out.append((h, None, f"it died: {first_line(e)}"))
        if not taken:
            return
        try:
            reports = ray.get([ref for _, ref in taken])
        except ray.exceptions.RayError:
            reports = None  # a stream carries its worker's death: fetch one by one to tell whose
        for i, (h, ref) in enumerate(taken):
            if reports is not None:
                out.append((h, reports[i], None))
                continue
            try:
                out.append((h, ray.get(ref), None))
            except ray.exceptions.RayError as e:
                h.stream = None
                out.append((h, None, f"it died: {first_line(e)}"))


__all__ = ["MAX_TURN_S", "TURN_S", "ReportReader", "TurnPacer"]
