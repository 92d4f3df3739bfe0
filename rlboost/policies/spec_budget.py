"""When to speculate: a batch-aware budget from measured step times (DESIGN.md 2.8).

Speculation pays while decoding is memory-bound: verifying a few draft tokens per request costs
about one step, so every accepted token is nearly free. As the batch grows the step becomes
compute-bound and each draft token costs real time, accepted or not. Rather than model that, the
budget measures it: per batch size, the time per emitted token of plain decode steps and of
verification steps, and speculates only where verification is the cheaper one. Time per token is
the ratio of moving averages of a step's seconds and of its tokens, a throughput: a moving average of
each step's ratio would be ruled by unlucky verifications (a full draft verified, one token emitted),
and keep speculation off where, step for step, it pays.
Every `probe_every`-th eligible step runs plain so the baseline stays measured (and a batch size
where speculation lost gets retried on the probes' schedule). Pure: the engine passes the times in.
"""

from __future__ import annotations

from collections import Counter


class SpecBudget:
    def __init__(self, max_batch: int, probe_every: int = 8, smoothing: float = 0.3):
        if probe_every < 2:
            raise ValueError(f"probe_every must be >= 2, got {probe_every}")
        self.max_batch, self.probe_every, self.smoothing = max_batch, probe_every, smoothing
        self._plain: dict[int, tuple[float, float]] = {}
        """Batch size -> moving averages of (seconds, emitted tokens) of plain decode steps."""
        self._spec: dict[int, tuple[float, float]] = {}
        """Batch size -> the same of verification steps."""
        self._eligible: Counter[int] = Counter()

    def speculate(self, batch: int) -> bool:
        """Whether the coming decode step of `batch` requests should verify drafts."""
        if not 0 < batch <= self.max_batch:
            return False
        self._eligible[batch] += 1
        count = self._eligible[batch]
        if batch not in self._plain or count % self.probe_every == 0:
            return False  # measure (or refresh) the plain baseline first
        if batch not in self._spec or count % (4 * self.probe_every) == 1:
            return True  # measure speculation too, and retry it now and then where it lost
        return self.per_token(batch, True) < self.per_token(batch, False)

    def observe(self, batch: int, seconds: float, tokens: int, speculative: bool) -> None:
        """A decode step of `batch` requests took `seconds` and emitted `tokens` tokens."""
        if batch <= 0 or tokens <= 0 or seconds <= 0:
            return
        table = self._spec if speculative else self._plain
        old = table.get(batch)
        a = self.smoothing
        table[batch] = (seconds, tokens) if old is None else (old[0] + a * (seconds - old[0]),
                                                              old[1] + a * (tokens - old[1]))

    def per_token(self, batch: int, speculative: bool) -> float | None:
        """Measured seconds per emitted token of `batch`-request steps, verifying or plain (None: never
        measured)."""
        measured = (self._spec if speculative else self._plain).get(batch)
        return None if measured is None else measured[0] / measured[1]

    def plain_step_s(self, batch: int) -> float | None:
        """Measured seconds of a plain decode step of `batch` requests (None if never measured)."""
        per_token = self.per_token(batch, False)
        return None if per_token is None else per_token * batch
