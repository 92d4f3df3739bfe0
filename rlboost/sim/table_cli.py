"""What the simulator's doc-table commands (`patch_table`, `histospec_table`) share: reading a list
of numbers from a flag, checking every config before the first run, and printing the table and its
JSON. Pure apart from the print and the file it is asked to write."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterable
from dataclasses import replace
from pathlib import Path

from rlboost.sim.simulator import SimConfig


def numbers(text: str, flag: str, unit: str) -> list[float]:
    """`text` split at commas; a part that is not a number is a ValueError naming `flag`."""
    out = []
    for part in text.split(","):
        try:
            out.append(float(part))
        except ValueError:
            raise ValueError(f"{flag}: {part!r} is not a number of {unit}") from None
    return out


def validate_each(configs: Iterable[SimConfig], models: Iterable[str]) -> None:
    """Every config with every model checked before the first run: a bad value fails in a second, not
    after minutes of simulating the others (ValueError naming the key)."""
    models = list(models)
    for cfg in configs:
        for model in models:
            replace(cfg, model=model).validate()


def run_and_print(make_rows: Callable[[], list[dict]], markdown: Callable[[list[dict]], str],
                  json_path: str | None, **extra) -> int:
    """The command's exit status: 2 with one line on stderr for a ValueError, otherwise the table on
    stdout and, with `json_path`, `{**extra, "rows": rows}` written there."""
    try:
        rows = make_rows()
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(markdown(rows))
    if json_path:
        Path(json_path).write_text(json.dumps({**extra, "rows": rows}, indent=2) + "\n")
    return 0


__all__ = ["numbers", "run_and_print", "validate_each"]
