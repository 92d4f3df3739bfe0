"""The run report's plots, each on a bare `matplotlib.figure.Figure` with the Agg canvas (no pyplot: writing
a report needs no display and leaves a notebook's backend alone); None where the run never logged what a
plot shows. Drawn from `rlboost.tracking.report_data`'s rows."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from rlboost.tracking.report_data import (CAP, CAP_ADVISED, COLOCATED_EST, ESS, INSTANCES, INSTANCES_END, LENGTH,
                                          LENGTH_MAX, LENGTH_MIN, MIGRATED, PREEMPTIONS, PROVISION, PULL, SCORE,
                                          SEED_WINDOW, STALENESS, STALENESS_MAX, STEP_TIME, TIMING_PREFIX,
                                          TOKENS_PER_USD, TOTAL_USD, VAL_SCORE, WAIT_REMOTE, WAIT_TRAIN, WASTED, Rows,
                                          format_number, format_usd, series)

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

# Beyond this many steps, one bar per step is thinner than a pixel; the breakdown becomes an area plot.
_MAX_BARS = 100
# Markers make short runs (and a one-step run, which has no line to draw) visible; on long runs they
# would hide the line.
_MAX_MARKERS = 50


def _axes(title: str, ylabel: str) -> tuple[Figure, Axes]:
    from matplotlib.figure import Figure

    figure = Figure(figsize=(8, 4.5), dpi=120, layout="constrained")
    ax = figure.add_subplot()
    _style(ax, title, ylabel)
    return figure, ax


def _style(ax: Axes, title: str, ylabel: str) -> None:
    from matplotlib.ticker import MaxNLocator

    ax.set_title(title)
    ax.set_xlabel("step")
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def _single_step_axis(ax: Axes, steps: list[int]) -> None:
    """Over one step matplotlib would zoom to fractional steps (0.96 ... 1.04); show the step alone."""
    if steps and min(steps) == max(steps):
        ax.set_xlim(steps[0] - 1, steps[0] + 1)
        ax.set_xticks([steps[0]])


def save_figure(figure: Figure, path: Path) -> None:
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
    """Hybrid runs: preemptible instances at each step's start, and at its end (thin), under the
    controller's cap (dashed; dotted where it was only advised); steps with preemptions marked (with their count); the samples that
    migrated as bars on a second axis, with the tokens wasted by preemptions written over them."""
    steps, instances = series(rows, INSTANCES)
    if not steps:
        return None
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch
    from matplotlib.ticker import MaxNLocator

    figure, ax = _axes("Preemptible instances", "instances")
    ax.step(steps, instances, where="mid", color="tab:blue", label=INSTANCES)
    end_steps, ends = series(rows, INSTANCES_END)
    if ends:
        ax.plot(end_steps, ends, color="tab:cyan", linewidth=0.9, label=f"{INSTANCES_END} (step end)")
    cap_steps, caps = series(rows, CAP)
    if caps:
        ax.step(cap_steps, caps, where="mid", color="tab:gray", linestyle="--", linewidth=1.2, label=CAP)
    advised_steps, advised = series(rows, CAP_ADVISED)
    if advised:
        ax.step(advised_steps, advised, where="mid", color="tab:gray", linestyle=":", linewidth=1.2,
                label=f"{CAP_ADVISED} (not enforced)")
    hit = [(step, rows[step][PREEMPTIONS]) for step in steps if rows[step].get(PREEMPTIONS, 0) > 0]
    if hit:
        ax.scatter([s for s, _ in hit], [rows[s][INSTANCES] for s, _ in hit], marker="x", color="tab:red",
                   s=60, zorder=3, label=f"{PREEMPTIONS} (count)")
        for step, count in hit:
            ax.annotate(f"{count:g}", (step, rows[step][INSTANCES]), textcoords="offset points", xytext=(4, 6),
                        color="tab:red", fontsize="small")
    ax.set_ylim(bottom=0, top=max(instances + ends + caps + advised) + 1)
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    migrated_steps, migrated = series(rows, MIGRATED)
    wasted_steps, wasted = series(rows, WASTED)
    handles, labels = ax.get_legend_handles_labels()
    if migrated or any(w > 0 for w in wasted):
        twin = ax.twinx()
        # The instance lines and markers over the bars: the first axes drawn on top, see-through.
        ax.set_zorder(twin.get_zorder() + 1)
        ax.patch.set_visible(False)
        twin.set_ylabel("migrated samples")
        twin.set_ylim(bottom=0, top=max(migrated, default=0) * 1.25 or 1)
        twin.yaxis.set_major_locator(MaxNLocator(integer=True))
        if migrated:
            twin.bar(migrated_steps, migrated, width=0.6, alpha=0.25, color="tab:orange")
            handles.append(Patch(color="tab:orange", alpha=0.25))
            labels.append(MIGRATED)
        spilled = [(step, value) for step, value in zip(wasted_steps, wasted) if value > 0]
        if spilled:
            # Tokens and samples share no scale: the tokens are written over the bars, not drawn.
            if len(steps) <= _MAX_MARKERS:  # on long runs the numbers would pile up
                for step, value in spilled:
                    twin.annotate(format_number(value), (step, rows[step].get(MIGRATED, 0.0)),
                                  textcoords="offset points", xytext=(0, 2), ha="center", va="bottom",
                                  color="saddlebrown", fontsize="x-small")
                label = f"{WASTED} (over the bars; total {format_number(sum(wasted))})"
            else:
                label = f"{WASTED}: total {format_number(sum(wasted))} over {len(spilled)} steps"
            handles.append(Line2D([], [], linestyle="none", marker="$n$", color="saddlebrown"))
            labels.append(label)
    _single_step_axis(ax, steps)
    # Below the plot: at the top left it would hide the instance lines, which sit near the top.
    figure.legend(handles, labels, loc="outside lower center", ncols=2, fontsize="small")
    return figure


def plot_offload(rows: Rows) -> Figure | None:
    """Hybrid runs: the offload controller's seeding window T_seed per step with the idle times it
    balances (the trainer waiting for samples, the instances waiting for weights); below it, when the
    run pulled weights, the weight pull and instance provisioning times at the steps that had them."""
    seed_steps, seeds = series(rows, SEED_WINDOW)
    if not seed_steps:
        return None
    from matplotlib.figure import Figure

    weights = {name: [(s, v) for s, v in zip(*series(rows, name)) if v > 0] for name in (PULL, PROVISION)}
    weights = {name: points for name, points in weights.items() if points}
    figure = Figure(figsize=(8, 6.5 if weights else 4.5), dpi=120, layout="constrained")
    if weights:
        top, bottom = figure.subplots(2, 1, sharex=True, height_ratios=[3, 2])
    else:
        top, bottom = figure.add_subplot(), None
    _style(top, "Offload controller", "seconds")
    top.plot(seed_steps, seeds, color="black", marker=_marker(len(seed_steps)), markersize=3,
             label=f"{SEED_WINDOW} (T_seed)")
    for name, color in ((WAIT_TRAIN, "tab:red"), (WAIT_REMOTE, "tab:purple")):
        steps, values = series(rows, name)
        if values:
            top.plot(steps, values, color=color, linewidth=1.0, alpha=0.85, marker=_marker(len(steps)),
                     markersize=2, label=name)
    top.set_ylim(bottom=0)
    top.legend(loc="best", fontsize="small")
    shown = list(seed_steps)
    if bottom is not None:
        top.set_xlabel("")
        _style(bottom, "Weights (steps that pulled or provisioned)", "seconds")
        bottom.title.set_fontsize("medium")
        for (name, points), color in zip(weights.items(), ("tab:green", "tab:olive")):
            steps, values = [s for s, _ in points], [v for _, v in points]
            bottom.plot(steps, values, color=color, linewidth=0.8, alpha=0.8,
                        marker="o" if len(steps) <= _MAX_MARKERS else ".", markersize=3, label=name)
            shown += steps
        bottom.set_ylim(bottom=0)
        bottom.legend(loc="best", fontsize="small")
    _single_step_axis(top, shown)
    return figure


def plot_cost(rows: Rows) -> Figure | None:
    """Tokens per dollar per step as measured and, for hybrid runs, as estimated for a colocated run
    (the reserved GPUs alone at their measured seeding speed); the cumulative cost on a second axis."""
    steps, per_usd = series(rows, TOKENS_PER_USD)
    if not steps:
        return None
    from matplotlib.ticker import FuncFormatter

    figure, ax = _axes("Cost", "tokens per $")
    est_steps, estimated = series(rows, COLOCATED_EST)
    ax.plot(steps, per_usd, color="tab:blue", marker=_marker(len(steps)), markersize=3,
            label=f"{TOKENS_PER_USD} ({'hybrid, ' if estimated else ''}measured)")
    if estimated:
        ax.plot(est_steps, estimated, color="tab:gray", linestyle="--", marker=_marker(len(est_steps)),
                markersize=3, label=f"{COLOCATED_EST} (colocated, estimated)")
    ax.set_ylim(bottom=0)
    ax.yaxis.set_major_formatter(FuncFormatter(lambda value, _: format_number(value)))
    handles, labels = ax.get_legend_handles_labels()
    usd_steps, usd = series(rows, TOTAL_USD)
    if usd:
        twin = ax.twinx()
        twin.plot(usd_steps, usd, color="tab:green", linewidth=1.2, alpha=0.8, label=f"{TOTAL_USD} (cumulative)")
        twin.set_ylabel("total cost")
        twin.set_ylim(bottom=0, top=max(usd) * 1.1 or 1)
        twin.yaxis.set_major_formatter(FuncFormatter(lambda value, _: format_usd(value)))
        more_handles, more_labels = twin.get_legend_handles_labels()
        handles, labels = handles + more_handles, labels + more_labels
    _single_step_axis(ax, steps + est_steps + usd_steps)
    ax.legend(handles, labels, loc="lower right", fontsize="small")
    return figure


def plot_off_policy(rows: Rows) -> Figure | None:
    """How far off-policy each step trained: its tokens' staleness in versions (mean, and the worst token)
    and, on a second axis, the effective sample size of the behaviour weights (1: on-policy)."""
    steps, ess = series(rows, ESS)
    stale_steps, stale = series(rows, STALENESS)
    if not steps and not stale_steps:
        return None
    figure, ax = _axes("Off-policy", "staleness (versions)")
    handles = []
    if stale_steps:
        handles += ax.plot(stale_steps, stale, color="tab:blue", marker=_marker(len(stale_steps)), markersize=3,
                           label=STALENESS)
        max_steps, worst = series(rows, STALENESS_MAX)
        if worst:
            handles += ax.plot(max_steps, worst, color="tab:blue", linestyle=":", label=STALENESS_MAX)
        ax.set_ylim(bottom=0, top=max([1.0, *stale, *worst]) * 1.1)
    if steps:
        twin = ax.twinx()
        handles += twin.plot(steps, ess, color="tab:red", marker=_marker(len(steps)), markersize=3, label=ESS)
        twin.set_ylabel("effective sample size")
        twin.set_ylim(0, 1.05)
    _single_step_axis(ax, steps + stale_steps)
    ax.legend(handles, [h.get_label() for h in handles], loc="lower left", fontsize="small")
    return figure


def _colors(n: int) -> list:
    from matplotlib import colormaps

    cmap = colormaps["tab10" if n <= 10 else "tab20"]
    return [cmap(i % cmap.N) for i in range(n)]
