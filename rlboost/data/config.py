"""What to train and evaluate on, and how prompts are batched."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rlboost.data.reasoning_gym import check_task as check_reasoning_gym_task
from rlboost.data.reasoning_gym import dataset_name
from rlboost.data.tasks import TASKS, check_arithmetic_params, check_countdown_params, is_task


@dataclass
class ArithmeticConfig:
    digits: int = 2
    """Every operand has exactly this many digits."""

    operators: str = "+-"
    """Operators to draw from: any non-empty subset of `+-*`."""

    def validate(self, prefix: str = "data.arithmetic.") -> None:
        """Raise ValueError naming the first invalid field."""
        check_arithmetic_params(self.digits, self.operators, prefix)


@dataclass
class CountdownConfig:
    num_numbers: int = 3
    """How many numbers the equation must use, each exactly once (>= 2)."""

    max_number: int = 20
    """The numbers are drawn from 1..max_number."""

    max_target: int = 100
    """Targets lie in 1..max_target."""

    def validate(self, prefix: str = "data.countdown.") -> None:
        """Raise ValueError naming the first invalid field."""
        check_countdown_params(self.num_numbers, self.max_number, self.max_target, prefix)


@dataclass
class DataConfig:
    train_files: list[str] = field(default_factory=list)
    """veRL-schema `.parquet`/`.jsonl` files to train on, concatenated. Empty: the built-in `task`."""

    val_files: list[str] = field(default_factory=list)
    """Files to evaluate on. Empty while `train_files` is given: no evaluation. Empty while training on
    a built-in task: that task's eval split (`val_size` rows), which shares no problem with its train split."""

    task: str = "arithmetic"
    """Built-in task used when `train_files` is empty: `arithmetic`, `countdown`, or one of reasoning-gym's
    procedural datasets as `reasoning_gym:NAME` (e.g. `reasoning_gym:chain_sum`; needs the `reasoning-gym`
    extra, which `make install` installs), scored by that dataset's own checker."""

    train_size: int = 1024
    """Rows of the built-in task's train split."""

    val_size: int = 64
    """Rows of the built-in task's eval split; 0 turns its evaluation off."""

    seed: int = 0
    """Seed of the built-in task's problems and of the train order's shuffling."""

    arithmetic: ArithmeticConfig = field(default_factory=ArithmeticConfig)
    """Parameters of the `arithmetic` task."""

    countdown: CountdownConfig = field(default_factory=CountdownConfig)
    """Parameters of the `countdown` task."""

    reasoning_gym: dict[str, Any] = field(default_factory=dict)
    """Fields of the `reasoning_gym:NAME` dataset's own config, by reasoning-gym's names (e.g.
    `data.reasoning_gym.min_terms=4` for chain_sum); empty: its defaults. Its seed and size come from
    `seed`, `train_size` and `val_size`."""

    train_batch_size: int = 8
    """Prompts per RL step (veRL: data.train_batch_size); each gets rollout.n responses."""

    max_prompt_length: int = 256
    """Longest prompt in tokens, chat template included; a longer one is an error naming its file and
    row, raised before any work starts."""

    max_response_length: int = 128
    """Most tokens generated per response (veRL: data.max_response_length)."""

    shuffle: bool = True
    """Reshuffle the train rows every epoch, seeded by `seed` and the epoch; False keeps file order."""

    def validate(self) -> None:
        """Raise ValueError naming the first invalid field."""
        for name in ("train_files", "val_files"):
            files = getattr(self, name)
            if not isinstance(files, (list, tuple)) or not all(isinstance(f, str) and f for f in files):
                raise ValueError(f"data.{name} must be a list of file paths, got {files!r}")
        if not is_task(self.task):
            raise ValueError(f"data.task must be one of {', '.join(TASKS)} or reasoning_gym:NAME, "
                             f"got {self.task!r}")
        for name, least in (("train_size", 1), ("val_size", 0), ("train_batch_size", 1),
                            ("max_prompt_length", 1), ("max_response_length", 1)):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < least:
                raise ValueError(f"data.{name} must be an int >= {least}, got {value!r}")
        if not self.train_files and self.train_batch_size > self.train_size:
            raise ValueError(f"data.train_batch_size ({self.train_batch_size}) exceeds data.train_size "
                             f"({self.train_size}), the rows of the built-in task's train split")
        if not isinstance(self.seed, int) or isinstance(self.seed, bool):
            raise ValueError(f"data.seed must be an int, got {self.seed!r}")
        self.arithmetic.validate()
        self.countdown.validate()
        name = dataset_name(self.task)
        if name is not None and not self.train_files:
            check_reasoning_gym_task(name, dict(self.reasoning_gym))
        elif name is None and self.reasoning_gym:
            raise ValueError(f"data.reasoning_gym is set but data.task={self.task!r} is not a reasoning_gym:NAME "
                             "task")

    def task_params(self) -> dict:
        """Keyword parameters of the selected built-in task's row generator (a reasoning-gym dataset's
        config fields; its name is in `task`)."""
        if dataset_name(self.task) is not None:
            return dict(self.reasoning_gym)
        return dict(vars(getattr(self, self.task)))
