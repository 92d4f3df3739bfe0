"""The train and eval rows a config names, and the seeded, resumable order train prompts come in."""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from rlboost.data.config import DataConfig
from rlboost.data.rows import DatasetError, PromptRow, read_rows
from rlboost.data.tasks import task_rows


def _read_all(files: Sequence[str]) -> list[PromptRow]:
    rows = []
    for path in files:
        rows += read_rows(path)
    return rows


def load_datasets(cfg: DataConfig) -> tuple[list[PromptRow], list[PromptRow]]:
    """(train rows, eval rows): from `train_files`/`val_files` when given, else the built-in task's splits.
    Every file is validated as it is read; an empty training set is an error."""
    cfg.validate()
    if cfg.train_files:
        train = _read_all(cfg.train_files)
        if not train:
            raise DatasetError(f"data.train_files hold no rows: {', '.join(cfg.train_files)}")
    else:
        train = task_rows(cfg.task, cfg.train_size, cfg.seed, "train", **cfg.task_params())
    if cfg.val_files:
        val = _read_all(cfg.val_files)
    elif cfg.train_files:
        val = []
    else:
        val = task_rows(cfg.task, cfg.val_size, cfg.seed, "eval", **cfg.task_params())
    return train, val


def check_prompt_lengths(rows: Sequence[PromptRow], count_tokens: Callable[[PromptRow], int],
                         max_prompt_length: int) -> int:
    """The longest prompt's token count; DatasetError naming the row if one exceeds max_prompt_length.
    `count_tokens` measures a row's prompt as the model sees it (chat template applied)."""
    longest = 0
    for i, row in enumerate(rows):
        n = count_tokens(row)
        if n > max_prompt_length:
            raise DatasetError(f"{row.origin or f'row {i} (0-based)'}: prompt is {n} tokens, more than "
                               f"data.max_prompt_length={max_prompt_length}", row=i, column="prompt")
        longest = max(longest, n)
    return longest


class PromptLoader:
    """Yields batches of `batch_size` rows, epoch after epoch, in a seeded order; checkpointable.

    Epoch e visits the rows in a permutation that is a pure function of (seed, e, len(rows)), so a loader
    restored from state_dict() continues with exactly the batches the original would have produced.
    An epoch's last len(rows) % batch_size rows of its order are dropped (veRL's drop_last): every
    batch is full, and a different set of rows is left out each epoch when shuffling.
    """

    def __init__(self, rows: Sequence[PromptRow], batch_size: int, seed: int, shuffle: bool = True):
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if batch_size > len(rows):
            raise ValueError(f"batch_size {batch_size} is larger than the {len(rows)} training rows; "
                             f"not even one full batch can be made")
        self.rows, self.batch_size, self.seed, self.shuffle = rows, batch_size, seed, shuffle
        self._epoch, self._position = 0, 0
        self._order_epoch, self._order = -1, np.arange(0)

    @property
    def epoch(self) -> int:
        """Epoch the next batch comes from (0-based); it is also the number of epochs completed."""
        return self._epoch

    @property
    def position(self) -> int:
        """Rows of the current epoch's order already handed out."""
        return self._position

    @property
    def batches_per_epoch(self) -> int:
        return len(self.rows) // self.batch_size

    def _epoch_order(self) -> np.ndarray:
        if self._order_epoch != self._epoch:
            if self.shuffle:
                self._order = np.random.default_rng([self.seed, self._epoch]).permutation(len(self.rows))
            else:
                self._order = np.arange(len(self.rows))
            self._order_epoch = self._epoch
        return self._order

    def next_batch(self) -> list[tuple[int, PromptRow]]:
        """The next `batch_size` (index into `rows`, row) pairs."""
        order = self._epoch_order()
        indices = order[self._position:self._position + self.batch_size].tolist()
        self._position += self.batch_size
        # Roll over as soon as no full batch is left, so `epoch` counts completed epochs.
        if self._position + self.batch_size > len(self.rows):
            self._epoch, self._position = self._epoch + 1, 0
        return [(i, self.rows[i]) for i in indices]

    def state_dict(self) -> dict:
        """Plain-JSON state; num_rows, seed and shuffle are kept to refuse resuming on other data."""
        return {"epoch": self._epoch, "position": self._position, "seed": self.seed,
                "num_rows": len(self.rows), "shuffle": self.shuffle}

    def load_state_dict(self, state: dict) -> None:
        """Continue from a state_dict(). The batch size may differ from the saved loader's: position
        counts rows, not batches."""
        for key, mine in (("num_rows", len(self.rows)), ("seed", self.seed), ("shuffle", self.shuffle)):
            if key in state and state[key] != mine:
                raise ValueError(f"cannot resume the prompt order: the checkpoint's {key} is {state[key]!r}, "
                                 f"this loader's is {mine!r}")
        epoch, position = int(state["epoch"]), int(state["position"])
        if epoch < 0 or not 0 <= position <= len(self.rows):
            raise ValueError(f"invalid prompt loader state: epoch {epoch}, position {position}")
        self._epoch, self._position = epoch, position
        if self._position + self.batch_size > len(self.rows):
            self._epoch, self._position = self._epoch + 1, 0
