"""The tokens of a step: streamed chunks, the exact outputs aborts return, and the finishes they bring.
Part of `StepState` (rlboost.rollout.step_state), split where its jobs divide: the workers' events, the
seeding window and the bookkeeping stay there, the placement decisions are `StepPlacement`'s, the tokens
are here. Pure, like the state: no clock, thread, Ray or torch.

`StepTokens` is a base of `StepState` and works on its attributes: `workers`, `ledger`, `tracked`,
`stats`, `now`, `seeding`, `done`, `t0`, `_seed_from`, `_aborts`, `_handoffs`, `_commands`, `_changed`;
it calls the state's `_retire_if_empty`, `_eligible` and `_submit` and reads `pending`.

Every token passes the step's `SampleLedger` checks (invariants 1-3: on-policy or at most k versions
stale, exactly once, exact continuation) before it joins its sample; a fenced worker's are counted and
dropped (invariant 6).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from rlboost.rollout.step_data import GroupDone, Partial, SampleState, Tracked, Worker

if TYPE_CHECKING:
    from rlboost.engine.sequence import ChunkColumns


class StepTokens:
    """The token events of `StepState` (see the module docstring)."""

    def chunk(self, worker: str, request_id: str, offset: int, count: int, version: int, finished: bool,
              now: float, finish_reason: str | None = None, token_ids: Sequence[int] | None = None,
              logprobs: Sequence[float] | None = None) -> None:
        """`count` tokens of `request_id` from `worker`, the first at `offset` of the attempt's response.
        The runtime passes the tokens themselves (`chunks`, a report's at once); the simulator only the count."""
        w = self.workers.get(worker)
        if w is None or not w.alive:
            self.stats.fenced_tokens_dropped += count
            return
        self._chunk_in(w, request_id, offset, count, version, finished, finish_reason, token_ids, logprobs, now)

    def chunks(self, worker: str, chunks: ChunkColumns, now: float) -> None:
        """A report's chunks from `worker`, in the order it sent them: each as `chunk` with its tokens,
        read straight off the report's columns, the worker looked up once. The manager hands over tens
        of thousands of chunks a second at 256 instances (docs/simulator.md, "256 instances")."""
        w = self.workers.get(worker)
        if w is None or not w.alive:
            self.stats.fenced_tokens_dropped += len(chunks.token_ids)
            return
        token_ids, logprobs, end = chunks.token_ids, chunks.logprobs, 0
        for request_id, offset, count, version, finished, reason in zip(
                chunks.request_ids, chunks.offsets, chunks.counts, chunks.versions, chunks.finished,
                chunks.finish_reasons):
            start, end = end, end + count
            self._chunk_in(w, request_id, offset, count, version, finished, reason, token_ids[start:end],
                           logprobs[start:end], now)

    def aborted(self, abort_id: int, partials: Mapping[str, Partial], now: float) -> None:
        """The answer to `Abort(abort_id)`: the exact partial output of each request still running
        there (those absent finished meanwhile; their last chunk is on its way). The samples continue
        from there: back to the dispatcher, or straight onto the rebalance's target."""
        self.now = now
        pa = self._aborts.pop(abort_id, None)
        if pa is None:
            return  # its worker died meanwhile: the samples were requeued then
        self._handoffs.discard(abort_id)
        self._changed()  # even with nothing moved: the balancer may now ask for the same moves again
        w = self.workers[pa.worker]
        if pa.load is not None:  # a refresh: the worker swapped the new version in before answering
            w.version, w.swapping = pa.load, None
            self._changed(members=True)
        moved = []
        for request_id, uid in pa.requests.items():  # in the order taken back, whatever the answer's order
            partial = partials.get(request_id)
            track = self.tracked[uid]
            if partial is None or track.state is not SampleState.RUNNING or track.request_id != request_id:
                continue
            extra = self.ledger.check_partial(track, partial)
            if extra:
                received = track.tokens - track.base
                self._take(track, w, request_id, extra, partial.version,
                           partial.token_ids[received:] if partial.token_ids is not None else None,
                           partial.logprobs[received:] if partial.logprobs is not None else None)
            w.assigned.discard(uid)
            w.holding_changed(self.now)
            self.ledger.requeue(track)
            self.stats.migrated[pa.reason] += 1
            moved.append(uid)
        target = self.workers.get(pa.target) if pa.target is not None else None
        if moved and target is not None and self._eligible(target):
            moved_set = set(moved)
            self.ledger.pending = deque(uid for uid in self.pending if uid not in moved_set)
            self._submit(target, moved)
        self._retire_if_empty(w)

    # ---- internals -----------------------------------------------------------------------------------

    def _chunk_in(self, w: Worker, request_id: str, offset: int, count: int, version: int, finished: bool,
                  reason: str | None, token_ids, logprobs, now: float) -> None:
        """One chunk of a live worker `w`: checked, taken, and its sample finished if it ends there."""
        track = self.ledger.attempt(request_id, w.name)
        if track is None:
            self.stats.stale_chunks += 1  # from an attempt already taken back: its tokens came with the abort
            return
        self.ledger.check_chunk(track, offset, version)
        self.now = now
        self._take(track, w, request_id, count, version, token_ids, logprobs)
        if finished:
            self._finish(track, w, reason)

    def _take(self, track: Tracked, w: Worker, request_id: str, count: int, version: int, token_ids,
              logprobs) -> None:
        """`count` checked tokens of the running attempt `track` join its sample and the counters."""
        self.ledger.accept(track, count, version, token_ids, logprobs)
        w.tokens += count
        stats = self.stats
        stats.tokens_by_kind[w.kind] += count
        stats.tokens_by_worker[w.name] += count
        stats.received[request_id] += count

    def _finish(self, track: Tracked, w: Worker, reason: str | None) -> None:
        group_done = self.ledger.finish(track, reason)
        w.assigned.discard(track.uid)
        w.holding_changed(self.now)
        self._changed()
        if not w.assigned:
            w.last_finish = self.now
            self._retire_if_empty(w)
        if group_done:
            self._commands.append(GroupDone(track.group))
        if self.ledger.all_finished:
            self._complete()

    def _complete(self) -> None:
        """The last sample finished: the step's timings are final from here on."""
        self.done = True
        # without a hand-off the reserved workers generated it all
        self.stats.close(self.workers.values(), self.now - self.t0, seeded_all=self.seeding, now=self.now)
        if self.seeding:
            self.stats.seed_s = self.now - self._seed_from
        self.seeding = False


__all__ = ["StepTokens"]
