"""The step's ledger of samples: where each one stands, the tokens it holds, and the checks every token
passes on its way in (docs/hybrid.md, "Invariants and the tests that check them",
invariants 1-3).

Contract: the `StepState` (rlboost.rollout.step_state) decides where samples go; the ledger records
it. A sample is pending (in `pending`, in dispatch order), running one attempt (`start`: its request id
is `uid#attempt`, and anything about an older attempt is stale), or finished once (`finish`). Tokens
come in through `accept`, after `check_chunk` (a streamed chunk) or `check_partial` (an abort's exact
partial output) has refused tokens of a weight version outside the step's window (on-policy, or at
most `max_staleness` versions behind its newest: bounded staleness), a gap or a repeat (exactly
once) and a partial output that does not extend what was streamed (exact continuation). In the runtime
a sample's `Sample` stores the tokens; the simulator's ledger keeps counts only. Pure, like the step.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence

from rlboost.rollout.step_data import Partial, Request, SampleState, StepError, Tracked


class SampleLedger:
    def __init__(self, samples: Iterable[tuple[str, int, object | None]], version: int,
                 order: Sequence[str] | None = None, max_staleness: int = 0):
        """`samples`: (uid, group index, token store or None); `order`: every uid once, in dispatch order.
        Tokens are admitted from versions `version - max_staleness` to `version` (`advance` moves it)."""
        self.version = version
        self.max_staleness = max_staleness
        self.tracked: dict[str, Tracked] = {}
        self.remaining: dict[int, int] = {}
        """Group index -> its samples not finished yet."""
        for uid, group, sample in samples:
            if uid in self.tracked:
                raise ValueError(f"sample uid {uid!r} appears twice in the step")
            self.tracked[uid] = Tracked(uid, group, sample, tokens=len(sample.response_ids) if sample else 0)
            self.remaining[group] = self.remaining.get(group, 0) + 1
        if order is not None and (len(order) != len(self.tracked) or set(order) != self.tracked.keys()):
            raise ValueError("a dispatch order must name every sample of the step exactly once")
        self.pending: deque[str] = deque(self.tracked if order is None else order)
        self.running: dict[str, Tracked] = {}
        """Request id -> the sample of every attempt running now (any other request id is stale)."""
        self.num_finished = 0
        self.finished_tokens = 0
        """Response tokens of the finished samples, all together."""

    @property
    def all_finished(self) -> bool:
        return self.num_finished == len(self.tracked)

    def start(self, uid: str, worker: str) -> Request:
        """A new attempt of a pending sample on `worker`, continuing from the tokens it holds (the
        caller has taken it out of `pending`: the dispatch takes many at once)."""
        track = self.tracked[uid]
        track.attempt += 1
        track.state, track.worker = SampleState.RUNNING, worker
        track.request_id = f"{uid}#{track.attempt}"
        self.running[track.request_id] = track
        track.base = track.tokens
        return Request(uid, track.request_id, track.tokens)

    def attempt(self, request_id: str, worker: str) -> Tracked | None:
        """The sample whose running attempt on `worker` is `request_id`; None: a stale attempt."""
        track = self.running.get(request_id)
        return track if track is not None and track.worker == worker else None

    def check_chunk(self, track: Tracked, offset: int, version: int) -> None:
        """A streamed chunk's first token sits at `offset` of the attempt's response."""
        self._check_version(track, version)
        if track.base + offset != track.tokens:
            raise StepError(f"sample {track.uid}: chunk at response offset {track.base + offset} but {track.tokens} "
                            "tokens received (a gap or a duplicate)")

    def check_partial(self, track: Tracked, partial: Partial) -> int:
        """An aborted attempt's exact output; returns how many of its tokens were not streamed."""
        received = track.tokens - track.base
        if partial.token_ids is not None and track.sample is not None:
            if list(partial.token_ids[:received]) != track.sample.response_ids[track.base:]:
                raise StepError(f"sample {track.uid}: the aborted request's tokens do not extend the tokens "
                                "already streamed")
        if partial.count < received:
            raise StepError(f"sample {track.uid}: an abort returned {partial.count} tokens but {received} were "
                            "streamed")
        extra = partial.count - received
        if extra:
            self._check_version(track, partial.version)
        return extra

    def accept(self, track: Tracked, count: int, version: int, token_ids: Sequence[int] | None,
               logprobs: Sequence[float] | None) -> None:
        """`count` checked tokens join the sample (the runtime's with their ids and log-probs)."""
        track.tokens += count
        if count:
            track.oldest_version = version if track.oldest_version is None else min(track.oldest_version, version)
        sample = track.sample
        if sample is not None:
            if token_ids is None or logprobs is None or len(token_ids) != count or len(logprobs) != count:
                raise StepError(f"sample {track.uid}: {count} tokens announced without their ids and log-probs")
            sample.response_ids += token_ids
            sample.logprobs += logprobs
            sample.versions += [version] * count

    def finish(self, track: Tracked, reason: str | None) -> bool:
        """The sample is complete; returns whether that completes its group."""
        del self.running[track.request_id]
        track.state, track.worker, track.finish_reason = SampleState.FINISHED, None, reason
        if track.sample is not None:
            track.sample.finish_reason = reason
        self.num_finished += 1
        self.finished_tokens += track.tokens
        self.remaining[track.group] -= 1
        return self.remaining[track.group] == 0

    def requeue(self, track: Tracked, forget_tokens: bool = False) -> None:
        """Back to pending, first in line: it already holds tokens and its group waits on it. With
        `forget_tokens` it starts again from nothing (migration=recompute)."""
        del self.running[track.request_id]
        track.state, track.worker = SampleState.PENDING, None
        track.migrations += 1
        if forget_tokens:
            track.tokens, track.oldest_version = 0, None
            if track.sample is not None:
                del track.sample.response_ids[:], track.sample.logprobs[:], track.sample.versions[:]
        self.pending.appendleft(track.uid)

    def requeue_dead(self, uids: list[str], progress: dict[str, int], forget_tokens: bool) -> tuple[int, int]:
        """Requeue the samples a dead worker held, from their last received token (or from nothing with
        `forget_tokens`). `progress`: request id -> tokens its attempt generated, received or not.
        Returns (tokens generated and never received: the waste, tokens forgotten)."""
        wasted = forgotten = 0
        for uid in uids:
            track = self.tracked[uid]
            received = track.tokens - track.base
            wasted += max(0, progress.get(track.request_id, received) - received)
            forgotten += track.tokens if forget_tokens else 0
            self.requeue(track, forget_tokens)
        return wasted, forgotten

    @property
    def oldest_admitted(self) -> int:
        """The oldest weight version whose tokens the step takes now."""
        return self.version - self.max_staleness

    def admits(self, version: int | None) -> bool:
        return version is not None and self.oldest_admitted <= version <= self.version

    def advance(self, version: int) -> None:
        """The step's newest version is now `version` (the trainer published it). A token the samples
        already hold may not fall out of the window: the trainer would train on it past the bound."""
        if version < self.version:
            raise StepError(f"the step's weight version cannot go back from {self.version} to {version}")
        self.version = version
        for track in self.tracked.values():
            if track.oldest_version is not None and track.oldest_version < self.oldest_admitted:
                raise StepError(f"sample {track.uid} holds tokens of weight version {track.oldest_version}, more "
                                f"than max_staleness={self.max_staleness} behind version {version}")

    def _check_version(self, track: Tracked, version: int) -> None:
        if not self.admits(version):
            window = (f"version {self.version}" if not self.max_staleness
                      else f"versions {self.oldest_admitted}..{self.version}")
            raise StepError(f"sample {track.uid}: tokens of weight version {version} in a step at {window}")


__all__ = ["SampleLedger"]
