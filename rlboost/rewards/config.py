"""Which reward function scores responses, and what a failing one does to the run."""

from __future__ import annotations

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
    """The function's name in that file (veRL: custom_reward_function.name). It is called as
    fn(data_source=..., solution_str=..., ground_truth=..., extra_info=...) and returns a number, a bool,
    or a dict with a `score` key."""

    on_error: str = "raise"
    """`raise`: a reward function that raises or returns a bad value stops the run with an error naming
    the sample. `zero`: that response scores 0.0, is counted in the metric reward/errors, and the first
    such error's traceback is logged."""

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
        if self.path is not None and (not isinstance(self.path, str) or not self.path.strip()):
            raise ValueError(f"reward.path must be a file path or null, got {self.path!r}")
        _, name = self.target()
        if not isinstance(name, str) or not name.isidentifier():
            raise ValueError(f"reward.name must be a Python identifier, got {name!r}")
