"""HistoPipe (RhymeRL, arXiv 2508.18588): dispatch order from last epoch's response lengths
(docs/histospec.md, "HistoPipe: dispatch order from the previous epoch's lengths").

Contract: the manager hands `order` the step's samples and gets back the uids in the order to dispatch
them. Groups whose prompt has a history go longest-first (or shortest-first on odd steps when
alternating), each group's samples together, so a join-shortest-queue dispatcher spreads every long
group over the workers. With no history at all (the first epoch) or when disabled,
the given order comes back unchanged: default scheduling. While the step runs, `flag_overruns` names
samples far past their prompt's longest historical response, candidates for early rebalancing. After
the step, `observe_step` records the lengths as the next epoch's history. Pure and deterministic: no
clock, no randomness, inputs are never mutated.

`simulate_tail` is a list-scheduling model of one rollout step to measure what the order buys.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

_PREFIX = "rollout.histopipe"


@dataclass
class HistoPipeConfig:
    enabled: bool = False
    """False: `order` returns the given order, `flag_overruns` flags nothing, nothing is recorded."""
    alternate: bool = False
    """Odd steps dispatch shortest first (RhymeRL alternates so consecutive steps' loads complement each
    other in its pipeline). In a synchronous step it admits the longest samples last, which lengthens
    the step (`rlboost bench histopipe --alternate`), hence off by default."""
    overrun_factor: float = 1.5
    """A sample is flagged once it has generated more than this times its prompt's longest
    historical response ..."""
    overrun_min_tokens: int = 32
    """... and more than this many tokens, so short prompts are not flagged on noise."""
    max_prompts: int = 100_000
    """Bound on remembered prompts; the least recently recorded are forgotten first."""

    def validate(self) -> None:
        if not (self.overrun_factor >= 1 and math.isfinite(self.overrun_factor)):
            raise ValueError(f"{_PREFIX}.overrun_factor must be a finite number >= 1, got {self.overrun_factor}")
        if self.overrun_min_tokens < 0:
            raise ValueError(f"{_PREFIX}.overrun_min_tokens must be >= 0, got {self.overrun_min_tokens}")
        if self.max_prompts < 1:
            raise ValueError(f"{_PREFIX}.max_prompts must be >= 1, got {self.max_prompts}")


@dataclass(frozen=True)
class SampleInfo:
    uid: str         # the sample's id (unique within a step)
    prompt_key: str  # a key for its prompt (the caller hashes the token ids)
    group: int       # its GRPO group index


class LengthHistory:
    """Previous-epoch response lengths per prompt key, bounded (LRU by record order)."""

    def __init__(self, max_prompts: int):
        if max_prompts < 1:
            raise ValueError(f"max_prompts must be >= 1, got {max_prompts}")
        self.max_prompts = max_prompts
        self._lengths: OrderedDict[str, tuple[int, ...]] = OrderedDict()

    def record(self, prompt_key: str, lengths: Sequence[int]) -> None:
        # An empty record (every sample aborted) says nothing new; the older epoch is still the best guess.
        if not lengths:
            return
        if any(n < 0 for n in lengths):
            raise ValueError(f"response lengths must be >= 0, got {list(lengths)}")
        self._lengths.pop(prompt_key, None)  # re-recording makes it the most recent
        self._lengths[prompt_key] = tuple(int(n) for n in lengths)
        while len(self._lengths) > self.max_prompts:
            self._lengths.popitem(last=False)

    def expected(self, prompt_key: str) -> float | None:
        lengths = self._lengths.get(prompt_key)
        return None if lengths is None else sum(lengths) / len(lengths)

    def longest(self, prompt_key: str) -> int | None:
        lengths = self._lengths.get(prompt_key)
        return None if lengths is None else max(lengths)

    def __len__(self) -> int:
        return len(self._lengths)

    def state_dict(self) -> dict:
        # A list of pairs rather than a mapping: the eviction order is part of the state.
        return {"prompts": [[key, list(lengths)] for key, lengths in self._lengths.items()]}

    def load_state_dict(self, state: dict) -> None:
        self._lengths = OrderedDict()
        for key, lengths in state.get("prompts", []):
            self.record(key, lengths)  # the bound of this config applies, oldest dropped first


class HistoPipe:
    def __init__(self, cfg: HistoPipeConfig):
        cfg.validate()
        self.cfg = cfg
        self.history = LengthHistory(cfg.max_prompts)

    def order(self, step: int, samples: Sequence[SampleInfo]) -> list[str]:
        """Dispatch order of sample uids for this step.

        Groups with history go by their prompt's expected length, longest first (shortest first on
        odd steps with cfg.alternate), ties by group index; groups without history follow in the order
        given. A group's samples stay together: a join-shortest-queue dispatcher hands consecutive
        samples to different workers, so a long group is spread over the workers rather than queued on
        one. Longest first is what shortens a synchronous step's tail: the long samples start at once
        and the short ones fill the slots they free.
        """
        uids = [s.uid for s in samples]
        if not self.cfg.enabled:
            return uids
        members: dict[int, list[str]] = {}  # first-appearance order: the default order of unknown groups
        expected: dict[int, float] = {}
        for s in samples:
            members.setdefault(s.group, []).append(s.uid)
            e = self.history.expected(s.prompt_key)
            # A GRPO group shares one prompt; if not, the group lasts as long as its longest member.
            if e is not None:
                expected[s.group] = max(e, expected.get(s.group, e))
        if not expected:
            return uids  # first epoch: nothing to go on
        descending = not (self.cfg.alternate and step % 2 == 1)
        sign = -1.0 if descending else 1.0
        known = sorted(expected, key=lambda g: (sign * expected[g], g))
        return [uid for g in known + [g for g in members if g not in expected] for uid in members[g]]

    def flag_overruns(self, progress: Mapping[str, tuple[str, int]]) -> list[str]:
        """uid -> (prompt_key, tokens so far): the uids past max(overrun_factor x longest,
        overrun_min_tokens), most overrun first (tokens / longest), then by uid."""
        if not self.cfg.enabled:
            return []
        flagged: list[tuple[float, str]] = []
        for uid, (prompt_key, tokens) in progress.items():
            longest = self.history.longest(prompt_key)
            if longest is None:
                continue  # no history, no expectation to overrun
            if tokens > max(self.cfg.overrun_factor * longest, self.cfg.overrun_min_tokens):
                flagged.append((tokens / max(longest, 1), uid))
        flagged.sort(key=lambda f: (-f[0], f[1]))
        return [uid for _, uid in flagged]

    def observe_step(self, finished: Mapping[str, Sequence[int]]) -> None:
        """prompt_key -> the response lengths of that prompt's samples this step: the next epoch's history."""
        if not self.cfg.enabled:
            return
        for prompt_key, lengths in finished.items():
            self.history.record(prompt_key, lengths)

    def state_dict(self) -> dict:
        return {"history": self.history.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.history.load_state_dict(state.get("history", {}))


def simulate_tail(lengths_in_order: Sequence[int], workers: int, max_running: int,
                  step_cost: Callable[[int], float] | None = None) -> tuple[float, float]:
    """A deterministic list-scheduling model of one rollout step.

    Samples are taken in the given order by whichever worker has a free slot first (at equal times,
    the worker running fewest, then the lowest index: join-shortest-queue). A worker decodes its running
    samples in lock-step, one token per sample per decode step; a step with b running samples costs
    step_cost(b) (default 1.0 whatever b). Returns (first_worker_done_time, last_worker_done_time); the
    tail is their difference. A worker that never got a sample is done at 0.0.
    """
    if workers < 1 or max_running < 1:
        raise ValueError(f"workers and max_running must be >= 1, got {workers}, {max_running}")
    if any(n < 0 for n in lengths_in_order):
        raise ValueError("lengths must be >= 0")
    cost = step_cost or (lambda b: 1.0)
    queue = list(reversed(lengths_in_order))  # pop() from the end takes the next in order
    running: list[list[int]] = [[] for _ in range(workers)]  # remaining tokens per running sample
    clock = [0.0] * workers
    done = [0.0] * workers

    def fill() -> None:
        while queue:
            free = [w for w in range(workers) if len(running[w]) < max_running]
            if not free:
                return
            running[min(free, key=lambda w: (len(running[w]), w))].append(queue.pop())

    fill()
    # While samples wait every slot is full, so a worker's batch size is constant until its own next
    # completion: jumping straight to that completion is exact.
    while any(running):
        nxt = {w: clock[w] + min(running[w]) * cost(len(running[w])) for w in range(workers) if running[w]}
        now = min(nxt.values())
        for w, t in nxt.items():
            if t == now:
                steps = min(running[w])
                running[w] = [n - steps for n in running[w] if n > steps]
                clock[w] = done[w] = now
        # Idle workers' clocks catch up so samples handed to them start now, not in their past.
        for w in range(workers):
            if not running[w]:
                clock[w] = now
        fill()
    return min(done), max(done)


__all__ = ["HistoPipe", "HistoPipeConfig", "LengthHistory", "SampleInfo", "simulate_tail"]
