"""Scoring responses with the configured reward function, in the run's reward workers, and applying
reward.on_error to what goes wrong there.

Contract: `RewardScorer.start(cfg)` starts the pool (`rlboost.rewards.pool`; RewardConfigError if the
function cannot be loaded); `score(requests)` returns one float per request, in order. A failing
call (raised, returned a non-score, ran past reward.timeout_s, ended its worker) raises
RewardFunctionError naming the sample under `raise`, and under `zero` scores 0.0, counts in
reward/errors (reward/timeouts too if it ran out of time) and has its traceback logged the first
time. `pop_metrics()` gives those counts since the last call. `close()` ends the workers.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from typing import Any

from rlboost.rewards.config import ON_ERROR, RewardConfig
from rlboost.rewards.errors import RewardFunctionError
from rlboost.rewards.pool import Outcome, RewardPool

logger = logging.getLogger("rlboost.rewards")

SCORES = "a finite number, a bool, or a dict with a 'score' key"


@dataclasses.dataclass(frozen=True)
class ScoreRequest:
    """One response to score: veRL's arguments, and the sample's name for error messages."""

    sample: str
    data_source: str
    solution_str: str
    ground_truth: Any
    extra_info: dict | None = None

    def kwargs(self) -> dict[str, Any]:
        return {"data_source": self.data_source, "solution_str": self.solution_str,
                "ground_truth": self.ground_truth, "extra_info": self.extra_info}


class RewardScorer:
    """The run's scorer: its reward workers and the on_error policy (see the module's contract)."""

    def __init__(self, pool: RewardPool, on_error: str = "raise"):
        if on_error not in ON_ERROR:
            raise ValueError(f"on_error must be one of {', '.join(ON_ERROR)}, got {on_error!r}")
        self.pool, self.on_error = pool, on_error
        self.function = pool.name if pool.path is not None else "compute_score"  # what errors call it
        self.num_errors = 0  # failed calls scored 0.0 since the last pop_metrics()
        self.num_timeouts = 0  # of which ran past reward.timeout_s
        self._logged_one = False
        self._lock = threading.Lock()

    @classmethod
    def start(cls, cfg: RewardConfig) -> RewardScorer:
        """A scorer for `cfg`, its workers started (RewardConfigError if the function cannot be loaded)."""
        cfg.validate()
        path, name = cfg.target()
        return cls(RewardPool(path, name, cfg.num_workers, cfg.timeout_s, cfg.start_timeout_s), cfg.on_error)

    def score(self, requests: list[ScoreRequest]) -> list[float]:
        """The responses' scores, in order; see on_error for what a failing call does."""
        outcomes = self.pool.score([r.kwargs() for r in requests])
        return [o.score if o.failure is None else self._fail(r, o) for r, o in zip(requests, outcomes)]

    def _fail(self, request: ScoreRequest, outcome: Outcome) -> float:
        error = RewardFunctionError(self._describe(request, outcome))
        if self.on_error == "raise":
            self._log_traceback(outcome)
            raise error
        with self._lock:
            self.num_errors += 1
            self.num_timeouts += outcome.failure == "timeout"
            first, self._logged_one = not self._logged_one, True
        if first:
            logger.error("%s; scored 0.0 (reward.on_error=zero); later reward errors are only counted in "
                         "reward/errors", error)
            self._log_traceback(outcome)
        return 0.0

    @staticmethod
    def _log_traceback(outcome: Outcome) -> None:
        # at INFO: the run's log file gets it, the console only the error's one line
        if outcome.traceback:
            logger.info("the reward function's traceback, in its worker process:\n%s", outcome.traceback)

    def _describe(self, request: ScoreRequest, outcome: Outcome) -> str:
        name = self.function
        where = f"on sample {request.sample!r} (data_source {request.data_source!r})"
        if outcome.failure == "raised":
            return f"reward function {name} raised {where}: {outcome.detail}"
        if outcome.failure == "returned":
            return f"reward function {name} returned {outcome.detail} {where}; it must return {SCORES}"
        if outcome.failure == "timeout":
            return (f"reward function {name} ran past reward.timeout_s={self.pool.timeout_s:g} s {where}; "
                    f"its worker process was killed")
        return f"reward function {name} ended its worker process {where} ({outcome.detail})"

    def pop_metrics(self) -> dict[str, float]:
        """reward/errors and reward/timeouts since the last call: the step's metrics."""
        with self._lock:
            errors, timeouts, self.num_errors, self.num_timeouts = self.num_errors, self.num_timeouts, 0, 0
        return {"reward/errors": float(errors), "reward/timeouts": float(timeouts)}

    def close(self) -> None:
        """End the reward workers (idempotent)."""
        self.pool.close()

    def __enter__(self) -> RewardScorer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
