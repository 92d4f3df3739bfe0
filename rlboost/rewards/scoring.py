"""Calling the reward function on one response, turning what it does wrong into a named error."""

from __future__ import annotations

import logging
import math
import numbers
import threading
from typing import Any, Callable

import numpy as np

from rlboost.rewards.config import ON_ERROR

logger = logging.getLogger("rlboost.rewards")


class RewardFunctionError(RuntimeError):
    """The reward function raised or returned something that is not a score, on the sample named."""


def _as_score(value: Any) -> float | None:
    """The float a reward function's return value stands for, or None if it is not a score."""
    if isinstance(value, dict) and "score" in value:
        value = value["score"]
    # numbers.Real covers bool and numpy's numeric scalars; a str "1.0" is deliberately not a score.
    if isinstance(value, (numbers.Real, np.bool_)):
        score = float(value)
        return score if math.isfinite(score) else None
    return None


class RewardScorer:
    """Calls `fn` veRL's way and applies the on_error policy (see RewardConfig.on_error)."""

    def __init__(self, fn: Callable, on_error: str = "raise"):
        if on_error not in ON_ERROR:
            raise ValueError(f"on_error must be one of {', '.join(ON_ERROR)}, got {on_error!r}")
        self.fn, self.on_error = fn, on_error
        self.num_errors = 0  # errors scored 0.0 since the last pop_num_errors()
        self._logged_one = False
        self._lock = threading.Lock()  # scoring may run in a thread pool

    def score(self, sample_id: str, data_source: str, solution_str: str, ground_truth: Any,
              extra_info: dict | None = None) -> float:
        """The response's score; see on_error for what a failing reward function does."""
        name = getattr(self.fn, "__name__", repr(self.fn))
        where = f"on sample {sample_id!r} (data_source {data_source!r})"
        try:
            value = self.fn(data_source=data_source, solution_str=solution_str, ground_truth=ground_truth,
                            extra_info=extra_info)
        except Exception as e:
            error = RewardFunctionError(f"reward function {name} raised {where}: {type(e).__name__}: {e}")
            error.__cause__ = e
            return self._fail(error)
        score = _as_score(value)
        if score is None:
            return self._fail(RewardFunctionError(
                f"reward function {name} returned {value!r:.200} {where}; it must return a finite number, "
                f"a bool, or a dict with a 'score' key"))
        return score

    def _fail(self, error: RewardFunctionError) -> float:
        if self.on_error == "raise":
            raise error
        with self._lock:
            self.num_errors += 1
            first, self._logged_one = not self._logged_one, True
        if first:
            logger.error("%s; scored 0.0 (reward.on_error=zero); later reward errors are only counted "
                         "in reward/errors", error, exc_info=error)
        return 0.0

    def pop_num_errors(self) -> int:
        """num_errors, reset to 0: the per-step reward/errors metric."""
        with self._lock:
            n, self.num_errors = self.num_errors, 0
        return n
