"""The end-of-run report: `report/report.md` with a summary table and plots, from `metrics.jsonl`.

It reads only the metrics file, so it can be rebuilt at any time, also for a run that was killed:
`rlboost.tracking.write_report(run_dir)`. Plots are drawn on a bare `matplotlib.figure.Figure` with
the Agg canvas rather than through pyplot, so writing a report neither needs a display nor switches
the backend of a notebook that calls it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

METRICS_FILE = "metrics.jsonl"
REPORT_DIR = "report"

SCORE = "critic/score/mean"
VAL_SCORE = "val/score/mean"
LENGTH = "response_length/mean"
LENGTH_MAX = "response_length/max"
LENGTH_MIN = "response_length/min"
STEP_TIME = "timing_s/step"
INSTANCES = "spot/instances"
PREEMPTIONS = "spot/preemptions"
MIGRATED = "migration/samples"
TIMING_PREFIX = "timing_s/"
THROUGHPUT = "perf/throughput"

# Beyond this many steps, one bar per step is thinner than a pixel; the breakdown becomes an area plot.
_MAX_BARS = 100
# Markers make short runs (and a one-step run, which has no line to draw) visible; on long runs they
# would hide the line.
_MAX_MARKERS = 50

Rows = dict[int, dict[str, float]]


def read_metrics(path: Path) -> Rows:
    """Metrics per step, in step order, from a metrics.jsonl.

    Lines of the same step are merged, later values winning: validation may be logged in its own call,
    and a step re-run after a restart replaces the earlier attempt. A line that is not a JSON object
    with an integer `step` (the cut-off last line of a killed run) is skipped, and so is a value that
    is not a finite number (the tracker writes NaN and inf as null)."""
    rows: Rows = {}
    with Path(path).open(encoding="utf-8") as lines:
        for line in lines:
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue
            if not isinstance(record, dict) or not isinstance(record.get("step"), int):
                continue
            step = record.pop("step")
            values = {k: float(v) for k, v in record.items()
                      if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)}
            rows.setdefault(step, {}).update(values)
    return dict(sorted(rows.items()))


def write_report(run_dir: Path, title: str = "") -> Path:
    """Write `run_dir/report/report.md` and its PNG plots from `run_dir/metrics.jsonl`; return the
    markdown's path. Plots and summary rows whose metrics the run never logged are left out.
    Raises ValueError when the metrics file is missing or holds no metrics."""
    run_dir = Path(run_dir)
    path = run_dir / METRICS_FILE
    if not path.is_file():
        raise ValueError(f"no metrics to report: {path} does not exist")
    rows = read_metrics(path)
    if not any(rows.values()):
        raise ValueError(f"no metrics to report: {path} is empty (no line holds a metric)")

    out = run_dir / REPORT_DIR
    out.mkdir(parents=True, exist_ok=True)
    lines = [f"# {title or run_dir.name}", "", f"Built from `{METRICS_FILE}` ({len(rows)} logged steps).",
             "", "## Summary", "", "| metric | value |", "|---|---|"]
    lines += [f"| {name} | {value} |" for name, value in summary(rows)]
    plots: list[tuple[str, str, Callable[[Rows], Figure | None]]] = [
        ("Reward", "reward.png", plot_reward),
        ("Response length", "response_length.png", plot_response_length),
        ("Time breakdown", "time_breakdown.png", plot_time_breakdown),
        ("Preemptible instances", "spot.png", plot_spot),
    ]
    for heading, file_name, plot in plots:
        figure = plot(rows)
        if figure is None:
            # A plot from an earlier report of this run would otherwise linger beside the new one.
            (out / file_name).unlink(missing_ok=True)
            continue
        _save(figure, out / file_name)
        lines += ["", f"## {heading}", "", f"![{heading}]({file_name})"]
    report = out / "report.md"
    report.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return report


# ---- summary -------------------------------------------------------------------------------------

def series(rows: Rows, name: str) -> tuple[list[int], list[float]]:
    """The steps that logged `name`, and its values there."""
    steps = [step for step, values in rows.items() if name in values]
    return steps, [rows[step][name] for step in steps]


def format_number(value: float) -> str:
    """Four significant digits; thousands and above as grouped integers (12,346)."""
    return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.4g}"


def summary(rows: Rows) -> list[tuple[str, str]]:
    """(metric, value) rows of the report's summary table."""
    table = []
    # Steps that trained: a step that only logged validation (veRL's step 0 before training) is not one.
    trained = [step for step, values in rows.items() if any(not k.startswith("val/") for k in values)]
    if trained:
        table.append(("steps", f"{len(trained)} ({trained[0]}–{trained[-1]})"))
    for name in (SCORE, VAL_SCORE):
        steps, values = series(rows, name)
        if values:
            best = max(range(len(values)), key=values.__getitem__)
            table.append((name, f"first {format_number(values[0])} · last {format_number(values[-1])} · "
                                f"best {format_number(values[best])} (step {steps[best]})"))
    _, step_times = series(rows, STEP_TIME)
    if step_times:
        total = sum(step_times)
        table.append(("mean step time", f"{format_number(total / len(step_times))} s"))
        table.append(("total wall time", f"{format_number(total)} s ({timedelta(seconds=round(total))})"))
    _, throughput = series(rows, THROUGHPUT)
    if throughput:
        table.append((f"mean {THROUGHPUT}", f"{format_number(sum(throughput) / len(throughput))} tokens/s"))
    return table


# ---- plots ---------------------------------------------------------------------------------------

def _axes(title: str, ylabel: str) -> tuple[Figure, Axes]:
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    figure = Figure(figsize=(8, 4.5), dpi=120, layout="constrained")
    ax = figure.add_subplot()
    ax.set_title(title)
    ax.set_xlabel("step")
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    return figure, ax


def _single_step_axis(ax: Axes, steps: list[int]) -> None:
    """Over one step matplotlib would zoom to fractional steps (0.96 ... 1.04); show the step alone."""
    if steps and min(steps) == max(steps):
        ax.set_xlim(steps[0] - 1, steps[0] + 1)
        ax.set_xticks([steps[0]])


def _save(figure: Figure, path: Path) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(figure)
    figure.savefig(path)


def _marker(n: int) -> str | None:
    return "o" if n <= _MAX_MARKERS else None


def plot_reward(rows: Rows) -> Figure | None:
    """Training score per step, with the validation score's points where it was measured."""
    steps, scores = series(rows, SCORE)
    val_steps, val_scores = series(rows, VAL_SCORE)
    if not scores and not val_scores:
        return None
    figure, ax = _axes("Reward", "score")
    if scores:
        ax.plot(steps, scores, marker=_marker(len(steps)), markersize=3, label=f"{SCORE} (train)")
    if val_scores:
        ax.plot(val_steps, val_scores, linestyle="--", marker="D", markersize=5,
                label=f"{VAL_SCORE} (validation)")
    _single_step_axis(ax, steps + val_steps)
    ax.legend(loc="best")
    return figure


def plot_response_length(rows: Rows) -> Figure | None:
    """Mean response length per step, with the min–max range as a band where both were logged."""
    steps, means = series(rows, LENGTH)
    band = [step for step, values in rows.items() if LENGTH_MAX in values and LENGTH_MIN in values]
    if not means and not band:
        return None
    figure, ax = _axes("Response length", "tokens")
    if band:
        lows, highs = [rows[s][LENGTH_MIN] for s in band], [rows[s][LENGTH_MAX] for s in band]
        if len(band) == 1:  # a band over one step has no area; draw its range as a bar
            ax.vlines(band, lows, highs, alpha=0.4, linewidth=6, label="min–max")
        else:
            ax.fill_between(band, lows, highs, alpha=0.2, label="min–max")
    else:  # only one bound logged: show it as a line
        for bound in (LENGTH_MAX, LENGTH_MIN):
            bound_steps, bound_values = series(rows, bound)
            if bound_values:
                ax.plot(bound_steps, bound_values, linestyle=":", marker=_marker(len(bound_steps)),
                        markersize=3, label=bound)
    if means:
        ax.plot(steps, means, marker=_marker(len(steps)), markersize=3, label=LENGTH)
    _single_step_axis(ax, steps + band)
    ax.legend(loc="best")
    return figure


def plot_time_breakdown(rows: Rows) -> Figure | None:
    """Each `timing_s/*` phase per step, stacked, with the whole step's time over them. Phases that
    overlap (one nested in another) stack above the step line; that is the data, not a bug."""
    phases = list(dict.fromkeys(k for values in rows.values() for k in values
                                if k.startswith(TIMING_PREFIX) and k != STEP_TIME))
    steps = [step for step, values in rows.items() if any(k.startswith(TIMING_PREFIX) for k in values)]
    if not steps:
        return None
    figure, ax = _axes("Time per step", "seconds")
    if phases:
        colors = _colors(len(phases))
        stack = [[rows[step].get(phase, 0.0) for step in steps] for phase in phases]
        labels = [phase.removeprefix(TIMING_PREFIX) for phase in phases]
        if len(steps) <= _MAX_BARS:
            bottom = [0.0] * len(steps)
            for label, heights, color in zip(labels, stack, colors):
                ax.bar(steps, heights, bottom=bottom, width=0.8, label=label, color=color, linewidth=0)
                bottom = [b + h for b, h in zip(bottom, heights)]
        else:
            ax.stackplot(steps, stack, labels=labels, colors=colors, alpha=0.85)
    step_steps, step_times = series(rows, STEP_TIME)
    if step_times:
        ax.plot(step_steps, step_times, color="black", marker=_marker(len(step_steps)), markersize=3,
                label="step (total)")
    _single_step_axis(ax, steps)
    # Legend top to bottom as the stack reads on the plot: the total, then the phases from the top down.
    handles, labels = ax.get_legend_handles_labels()
    order = sorted(range(len(labels)), key=lambda i: (labels[i] != "step (total)", -i))
    ax.legend([handles[i] for i in order], [labels[i] for i in order], loc="upper left",
              bbox_to_anchor=(1.01, 1.0), fontsize="small")
    return figure


def plot_spot(rows: Rows) -> Figure | None:
    """Hybrid runs: preemptible instances at each step's start, steps with preemptions marked (with
    their count), and the samples that migrated, on a second axis."""
    steps, instances = series(rows, INSTANCES)
    if not steps:
        return None
    figure, ax = _axes("Preemptible instances", "instances")
    ax.step(steps, instances, where="mid", color="tab:blue", label=INSTANCES)
    hit = [(step, rows[step][PREEMPTIONS]) for step in steps if rows[step].get(PREEMPTIONS, 0) > 0]
    if hit:
        ax.scatter([s for s, _ in hit], [rows[s][INSTANCES] for s, _ in hit], marker="x", color="tab:red",
                   s=60, zorder=3, label=f"{PREEMPTIONS} (count)")
        for step, count in hit:
            ax.annotate(f"{count:g}", (step, rows[step][INSTANCES]), textcoords="offset points", xytext=(4, 6),
                        color="tab:red", fontsize="small")
    ax.set_ylim(bottom=0, top=max(instances) + 1)
    from matplotlib.ticker import MaxNLocator

    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    migrated_steps, migrated = series(rows, MIGRATED)
    handles, labels = ax.get_legend_handles_labels()
    if migrated:
        twin = ax.twinx()
        twin.bar(migrated_steps, migrated, width=0.6, alpha=0.25, color="tab:orange")
        twin.set_ylabel("migrated samples")
        from matplotlib.patches import Patch

        handles.append(Patch(color="tab:orange", alpha=0.25))
        labels.append(MIGRATED)
    _single_step_axis(ax, steps)
    ax.legend(handles, labels, loc="upper left", fontsize="small")
    return figure


def _colors(n: int) -> list:
    from matplotlib import colormaps

    cmap = colormaps["tab10" if n <= 10 else "tab20"]
    return [cmap(i % cmap.N) for i in range(n)]

