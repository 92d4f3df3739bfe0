"""How one rollout engine batches samples through time (vLLM's scheduler, in closed form): the state
behind every engine of the simulator (`rlboost.sim.cluster`), of the emulated engine
(`rlboost.sim.emulated`) and of the veRL baseline (`rlboost.sim.baselines`).

Contract: `EngineState` moves an engine from event to event (a completion, a full KV cache, an
admission point) with its `EngineProfile`'s closed-form step times, never one Python iteration per
token; `engine_rollout` runs one engine over a fixed set of samples. Pure: no clock, no torch, no Ray.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass

from rlboost.sim.profile import EngineProfile


@dataclass(frozen=True)
class EngineRollout:
    """What one engine's rollout of a fixed set of samples took."""

    seconds: float
    """From the first prefill to the last token."""
    preemptions: int
    """Samples evicted because the KV cache was full (each re-prefills its context when resumed)."""
    max_running: int
    """The largest batch the engine ran."""


KV_WATERMARK = 0.01
"""Fraction of the KV cache that admission leaves free (vLLM v0's block-manager watermark): headroom
for the running samples to grow, so that a new sample is not evicted right after its prefill."""


class EngineState:
    """One engine's continuous batching through time: the state behind `engine_rollout` and behind
    every engine of the simulator (rlboost.sim.cluster). Samples are identified by caller-chosen
    hashable keys.

    The rules are vLLM's scheduler, as `engine_rollout` documents them:
    - Admission happens at admission points: at a `submit` to an idle engine, whenever samples
      finish, after an eviction, and at the first step boundary after a `submit` to (or an `abort`
      on) a busy engine. Waiting samples start in order while the batch is below max_num_seqs and
      their context fits in the KV cache with `KV_WATERMARK` spare. New samples admitted together
      share one batched prefill; a sample that already holds tokens (evicted, or migrated from
      another engine) re-prefills its prompt + tokens on its own. Prefill stalls decoding.
    - Decode: every running sample gains one token per step.
    - KV full: the most recently started sample is evicted to the front of the queue, keeping its
      tokens.
    Between two events (a completion, a full cache, an admission point) the batch is constant, so
    the decode in between is one `advance_s`; an interruption inside such a stretch is located with
    `steps_within`. Never one Python iteration per token.

    Time: `clock` is the engine's position, the end of its last complete decode step (or of its last
    prefill; for an idle engine, when it last did something). A decode step in progress at an
    `advance_to(t)` is not counted: its tokens do not exist yet, so an `abort` at t returns the
    tokens of the complete steps only.
    """

    def __init__(self, engine: EngineProfile, prompt_len: int, start_s: float = 0.0,
                 on_decode: Callable[[int, int, float], None] | None = None):
        self.engine = engine
        self.prompt_len = prompt_len
        self.capacity = engine.kv_capacity_tokens
        self._admit_limit = (1.0 - KV_WATERMARK) * self.capacity
        self._max_seqs = engine.cfg.max_num_seqs
        self.on_decode = on_decode
        """Called as on_decode(batch, steps, seconds) for every stretch of decode steps."""
        self.clock = float(start_s)
        self.step = 0
        """Decode steps done since the engine started (every running sample gained one token each)."""
        self.preemptions = 0
        """Samples evicted because the KV cache was full."""
        self.max_running = 0
        """The largest batch run so far."""
        self.tokens_generated = 0
        """Decode tokens made so far (sum over the stretches of batch x steps)."""
        self._waiting: deque[tuple[Hashable, int, int]] = deque()  # (key, length, tokens already made)
        self._live: dict[int, tuple[Hashable, int, int, int]] = {}  # id -> (key, length, made before, start step)
        self._id_of: dict[Hashable, int] = {}  # key of a live sample -> its admission id
        self._finishes: list[tuple[int, int]] = []  # heap of (finish step, id); entries of gone ids are stale
        self._started: list[int] = []  # ids in start order, to evict the newest; stale ids skipped
        self._next_id = 0
        # Total context of the running samples = offset + len(live) * step, with each sample
        # contributing prompt_len + made_before - start_step to the offset.
        self._offset = 0
        self._admit_due = False  # waiting samples may start at the next step boundary

    # ---- queries -----------------------------------------------------------------------------------

    @property
    def running(self) -> int:
        """Samples in the batch (holding KV)."""
        return len(self._live)

    @property
    def waiting(self) -> int:
        """Samples queued in the engine (not started, or evicted)."""
        return len(self._waiting)

    @property
    def busy(self) -> bool:
        return bool(self._live or self._waiting)

    def progress(self) -> dict[Hashable, int]:
        """key -> tokens made so far (as of `clock`), for every sample the engine holds."""
        made = {key: m for key, _, m in self._waiting}
        for key, _, before, start in self._live.values():
            made[key] = before + self.step - start
        return made

    def next_event_s(self) -> float:
        """When the engine's state next changes on its own (a completion, a full cache or an
        admission point); inf when it has nothing running."""
        if not self._live:
            return math.inf
        batch = len(self._live)
        total = self._offset + batch * self.step
        return self.clock + self.engine.advance_s(batch, total, self._steps_to_event(batch, total))

    # ---- changes -----------------------------------------------------------------------------------

    def submit(self, items: Sequence[tuple[Hashable, int, int]], now_s: float) -> None:
        """Queue samples (key, response length, tokens already made) at time `now_s`. An idle engine
        admits at once; a busy one at its next step boundary."""
        for key, length, made in items:
            if not 0 <= made < length:
                raise ValueError(f"sample {key!r}: tokens made ({made}) must be in [0, length={length})")
            if self.prompt_len + length > self.capacity:
                raise ValueError(f"{self.engine.model.name} at tp={self.engine.tp}: a sample of "
                                 f"{self.prompt_len + length} tokens does not fit in the KV cache "
                                 f"({self.capacity:.0f} tokens)")
        self._waiting.extend(items)
        if not self._live:
            self.clock = max(self.clock, now_s)
            self._settle()
        elif self._waiting:
            self._admit_due = True

    def advance_to(self, t_s: float) -> list[Hashable]:
        """Run the engine up to time `t_s`; returns the keys of the samples that finished (in order)."""
        finished: list[Hashable] = []
        advance_s = self.engine.advance_s
        while self._live:
            batch = len(self._live)
            total = self._offset + batch * self.step
            steps = self._steps_to_event(batch, total)
            seconds = advance_s(batch, total, steps)
            if self.clock + seconds > t_s:
                # Interrupted inside the stretch: only the complete steps count.
                part = min(self.engine.steps_within(batch, total, t_s - self.clock), steps - 1)
                if part > 0:
                    self._decode(batch, part, advance_s(batch, total, part))
                break
            self._decode(batch, steps, seconds)
            while self._finishes and self._finishes[0][0] == self.step:
                _, done = heapq.heappop(self._finishes)
                if done in self._live:
                    key, _, before, start = self._live.pop(done)
                    del self._id_of[key]
                    self._offset -= self.prompt_len + before - start
                    finished.append(key)
            self._admit_due = False
            self._settle()
        return finished

    def abort(self, keys: Iterable[Hashable], now_s: float) -> dict[Hashable, int]:
        """Take samples out of the engine (the caller has advanced it to `now_s`): key -> tokens
        made. Keys the engine does not hold are ignored. Freed KV lets waiting samples start at the
        next admission point."""
        keys = set(keys)
        made: dict[Hashable, int] = {}
        for key in keys & self._id_of.keys():
            sid = self._id_of.pop(key)
            _, _, before, start = self._live.pop(sid)
            self._offset -= self.prompt_len + before - start
            made[key] = before + self.step - start
        if len(made) < len(keys):
            kept: deque[tuple[Hashable, int, int]] = deque()
            for item in self._waiting:
                if item[0] in keys:
                    made[item[0]] = item[2]
                else:
                    kept.append(item)
            self._waiting = kept
        if self._waiting:
            if self._live:
                self._admit_due = True
            else:
                self.clock = max(self.clock, now_s)
                self._settle()
        return made

    # ---- internals ---------------------------------------------------------------------------------

    def _steps_to_event(self, batch: int, total: int) -> int:
        while self._finishes[0][1] not in self._live:
            heapq.heappop(self._finishes)
        room = int((self.capacity - total) // batch)  # steps until the KV cache is full
        steps = min(self._finishes[0][0] - self.step, room)
        return 1 if self._admit_due and steps > 1 else steps

    def _decode(self, batch: int, steps: int, seconds: float) -> None:
        self.clock += seconds
        self.step += steps
        self.tokens_generated += batch * steps
        if self.on_decode is not None:
            self.on_decode(batch, steps, seconds)

    def _settle(self) -> None:
        """An admission point: admit what fits, then evict while the cache is full."""
        cfg_max, prompt_len = self._max_seqs, self.prompt_len
        while True:
            new_prompts, total = 0, self._offset + len(self._live) * self.step
            while self._waiting and len(self._live) < cfg_max:
                key, length, made = self._waiting[0]
                context = prompt_len + made
                # The KV must also take one more token of every running sample in the next step.
                if self._live and total + context + len(self._live) + 1 > self._admit_limit:
                    break
                self._waiting.popleft()
                sid = self._next_id
                self._next_id += 1
                self._live[sid] = (key, length, made, self.step)
                self._id_of[key] = sid
                heapq.heappush(self._finishes, (self.step + length - made, sid))
                self._started.append(sid)
                self._offset += context - self.step
                total += context
                if made:  # a resumed sample recomputes its own prompt + partial response
                    self.clock += self.engine.prefill_s(context)
                else:
                    new_prompts += 1
            if new_prompts:
                self.clock += self.engine.prefill_s(new_prompts * prompt_len, sequences=new_prompts)
            if not self._live:
                return
            self.max_running = max(self.max_running, len(self._live))
            total = self._offset + len(self._live) * self.step
            if (self.capacity - total) // len(self._live) >= 1:
                return
            # Full: evict the newest sample; it keeps its tokens and resumes from the front of the queue.
            while self._started[-1] not in self._live:
                self._started.pop()
            victim = self._started.pop()
            key, length, before, start = self._live.pop(victim)
            del self._id_of[key]
            self._offset -= prompt_len + before - start
            self._waiting.appendleft((key, length, before + self.step - start))
            self.preemptions += 1


def engine_rollout(engine: EngineProfile, lengths: Sequence[int], prompt_len: int) -> EngineRollout:
    """One engine generating responses of `lengths` tokens, all submitted at once, under vLLM-style
    continuous batching with a KV-cache budget.

    - Admission, in the given order, at the start and whenever samples finish: a sample starts if
      the batch is below max_num_seqs and its context fits in the KV cache with `KV_WATERMARK`
      spare. Samples that start together share one batched prefill, which stalls decoding.
    - Decode: every running sample gains one token per step; its context is prompt + tokens so far.
    - KV full: the most recently started sample is evicted to the front of the queue (vLLM's
      recompute preemption) and, when it restarts, re-prefills its prompt + partial response.
    Between two events (a completion or a full cache) the batch is constant, so the decode in
    between is one `advance_s`. The rules live in `EngineState`, which the simulator's engines share."""
    if not lengths:
        return EngineRollout(0.0, 0, 0)
    if min(lengths) < 1:
        raise ValueError("every response length must be >= 1")
    state = EngineState(engine, prompt_len)
    state.submit([(i, length, 0) for i, length in enumerate(lengths)], 0.0)
    while state.running:
        state.advance_to(state.next_event_s())
    return EngineRollout(state.clock, state.preemptions, state.max_running)



__all__ = ["KV_WATERMARK", "EngineRollout", "EngineState", "engine_rollout"]
