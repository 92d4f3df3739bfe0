"""The end-of-run report: `report/report.md` with a summary table and plots, from `metrics.jsonl`, and
the same as one self-contained page, `report/report.html` (`report_html`).

It reads only the metrics file, so it can be rebuilt at any time, also for a run that was killed or
stopped: `rlboost report RUN_DIR`, or `rlboost.tracking.write_report(run_dir)`. Each plot is drawn once,
as a PNG beside report.md, and report.html embeds those same files. Plots are drawn on a bare
`matplotlib.figure.Figure` with the Agg canvas rather than through pyplot, so writing a report neither
needs a display nor switches the backend of a notebook that calls it.

Here the report is assembled; what it reads and summarises is `rlboost.tracking.report_data`, its plots
`rlboost.tracking.report_plots`.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from rlboost.tracking.report_data import HTML_REPORT, METRICS_FILE, REPORT_DIR, Rows, read_metrics, summary
from rlboost.tracking.report_html import write_html
from rlboost.tracking.report_plots import (plot_cost, plot_off_policy, plot_offload, plot_response_length,
                                           plot_reward, plot_spot, plot_time_breakdown, save_figure)

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def write_report(run_dir: Path, title: str = "") -> Path:
    """Write `run_dir/report/report.md`, its PNG plots and `report.html` (the same, plots inline) from
    `run_dir/metrics.jsonl`; return the markdown's path. Plots and summary rows whose metrics the run
    never logged are left out. Raises ValueError when the metrics file is missing or holds no metrics."""
    run_dir = Path(run_dir)
    path = run_dir / METRICS_FILE
    if not path.is_file():
        raise ValueError(f"no metrics to report: {path} does not exist")
    rows = read_metrics(path)
    if not any(rows.values()):
        raise ValueError(f"no metrics to report: {path} is empty (no line holds a metric)")

    out = run_dir / REPORT_DIR
    out.mkdir(parents=True, exist_ok=True)
    title, table = title or run_dir.name, summary(rows)
    intro = f"Built from {METRICS_FILE} ({len(rows)} logged steps)."
    lines = [f"# {title}", "", f"Built from `{METRICS_FILE}` ({len(rows)} logged steps).",
             "", "## Summary", "", "| metric | value |", "|---|---|"]
    lines += [f"| {name} | {value} |" for name, value in table]
    drawn: list[tuple[str, Path]] = []
    plots: list[tuple[str, str, Callable[[Rows], Figure | None]]] = [
        ("Reward", "reward.png", plot_reward),
        ("Response length", "response_length.png", plot_response_length),
        ("Time breakdown", "time_breakdown.png", plot_time_breakdown),
        ("Preemptible instances", "spot.png", plot_spot),
        ("Offload controller", "offload.png", plot_offload),
        ("Cost", "cost.png", plot_cost),
        ("Off-policy", "off_policy.png", plot_off_policy),
    ]
    for heading, file_name, plot in plots:
        figure = plot(rows)
        if figure is None:
            # A plot from an earlier report of this run would otherwise linger beside the new one.
            (out / file_name).unlink(missing_ok=True)
            continue
        save_figure(figure, out / file_name)
        drawn.append((heading, out / file_name))
        lines += ["", f"## {heading}", "", f"![{heading}]({file_name})"]
    report = out / "report.md"
    report.write_text("\n".join(lines) + "\n", encoding="utf-8")
    write_html(out / HTML_REPORT, title, intro, table, drawn)
    return report



__all__ = ["HTML_REPORT", "METRICS_FILE", "read_metrics", "write_report"]
