"""What an emulated engine (`rlboost.sim.emulated`) generates: the token at each position of a
request, its log-prob, and the response's length, each a pure function of the request's seed.

Contract (docs/simulator.md, "Emulated engine"): the token at absolute position t of a request is
`token_at(seed, t, vocab, stops)` and its log-prob `logprob_at(seed, t)` (the counter-based draws of
`rlboost.engine.rng`), so a request resubmitted as prompt + partial tokens goes on with the same
tokens (exact continuation, checkable). The response length is `ResponseLengths(workload)(seed)`,
drawn from the simulator's workload (`rlboost.sim.workload`): a seed made by
`workload_seed(step, prompt, sample)` gets exactly `Workload.step(step)[prompt][sample]`, so a
simulation of the same workload sees the same samples; any other seed a draw from the same
distribution keyed by the seed alone. Pure: no clock, no state but a cache of workload steps.
"""

from __future__ import annotations

import math
from statistics import NormalDist

from rlboost.engine.rng import hash64, uniform
from rlboost.sim.workload import Workload, WorkloadConfig

FIRST_TOKEN = 3
"""Emulated tokens are drawn from [FIRST_TOKEN, vocab): ids 0-2 stay free for pad/BOS/EOS."""

# Workload seeds (63 bits): a 16-bit tag, then step (23 bits), prompt (12 bits), sample (12 bits). A
# random seed that happens to carry the tag still gets a draw from the same distribution: harmless.
_TAG_BITS, _STEP_BITS, _INDEX_BITS = 16, 23, 12
_TAG_VALUE = 0x5EED
_TAG_SHIFT = _STEP_BITS + 2 * _INDEX_BITS

# Streams of the counter-based draws (rlboost.engine.rng), one per kind of draw.
_TOKEN_STREAM, _LOGPROB_STREAM, _LENGTH_STREAM = 1, 2, 3


def token_at(seed: int, position: int, vocab: int, stops: frozenset[int] = frozenset()) -> int:
    """The emulated token at absolute position `position` (prompt included) of a request: never a
    stop id (the stop token is placed at a response's end only)."""
    span = vocab - FIRST_TOKEN
    t = FIRST_TOKEN + hash64(seed, position, _TOKEN_STREAM) % span
    while t in stops:
        t = FIRST_TOKEN + (t - FIRST_TOKEN + 1) % span
    return t


def logprob_at(seed: int, position: int) -> float:
    """The emulated log-prob of the token at `position`: in (-4.01, -0.01]."""
    return -(0.01 + 4.0 * uniform(seed, position, _LOGPROB_STREAM))


def workload_seed(step: int, prompt: int, sample: int) -> int:
    """The seed of sample `sample` of prompt `prompt` in workload step `step`: an emulated engine
    gives it the length `Workload.step(step)[prompt][sample]`."""
    if not (0 <= step < 1 << _STEP_BITS and 0 <= prompt < 1 << _INDEX_BITS and 0 <= sample < 1 << _INDEX_BITS):
        raise ValueError(f"workload_seed({step}, {prompt}, {sample}) is out of range")
    return _TAG_VALUE << _TAG_SHIFT | step << 2 * _INDEX_BITS | prompt << _INDEX_BITS | sample


class ResponseLengths:
    """Seed -> (response length, truncated by the workload's cap). Workload seeds (`workload_seed`)
    get the workload's own draw for that step, prompt and sample; any other seed a draw from the same
    distribution keyed by the seed alone."""

    def __init__(self, cfg: WorkloadConfig):
        self.cfg = cfg
        self.work = Workload(cfg)
        self._steps: dict[int, list[list[int]]] = {}
        total = math.hypot(cfg.sigma, cfg.within_group_sigma)
        self._sigma = total

    def __call__(self, seed: int) -> tuple[int, bool]:
        cfg = self.cfg
        step = (seed >> 2 * _INDEX_BITS) & ((1 << _STEP_BITS) - 1)
        prompt = (seed >> _INDEX_BITS) & ((1 << _INDEX_BITS) - 1)
        sample = seed & ((1 << _INDEX_BITS) - 1)
        if (seed >> _TAG_SHIFT == _TAG_VALUE and prompt < cfg.prompts_per_step
                and sample < cfg.samples_per_prompt):
            grid = self._steps.get(step)
            if grid is None:
                if len(self._steps) > 64:
                    self._steps.clear()
                grid = self._steps[step] = self.work.step(step)
            length = grid[prompt][sample]
        else:
            u = uniform(seed, 0, _LENGTH_STREAM)
            median = self.work.median(0)
            if cfg.distribution == "lognormal":
                raw = median * math.exp(self._sigma * NormalDist().inv_cdf(u))
            elif cfg.distribution == "uniform":
                raw = 1.0 + u * (2.0 * median - 1.0)
            else:
                raw = median
            length = int(min(max(round(raw), 1), cfg.max_response))
        return length, length >= cfg.max_response


__all__ = ["FIRST_TOKEN", "ResponseLengths", "logprob_at", "token_at", "workload_seed"]
