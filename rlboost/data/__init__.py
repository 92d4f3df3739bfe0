"""Prompt datasets: veRL-schema parquet/jsonl files, seeded built-in tasks, and the resumable train order."""

from rlboost.data.config import ArithmeticConfig, CountdownConfig, DataConfig
from rlboost.data.loading import PromptLoader, check_prompt_lengths, load_datasets
from rlboost.data.rows import DatasetError, PromptRow, read_rows, write_rows
from rlboost.data.tasks import TASKS, arithmetic_rows, countdown_rows, task_rows

__all__ = [
    "PromptRow", "DatasetError", "read_rows", "write_rows",
    "TASKS", "arithmetic_rows", "countdown_rows", "task_rows",
    "ArithmeticConfig", "CountdownConfig", "DataConfig",
    "load_datasets", "check_prompt_lengths", "PromptLoader",
]
