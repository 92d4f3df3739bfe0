"""The command's tables read whole off a terminal (markdown, every header and cell full) and keep rich's
layout on one."""

from __future__ import annotations

import io

from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from rlboost.cli import main
from rlboost.sim.report import evaluate, render
from rlboost.sim.simulator import SimConfig
from rlboost.tables import log_for, print_output, table_markdown

LONG_HEADER = "a header far longer than eighty columns would ever leave room for in a squeezed rich table"
LONG_CELL = "a cell just as long, with a pipe | inside it that must not split the markdown row in two"


def long_table() -> Table:
    table = Table(title="a title that is long enough to wrap at eighty columns if anything wrapped it at all")
    table.add_column(LONG_HEADER)
    table.add_column(Text("tokens/s (a Text header)"), justify="right")
    table.add_column("")
    table.add_row(LONG_CELL, Text("123,456,789", style="bold"), "[bold]markup[/bold]")
    table.add_row("short", "1")  # a missing cell is blank, as rich shows it
    table.caption = "a caption below the table"
    return table


def printed(output, **console_kwargs) -> str:
    console = Console(file=io.StringIO(), **console_kwargs)
    print_output(console, output)
    return console.file.getvalue()


def table_rows(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("|")]


def cells_of(row: str) -> list[str]:
    """A markdown row's cells, an escaped `\\|` kept inside its cell."""
    return [c.strip().replace("\0", "|") for c in row.replace("\\|", "\0").strip("|").split("|")]


def test_off_a_terminal_a_table_is_markdown_with_every_cell_whole():
    out = printed(long_table())
    assert "…" not in out and "\x1b" not in out
    lines = out.splitlines()
    assert lines[0] == "a title that is long enough to wrap at eighty columns if anything wrapped it at all"
    assert lines[-1] == "a caption below the table"
    rows = table_rows(out)
    assert rows[1] == "|---|---|---|"
    assert {row.replace("\\|", "").count("|") for row in rows} == {4}
    assert cells_of(rows[0]) == [LONG_HEADER, "tokens/s (a Text header)", ""]
    assert cells_of(rows[2]) == [LONG_CELL, "123,456,789", "markup"]
    assert cells_of(rows[3]) == ["short", "1", ""]


def test_on_a_terminal_rich_lays_the_table_out():
    out = printed(long_table(), force_terminal=True, width=200)
    assert "┏" in out and "|---|" not in out
    assert LONG_HEADER in out


def test_groups_and_lists_print_each_part():
    other = Table(title="second")
    other.add_column("x")
    other.add_row("y")
    out = printed(Group(long_table(), "plain text [not markup]", [other]))
    assert [line for line in out.splitlines() if line.startswith("|---")] == ["|---|---|---|", "|---|"]
    assert "plain text [not markup]" in out
    assert "| y |" in out


def test_long_text_is_not_wrapped_off_a_terminal():
    line = "| " + " | ".join(f"column {i}" for i in range(20)) + " |"
    assert printed(line).splitlines() == [line]


def test_log_lines_are_not_wrapped_off_a_terminal():
    console = Console(file=io.StringIO())
    message = " ".join(["a progress line [not markup]"] * 10)
    log_for(console)(message)
    [line] = console.file.getvalue().splitlines()
    assert line.startswith("[") and line.endswith(message)


def test_the_simulate_table_in_markdown_holds_every_model_and_policy():
    result, _ = evaluate(SimConfig(duration_s=600), ["qwen3-8b"], "A", ("verl", "rlboost", "rlboost-nomemory"))
    text = table_markdown(render(result))
    rows = table_rows(text)
    assert cells_of(rows[0]) == ["model", "segment", "policy", "tokens/s", "vs verl", "tokens/$", "vs verl",
                                 "worst step", "instances", "preemptions", "paper"]
    assert len({row.count("|") for row in rows}) == 1
    assert {cells_of(row)[2] for row in rows[2:]} == {"verl", "rlboost", "rlboost-nomemory"}
    assert all(cells_of(row)[0] == "qwen3-8b" for row in rows[2:])
    assert "1.66x / 1.34x" in text and "…" not in text


def test_rlboost_simulate_off_a_terminal_prints_whole_columns(tmp_path, capsys):
    assert main(["simulate", "--models", "qwen3-8b", "--segments", "A", "--plots", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "…" not in out and "\x1b" not in out
    assert "simulated runs, relative to veRL (colocated) on the same model and trace window" in out
    assert ("| model | segment | policy | tokens/s | vs verl | tokens/$ | vs verl | worst step | instances "
            "| preemptions | paper |") in out
    assert "| qwen3-8b | avg | rlboost-nomemory |" in out
    assert f"wrote {tmp_path / 'relative.png'}" in out
