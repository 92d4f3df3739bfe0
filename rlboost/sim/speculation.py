"""Speculative decoding (HistoSpec) in the timing of the simulated rollout engines (issue 27, item 4).

Contract: with `SpecConfig.accepted_per_verify` = a > 0, every rollout engine of a run (reserved
engines, instances, veRL's) verifies drafts of d = `draft_tokens` tokens per request:
- A verify step is one forward over d + 1 tokens of every running request:
  `EngineProfile.verify_step_s`, the profile's roofline with the same reads (weights, every running
  context's KV) and d + 1 times the compute. Memory-bound at small batch, it costs about one decode
  step; compute-bound, up to d + 1 of them.
- It emits 1 + a tokens per request on average, a being an input (what the replay harness,
  `rlboost.histospec.replay`, measures on recorded histories). The model is fluid:
  `SpeculativeProfile` is an `EngineProfile` whose step stays what `EngineState` counts, one token
  of every running request, and costs verify_step_s / (1 + a) where the engine drafts. So a request
  of L tokens takes L / (1 + a) verify steps, and the batching rules (admission, KV, evictions,
  aborts at step boundaries) stay as they are.
- The budget is the engine's (`rlboost.policies.spec_budget.SpecBudget` under
  `engine.spec_max_batch`): draft only on steps of at most `max_batch` requests, and there only
  where the time per emitted token of verifying beats plain decoding; here with the modelled costs
  instead of measured ones, at each step's context (the engine's moving averages follow the context
  as it grows). Otherwise the step is a plain decode step.
- Closed form: the cost of a token step is min(plain, verify / (1 + a)), each the larger of two
  lines in the total context, so it is piecewise linear with its breaks where two of the four lines
  cross. `advance_s` sums each piece as an arithmetic series and equals the sum of `step_s` (the
  tests check to 1e-9). The cost never falls as contexts grow, so the inherited `steps_within` holds.
- a = 0 is plain decoding: a verify step never costs less than a decode step, so the budget never
  drafts. 0 is the default, and `speculating` then hands back the plain profile: runs without
  HistoSpec are unchanged.
Pure: no clock, no torch, no Ray.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

from rlboost.sim.profile import EngineProfile

_PREFIX = "simulate.histospec"

Line = tuple[float, float]
"""(intercept, slope) of a time in the total context of the running requests."""


@dataclass
class SpecConfig:
    """Speculative decoding of the simulated rollout engines (`simulate.histospec.*`)."""

    accepted_per_verify: float = 0.0
    """Draft tokens accepted per request per verify step, on average (the replay harness's
    `accepted_per_verify`); a verify step emits 1 + this per request. An input, not modelled. 0: no
    speculative decoding (the default)."""
    draft_tokens: float = 4.0
    """Draft tokens verified per request per verify step, on average: the verify forward's extra width,
    at least accepted_per_verify. 4: the n-gram drafter's initial draft (`rollout.histospec.initial_draft`);
    drafts grow to `max_draft` = 8 while fully accepted. It only matters where verifying is
    compute-bound."""
    max_batch: int = 256
    """Draft only on decode steps of at most this many requests (the engine's `engine.spec_max_batch`,
    whose default 8 is set for the CPU engine). 256 = the engines' max_num_seqs: the modelled costs
    alone decide. 0: never draft."""

    @property
    def enabled(self) -> bool:
        return self.accepted_per_verify > 0 and self.max_batch > 0

    def validate(self) -> None:
        """Raise ValueError naming the offending field."""
        if not (math.isfinite(self.accepted_per_verify) and self.accepted_per_verify >= 0):
            raise ValueError(f"{_PREFIX}.accepted_per_verify must be finite and >= 0, got {self.accepted_per_verify}")
        if not (math.isfinite(self.draft_tokens) and self.draft_tokens > 0):
            raise ValueError(f"{_PREFIX}.draft_tokens must be finite and > 0, got {self.draft_tokens}")
        if self.accepted_per_verify > self.draft_tokens:
            raise ValueError(f"{_PREFIX}.accepted_per_verify ({self.accepted_per_verify}) cannot exceed "
                             f"draft_tokens ({self.draft_tokens}): a verify step accepts at most its draft")
        if self.max_batch < 0:
            raise ValueError(f"{_PREFIX}.max_batch must be >= 0, got {self.max_batch}")


class SpeculativeProfile(EngineProfile):
    """An engine that verifies drafts where the budget says they pay (see the module docstring).
    `step_s` and `advance_s` are per token step: every running request gains one token."""

    def __init__(self, plain: EngineProfile, spec: SpecConfig):
        spec.validate()
        super().__init__(plain.model, plain.gpu, plain.cfg)
        self.spec = spec
        self._emitted = 1.0 + spec.accepted_per_verify

    def drafts(self, batch: int, total_context: float) -> bool:
        """Whether the budget verifies drafts on a step of `batch` requests at `total_context`: the
        batch is within max_batch and a verify step's time per emitted token beats a decode step's."""
        return (batch <= self.spec.max_batch
                and self.verify_step_s(batch, total_context, self.spec.draft_tokens) / self._emitted
                < EngineProfile.step_s(self, batch, total_context))

    def step_s(self, batch: int, total_context: float) -> float:
        """Seconds per token step: a plain decode step, or where the budget drafts, a verify step over
        the 1 + accepted_per_verify tokens it emits."""
        if batch > self.spec.max_batch:
            return super().step_s(batch, total_context)
        return min(max(i + s * total_context for i, s in lines) for lines in self._costs(batch))

    def advance_s(self, batch: int, total_context: float, steps: int) -> float:
        """Seconds of `steps` token steps at a constant `batch` from `total_context` (growing by `batch`
        per step): sum(step_s(batch, total_context + k * batch) for k in range(steps)), in closed form."""
        if steps <= 0 or batch > self.spec.max_batch:
            return super().advance_s(batch, total_context, steps)
        plain, verify = self._costs(batch)
        return _sum_min_of_maxima(plain, verify, float(total_context), float(batch), steps)

    def _costs(self, batch: int) -> tuple[tuple[Line, Line], tuple[Line, Line]]:
        """The lines of a token step's seconds, overhead included: (plain memory, plain compute) and
        (verify memory, verify compute) over the tokens a verify step emits."""
        if batch < 1:
            raise ValueError(f"a decode step needs batch >= 1, got {batch}")
        o, e = self.overhead_s, self._emitted
        plain = tuple((o + i, s) for i, s in self.roofline(batch))
        verify = tuple(((o + i) / e, s / e) for i, s in self.roofline(batch, self.spec.draft_tokens))
        return plain, verify


def _sum_min_of_maxima(first: tuple[Line, ...], second: tuple[Line, ...], c0: float, b: float, n: int) -> float:
    """sum over k in [0, n) of min(max of the `first` lines, max of the `second` lines) at C = c0 + k b.
    Between two integers where lines cross, their order is fixed, so one line is the value: each such
    run is an arithmetic series."""
    def at(c: float):
        return lambda line: line[0] + line[1] * c

    cuts = {0, n}
    for (i1, s1), (i2, s2) in itertools.combinations(first + second, 2):
        rate = (s1 - s2) * b
        if rate != 0.0:
            cross = -((i1 - i2) + (s1 - s2) * c0) / rate
            if 0.0 < cross < n:
                cuts.add(math.ceil(cross))
    total = 0.0
    edges = sorted(cuts)
    for k0, k1 in zip(edges, edges[1:]):
        value = at(c0 + b * (k0 + k1 - 1) / 2.0)  # inside the run, away from its crossings
        intercept, slope = min(max(first, key=value), max(second, key=value), key=value)
        m = k1 - k0
        total += m * intercept + slope * (m * c0 + b * (k0 + k1 - 1) * m / 2.0)
    return total


def speculating(engine: EngineProfile, spec: SpecConfig) -> EngineProfile:
    """The engine profile of a run: `engine` itself when `spec` drafts nothing, else its speculative twin."""
    return SpeculativeProfile(engine, spec) if spec.enabled else engine


__all__ = ["SpecConfig", "SpeculativeProfile", "speculating"]
