"""The command's tables and lines, whole wherever they land.

On a terminal, `print_output` prints as rich always has: tables boxed and fitted to the window. Off a
terminal (a CI log, `| tee`, a file) rich would assume 80 columns and squeeze a wide table into cells
cut with "…"; there it prints each table as a GitHub-markdown table instead: its title on a line above,
a header row, a `|---|` row, then every cell's full plain text (no ellipsis, no wrapping, no ANSI
codes, `|` escaped), and its caption below. Text is printed unwrapped. `log_for` does the same for
progress lines: `console.log` on a terminal, an unwrapped `[time] message` line off it.

A render's output may be a str, a `rich.table.Table`, any other renderable, or a list / `rich.console.Group`
of these. Imports rich only.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Iterable
from datetime import datetime
from itertools import zip_longest

from rich.console import Console, Group, RenderableType
from rich.table import Table
from rich.text import Text

_PLAIN_WIDTH = 100_000
"""Wide enough that no cell is ever wrapped while it is rendered to plain text."""


def _plain_console() -> Console:
    return Console(file=io.StringIO(), width=_PLAIN_WIDTH, color_system=None, no_color=True, force_terminal=False,
                   force_jupyter=False, highlight=False, legacy_windows=False)


def plain_text(cell: RenderableType | None, console: Console | None = None) -> str:
    """A cell's text on one line, as a table shows it: a str is read as markup (as rich.table reads it),
    a Text as its plain text, anything else rendered without colour; lines joined by spaces."""
    if cell is None:
        return ""
    if isinstance(cell, Text):
        text = cell.plain
    else:
        console = console or _plain_console()
        with console.capture() as capture:
            console.print(cell, end="")
        text = capture.get()
    return " ".join(line.strip() for line in text.splitlines() if line.strip())


def _row(cells: Iterable[str]) -> str:
    return "| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |"


def table_markdown(table: Table) -> str:
    """`table` as a GitHub-markdown table: title, blank line, header row, `|---|` row, the rows, caption."""
    console = _plain_console()
    header = [plain_text(column.header, console) for column in table.columns]
    columns = [list(column.cells) for column in table.columns]
    rows = [[plain_text(cell, console) for cell in row] for row in zip_longest(*columns, fillvalue="")]
    lines = [_row(header), "|" + "---|" * len(header), *(_row(row) for row in rows)]
    if table.title:
        lines = [plain_text(table.title, console), "", *lines]
    if table.caption:
        lines += ["", plain_text(table.caption, console)]
    return "\n".join(lines)


def _parts(output: object) -> list[object]:
    if isinstance(output, Group):
        return [part for item in output.renderables for part in _parts(item)]
    if isinstance(output, (list, tuple)):
        return [part for item in output for part in _parts(item)]
    return [output]


def print_output(console: Console, output: RenderableType | list | tuple) -> None:
    """Print a render's output: rich's layout on a terminal, markdown tables and unwrapped text off it.
    A str is printed as is (no markup: its brackets are data)."""
    for part in _parts(output):
        if console.is_terminal:
            console.print(part, markup=False) if isinstance(part, str) else console.print(part)
        elif isinstance(part, Table):
            console.print(table_markdown(part), markup=False, highlight=False, soft_wrap=True)
        else:
            console.print(part, markup=False, highlight=False, soft_wrap=True)


def print_line(console: Console, text: str) -> None:
    """One plain line (a path written, an error), never wrapped: a long path stays one line to copy."""
    console.print(text, markup=False, highlight=False, soft_wrap=True)


def log_for(console: Console) -> Callable[..., None]:
    """A bench's `log`: `console.log` on a terminal; off it, `[time] message` on one unwrapped line (rich
    would wrap it at 80 columns around its file:line column)."""
    if console.is_terminal:
        return console.log

    def log(*objects: object) -> None:
        console.print(datetime.now().strftime("[%X]"), *objects, markup=False, highlight=False, soft_wrap=True)

    return log


__all__ = ["log_for", "plain_text", "print_line", "print_output", "table_markdown"]
