"""The simulated workload: how long each response of each RL step is.

Contract: `Workload(cfg).step(s)` gives the response lengths of step s as [prompt][sample], every
length in [1, max_response]. It is a pure function of (cfg, s): the same config and step give the
same lengths in any order of calls, so a simulator run, its baselines and a test see the same work.

The dataset is `dataset_size` prompts visited in order and cycled: step s holds prompts
(s * prompts_per_step + i) mod dataset_size. Lengths are lognormal with two levels of spread:
  length = median_s * exp(sigma * z_prompt + within_group_sigma * z_sample), truncated to max_response
where z_prompt is fixed per dataset prompt (a function of seed and prompt id only, so a prompt that
comes back next epoch is again long or short: what history-based scheduling such as HistoPipe relies
on) and z_sample is drawn afresh for every sample of every step (the 8 responses to one prompt
scatter around that prompt's own length). median_s = median_response * (1 + drift_per_step)^s
models responses growing over RL training. "uniform" and "fixed" replace the lognormal for
sensitivity studies and tests. Pure: numpy's seeded generators, no clock.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

_PREFIX = "sim.workload"
DISTRIBUTIONS = ("lognormal", "uniform", "fixed")

# Stream tags for the seeded generators: one per kind of draw, so adding a kind never shifts another.
_PROMPT_STREAM = 0
_SAMPLE_STREAM = 1


@dataclass
class WorkloadConfig:
    """Shape of the simulated RL workload (defaults: the RLBoost paper's GRPO setting on OpenR1-Math)."""

    prompts_per_step: int = 128
    """Prompts in one RL step (the paper's batch: 128 prompts)."""
    samples_per_prompt: int = 8
    """Responses sampled per prompt: the GRPO group size (the paper's 8)."""
    prompt_len: int = 512
    """Tokens of every prompt. OpenR1-Math problems are a few sentences (~100-300 tokens) and the Qwen3
    chat template with an instruction to reason step by step and box the answer adds ~50-100; 512 is a
    round upper-middle figure. Prompts are ~10% of a sequence and ~1% of the work (one prefill
    each), so the choice barely matters."""
    max_response: int = 14336
    """Response cap in tokens (the paper's 14K); longer responses are truncated here."""
    distribution: str = "lognormal"
    """"lognormal" (default, see the module docstring), "uniform" (each sample uniform on
    [1, 2 * median], no correlation within a prompt) or "fixed" (every sample is the median)."""
    median_response: int = 3500
    """Median response length in tokens at step 0 before truncation. Qwen3 in thinking mode on
    competition-style math writes a few thousand tokens for a typical problem (MATH-level problems
    ~2-5K, olympiad-level ones past 10K); OpenR1-Math mixes both. See docs/simulator.md."""
    sigma: float = 0.7
    """Lognormal spread of the prompts' own lengths (log-space standard deviation across prompts)."""
    within_group_sigma: float = 0.4
    """Log-space standard deviation of a prompt's samples around that prompt's own length. Smaller
    than `sigma`: responses to one prompt correlate. Total spread sqrt(sigma^2 + within^2) = 0.81,
    which puts ~4% of samples at the 14K cap with the default median."""
    drift_per_step: float = 0.0
    """Relative growth of the median per step, compounded: median_s = median * (1 + drift)^s
    (response lengths grow over RL training of reasoning models; 0 keeps them stationary)."""
    dataset_size: int = 4096
    """Prompts in the dataset; it is cycled, so prompt i recurs every dataset_size / prompts_per_step
    steps (an epoch) with a correlated length."""
    seed: int = 0
    """Seed of every draw; lengths are a function of (seed, step) only."""

    def validate(self) -> None:
        """Raise ValueError naming the offending field."""
        for name in ("prompts_per_step", "samples_per_prompt", "max_response", "median_response", "dataset_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{_PREFIX}.{name} must be >= 1, got {getattr(self, name)}")
        if self.prompt_len < 0:
            raise ValueError(f"{_PREFIX}.prompt_len must be >= 0, got {self.prompt_len}")
        if self.distribution not in DISTRIBUTIONS:
            raise ValueError(f"{_PREFIX}.distribution must be one of {', '.join(DISTRIBUTIONS)}, "
                             f"got {self.distribution!r}")
        for name in ("sigma", "within_group_sigma"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{_PREFIX}.{name} must be finite and >= 0, got {value}")
        if not (math.isfinite(self.drift_per_step) and self.drift_per_step > -1):
            raise ValueError(f"{_PREFIX}.drift_per_step must be finite and > -1, got {self.drift_per_step}")
        if self.seed < 0:
            raise ValueError(f"{_PREFIX}.seed must be >= 0 (numpy seeds are unsigned), got {self.seed}")


class Workload:
    """Response lengths of every step of a simulated run (see the module docstring)."""

    def __init__(self, cfg: WorkloadConfig):
        cfg.validate()
        self.cfg = cfg
        self._prompt_z: dict[int, float] = {}  # dataset prompt id -> its own log-length offset

    def prompt_ids(self, step: int) -> list[int]:
        """The dataset prompts that make up `step`, in order."""
        if step < 0:
            raise ValueError(f"step must be >= 0, got {step}")
        n, size = self.cfg.prompts_per_step, self.cfg.dataset_size
        return [(step * n + i) % size for i in range(n)]

    def median(self, step: int) -> float:
        """The median response length of `step` before truncation (drift applied)."""
        return self.cfg.median_response * (1.0 + self.cfg.drift_per_step) ** step

    def _z(self, prompt_id: int) -> float:
        # One generator per prompt id, keyed by (seed, id) alone: the prompt's length offset must not
        # depend on the dataset size, the batch size or which step asks first.
        z = self._prompt_z.get(prompt_id)
        if z is None:
            z = float(np.random.default_rng([self.cfg.seed, _PROMPT_STREAM, prompt_id]).standard_normal())
            self._prompt_z[prompt_id] = z
        return z

    def step(self, step: int) -> list[list[int]]:
        """Response lengths of `step` as [prompt][sample], each in [1, max_response]."""
        cfg = self.cfg
        ids = self.prompt_ids(step)
        shape = (cfg.prompts_per_step, cfg.samples_per_prompt)
        rng = np.random.default_rng([cfg.seed, _SAMPLE_STREAM, step])
        median = self.median(step)
        if cfg.distribution == "lognormal":
            prompt_z = np.array([self._z(i) for i in ids])[:, None]
            log_len = math.log(median) + cfg.sigma * prompt_z + cfg.within_group_sigma * rng.standard_normal(shape)
            lengths = np.exp(log_len)
        elif cfg.distribution == "uniform":
            lengths = rng.uniform(1.0, 2.0 * median, size=shape)
        else:  # "fixed"
            lengths = np.full(shape, median)
        # Round, then clip: a sample can be no shorter than one token and no longer than the cap.
        lengths = np.clip(np.rint(lengths), 1, cfg.max_response).astype(np.int64)
        return lengths.tolist()

    def stats(self, steps: int, start: int = 0) -> dict:
        """Statistics of all samples of steps [start, start + steps): mean, median, p90, p99 and
        std of the lengths, the fraction truncated at the cap, and the sample count."""
        if steps < 1:
            raise ValueError(f"steps must be >= 1, got {steps}")
        lengths = np.array([self.step(s) for s in range(start, start + steps)], dtype=np.float64).ravel()
        return {
            "mean": float(lengths.mean()),
            "median": float(np.median(lengths)),
            "p90": float(np.percentile(lengths, 90)),
            "p99": float(np.percentile(lengths, 99)),
            "std": float(lengths.std()),
            "truncated": float(np.mean(lengths >= self.cfg.max_response)),
            "samples": int(lengths.size),
        }


def lognormal_truncation(cfg: WorkloadConfig) -> float:
    """The analytic fraction of lognormal samples at the cap at step 0 (a check on `stats`)."""
    total = math.hypot(cfg.sigma, cfg.within_group_sigma)
    if total == 0:
        return float(cfg.median_response >= cfg.max_response)
    z = math.log(cfg.max_response / cfg.median_response) / total
    return 0.5 * math.erfc(z / math.sqrt(2.0))


__all__ = ["DISTRIBUTIONS", "Workload", "WorkloadConfig", "lognormal_truncation"]
