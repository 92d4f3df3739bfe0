"""Prompt rows in veRL's dataset schema, read from and written to parquet or jsonl files."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

SUFFIXES = (".parquet", ".jsonl")
REQUIRED_COLUMNS = ("data_source", "prompt", "reward_model")
CHAT_MESSAGES = 'a non-empty list of chat messages [{"role": ..., "content": ...}]'


@dataclass
class PromptRow:
    data_source: str
    """Which dataset the row comes from (`arithmetic`, `countdown`, `openai/gsm8k`, ...); the reward
    function dispatches on it."""

    prompt: list[dict]
    """Chat messages, e.g. [{"role": "user", "content": "..."}], rendered with the model's chat template."""

    ability: str = ""
    """Free-form skill label (veRL's `ability`, e.g. `math`); informational."""

    ground_truth: Any = None
    """What the reward function checks the response against (veRL: `reward_model.ground_truth`)."""

    reward_style: str = "rule"
    """veRL's `reward_model.style`; informational."""

    extra_info: dict = field(default_factory=dict)
    """Anything else the reward function may want (veRL: `extra_info`), passed to it as is."""

    origin: str = field(default="", compare=False, repr=False)
    """Where the row came from (`train.parquet row 12 (0-based)`), so later errors about it can name it.
    Not part of the veRL row."""

    def to_verl(self) -> dict:
        """The row as veRL stores it in its parquet files."""
        return {
            "data_source": self.data_source,
            "prompt": self.prompt,
            "ability": self.ability,
            "reward_model": {"style": self.reward_style, "ground_truth": self.ground_truth},
            "extra_info": self.extra_info,
        }


class DatasetError(ValueError):
    """A dataset file that cannot be used; the message names the file and, where it applies, the row
    (0-based) and the column."""

    def __init__(self, message: str, *, path: str | Path | None = None, row: int | None = None,
                 column: str | None = None):
        super().__init__(message)
        self.path, self.row, self.column = path, row, column


def _where(path: Path, row: int, line: int | None = None) -> str:
    # jsonl rows are numbered without blank lines, so the editor's line number is given as well.
    at_line = f", line {line}" if line is not None and line != row + 1 else ""
    return f"{path} row {row} (0-based{at_line})"


def _bad(path: Path, row: int, column: str, problem: str, line: int | None = None) -> DatasetError:
    return DatasetError(f"{_where(path, row, line)}, column {column!r}: {problem}",
                        path=path, row=row, column=column)


def _check_suffix(path: Path) -> None:
    if path.suffix not in SUFFIXES:
        raise DatasetError(f"{path}: unsupported dataset file type {path.suffix or '(no suffix)'!r}; "
                           f"use one of {', '.join(SUFFIXES)}", path=path)


def _row_from_verl(record: Any, path: Path, row: int, line: int | None = None) -> PromptRow:
    """Validate one veRL row (plain Python values) and turn it into a PromptRow."""
    def bad(column: str, problem: str) -> DatasetError:
        return _bad(path, row, column, problem, line)

    if not isinstance(record, dict):
        raise bad("(row)", f"a row must be a JSON object, got {type(record).__name__}")
    for column in REQUIRED_COLUMNS:
        if column not in record:
            raise bad(column, "missing")

    data_source = record["data_source"]
    if not isinstance(data_source, str) or not data_source:
        raise bad("data_source", f"must be a non-empty string, got {data_source!r}")

    prompt = record["prompt"]
    if isinstance(prompt, str):
        raise bad("prompt", f"is a plain string; it must be {CHAT_MESSAGES}")
    if not isinstance(prompt, list) or not prompt:
        raise bad("prompt", f"must be {CHAT_MESSAGES}, got {prompt!r:.80}")
    for i, message in enumerate(prompt):
        if not isinstance(message, dict):
            raise bad("prompt", f"message {i} must be a dict with `role` and `content`, got {message!r:.80}")
        for key in ("role", "content"):
            if not isinstance(message.get(key), str):
                raise bad("prompt", f"message {i} needs a string `{key}`, got {message.get(key)!r:.80}")

    reward_model = record["reward_model"]
    if not isinstance(reward_model, dict):
        raise bad("reward_model", f"must be a dict with `ground_truth`, got {reward_model!r:.80}")
    if reward_model.get("ground_truth") is None:
        # The built-in rewards all need it; a custom reward that does not can be given "".
        raise bad("reward_model.ground_truth", "missing or null")
    style = reward_model.get("style")
    if style is None:
        style = "rule"
    if not isinstance(style, str):
        raise bad("reward_model.style", f"must be a string, got {style!r:.80}")

    ability = record.get("ability")
    if ability is None:
        ability = ""
    if not isinstance(ability, str):
        raise bad("ability", f"must be a string, got {ability!r:.80}")
    extra_info = record.get("extra_info")
    if extra_info is None:
        extra_info = {}
    if not isinstance(extra_info, dict):
        raise bad("extra_info", f"must be a dict, got {extra_info!r:.80}")

    return PromptRow(data_source=data_source, prompt=prompt, ability=ability,
                     ground_truth=reward_model["ground_truth"], reward_style=style,
                     extra_info=extra_info, origin=_where(path, row, line))


def _read_parquet(path: Path) -> list[PromptRow]:
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
    except Exception as e:  # pyarrow's errors do not say which file
        raise DatasetError(f"{path}: not a readable parquet file ({type(e).__name__}: {e})", path=path) from e
    if table.num_rows == 0:
        return []  # an empty table written by pyarrow has no columns at all
    for column in REQUIRED_COLUMNS:
        if column not in table.column_names:
            raise DatasetError(f"{path}: missing column {column!r} (has {', '.join(table.column_names)})",
                               path=path, column=column)
    # to_pylist() gives plain Python lists and dicts, never numpy arrays.
    return [_row_from_verl(record, path, i) for i, record in enumerate(table.to_pylist())]


def _read_jsonl(path: Path) -> list[PromptRow]:
    rows = []
    with open(path, encoding="utf-8") as f:
        for line_number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                raise _bad(path, len(rows), "(row)", f"invalid JSON: {e}", line_number) from e
            rows.append(_row_from_verl(record, path, len(rows), line_number))
    return rows


def read_rows(path: str | Path) -> list[PromptRow]:
    """Read and validate a veRL-schema `.parquet` or `.jsonl` file; DatasetError names what is wrong."""
    path = Path(path)
    _check_suffix(path)
    if not path.is_file():
        raise DatasetError(f"{path}: dataset file not found", path=path)
    return _read_parquet(path) if path.suffix == ".parquet" else _read_jsonl(path)


def write_rows(rows: Iterable[PromptRow], path: str | Path) -> None:
    """Write rows in veRL's schema to a `.parquet` or `.jsonl` file (parent folders are created)."""
    path = Path(path)
    _check_suffix(path)
    records = [row.to_verl() for row in rows]
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".jsonl":
        with open(path, "w", encoding="utf-8") as f:
            for record in records:
                f.write(json.dumps(record, ensure_ascii=False) + "\n")
        return

    import pyarrow as pa
    import pyarrow.parquet as pq

    if records and all(not r["extra_info"] for r in records):
        # Parquet cannot store a struct without fields; read_rows defaults a missing extra_info to {}.
        for r in records:
            del r["extra_info"]
    try:
        table = pa.Table.from_pylist(records)
    except (pa.ArrowInvalid, pa.ArrowTypeError) as e:
        raise DatasetError(f"{path}: rows cannot share one parquet schema ({e}); mixed types in a column "
                           f"(e.g. ground_truth a string in one row and a dict in another) need .jsonl",
                           path=path) from e
    pq.write_table(table, path)
