"""Which reward function scores responses, where it runs, and what a failing one does to the run."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

ON_ERROR = ("raise", "zero")
# `path/to/file.py:function`; only a colon after `.py` splits, so `C:\rewards.py` stays a path.
SPEC = re.compile(r"^(?P<path>.+\.py):(?P<name>[^:/\\]+)$")


@dataclass
class RewardConfig:
    path: str | None = None
    """Python file holding a custom reward function (veRL: custom_reward_function.path), optionally as
    `file.py:function`, which overrides `name`. None: the built-in compute_score (exact checks for the
    built-in tasks, math-verify for everything else)."""

    name: str = "compute_score"
    """The function's name in that file (veRL: custom_reward_function.name). It is called, in a reward
    worker process, as fn(data_source=..., solution_str=..., ground_truth=..., extra_info=...) and
    returns a number, a bool, or a dict with a `score` key."""

    on_error: str = "raise"
    """What a failing call does: one that raises (any exception, math-verify's TimeoutException and
    SystemExit included), returns a bad value, runs past `timeout_s`, or kills its worker process.
    `raise`: the run stops with one line naming the sample (the call's traceback goes to run.log).
    `zero`: that response scores 0.0, is counted in the metric reward/errors (and, if it ran past
    `timeout_s`, in reward/timeouts too), and the first such error is logged, its traceback in run.log."""

    num_workers: int = 4
    """Worker processes that score responses in parallel (`rlboost.rewards.pool`), one call at a time
    each. The function runs only there, never in the driver: each worker imports `path` itself, with
    every RAY_* variable (Ray's token among them) removed from its environment. Started once per run,
    before Ray, and ended with it."""

    timeout_s: float = 30.0
    """Longest a single call may run, in seconds. A call past it has its worker killed and replaced
    (a running call cannot be interrupted otherwise) and counts as a failing call (see on_error)."""

    start_timeout_s: float = 120.0
    """Longest a worker may take to start: the interpreter, rlboost's reward module and the import of
    `path` (a reward that imports torch or a tokenizer takes seconds)."""

    def target(self) -> tuple[str | None, str]:
        """(file path or None, function name), with a `file.py:function` spec in `path` split."""
        if self.path is not None:
            spec = SPEC.match(self.path)
            if spec:
                return spec["path"], spec["name"]
        return self.path, self.name

    def validate(self) -> None:
        """Raise ValueError naming the first invalid field."""
        if self.on_error not in ON_ERROR:
            raise ValueError(f"reward.on_error must be one of {', '.join(ON_ERROR)}, got {self.on_error!r}")
        if not isinstance(self.num_workers, int) or isinstance(self.num_workers, bool) or self.num_workers < 1:
            raise ValueError(f"reward.num_workers must be an integer >= 1, got {self.num_workers!r}")
        for key in ("timeout_s", "start_timeout_s"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
                raise ValueError(f"reward.{key} must be a number of seconds > 0, got {value!r}")
        if self.path is not None and (not isinstance(self.path, str) or not self.path.strip()):
            raise ValueError(f"reward.path must be a file path or null, got {self.path!r}")
        _, name = self.target()
        if not isinstance(name, str) or not name.isidentifier():
            raise ValueError(f"reward.name must be a Python identifier, got {name!r}")
