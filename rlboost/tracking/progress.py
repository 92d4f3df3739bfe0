"""The console sink: a progress bar over training steps with the latest metrics beside it.

On a terminal it is a live `rich` bar with a line under it saying what the step under way is doing
(`status`), redrawn twice a second:
`train ━━━━━╸━━━ 3/10 0:00:09 0:00:21 score 0.42 · len 57.1 · val 0.38 · step 3.2s`
`  step 4: offloaded · 41/64 samples · instances 3 serving, 1 booting · 812 tok/s · 0 tokens lost`.
Anywhere else (CI, tests, `| tee`, a log file) a live bar would fill the log with redraw escape codes,
so it prints one plain line per step instead: `step 3/10  score 0.42  len 57.1  val 0.38  step 3.2s`,
and the step's status as a plain line at most every `status_every_s` seconds.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Mapping, Sequence

from rich.console import Console
from rich.progress import (BarColumn, MofNCompleteColumn, Progress, ProgressColumn, Task, TextColumn,
                           TimeElapsedColumn)
from rich.text import Text

# A trailing aggregate is dropped from a label ("critic/score/mean" -> "score"); the mean is the
# default reading, other aggregates stay visible ("response_length/max" -> "len max").
_AGGREGATES = {"mean", "max", "min", "std", "sum"}
_ALIASES = {"response_length": "len", "prompt_length": "prompt", "throughput": "tok/s", "samples": "migrated"}
# veRL names times in seconds under timing_s/; the label gets the unit so "step 3.2s" reads as a time.
_SECONDS_PREFIX = "timing_s/"


def short_label(name: str) -> str:
    """A compact label for a metric name: its last path component without a trailing aggregate, with
    a few aliases, `val` kept as a prefix (`val/score/mean` -> `val`, `val/acc` -> `val acc`)."""
    parts = [p for p in name.split("/") if p] or [name]
    is_val = len(parts) > 1 and (parts[0] == "val" or parts[0].startswith("val-"))
    if is_val:
        parts = parts[1:]
    aggregate = parts.pop() if len(parts) > 1 and parts[-1] in _AGGREGATES else None
    label = _ALIASES.get(parts[-1], parts[-1])
    if aggregate not in (None, "mean"):
        label = f"{label} {aggregate}"
    if is_val:
        label = "val" if label == "score" else f"val {label}"
    return label


def metric_labels(names: Sequence[str]) -> dict[str, str]:
    """`short_label` of each name, in order; names whose short labels collide keep their full name."""
    labels = {name: short_label(name) for name in dict.fromkeys(names)}
    counts: dict[str, int] = {}
    for label in labels.values():
        counts[label] = counts.get(label, 0) + 1
    return {name: (label if counts[label] == 1 else name) for name, label in labels.items()}


def format_value(value: float) -> str:
    """A number in at most ~5 characters: 0.42, 57.1, 1234, 12.3k, 1.5e-05."""
    if not math.isfinite(value):
        return str(value)
    magnitude = abs(value)
    if magnitude >= 1e6:
        return f"{value / 1e6:.1f}M"
    if magnitude >= 1e4:
        return f"{value / 1e3:.1f}k"
    if magnitude >= 100:
        return f"{value:.0f}"
    if magnitude == 0:
        return "0"
    if magnitude < 1e-3:
        return f"{value:.1e}"
    return f"{value:.3g}"


def format_metrics(labels: Mapping[str, str], values: Mapping[str, float], sep: str) -> str:
    """`label value` for each labelled metric present in `values`, joined by `sep`."""
    shown = []
    for name, label in labels.items():
        if name in values:
            unit = "s" if name.startswith(_SECONDS_PREFIX) else ""
            shown.append(f"{label} {format_value(values[name])}{unit}")
    return sep.join(shown)


class _CountdownColumn(ProgressColumn):
    """Time left, from the mean step time of this session.

    rich's own estimate averages over the last 30 s of updates, which holds no two samples when a
    step takes minutes, so it would show nothing; and a resumed run must not count the steps it
    started with as done in no time. Between steps the estimate counts down from the last update."""

    max_refresh = 0.5

    def render(self, task: Task) -> Text:
        eta, at = task.fields.get("eta_s"), task.fields.get("eta_at")
        if task.finished:
            return Text("0:00:00", style="progress.remaining")
        if eta is None or at is None or task.elapsed is None:
            return Text("-:--:--", style="progress.remaining")
        left = max(0, int(eta - (task.elapsed - at)))
        hours, rest = divmod(left, 3600)
        return Text(f"{hours}:{rest // 60:02d}:{rest % 60:02d}", style="progress.remaining")


class _ProgressWithStatus(Progress):
    """rich's Progress with one line of text under its bars."""

    status = ""

    def get_renderables(self):
        yield self.make_tasks_table(self.tasks)
        if self.status:
            yield Text(self.status, no_wrap=True, overflow="ellipsis", style="dim")


class StepProgress:
    """Progress over steps `start_step+1 .. total_steps` with `metrics` shown beside it.

    `live=None` picks the live bar exactly when the console writes to a terminal (rich's detection,
    which also honours FORCE_COLOR / TTY_COMPATIBLE); otherwise one plain line per `update`."""

    def __init__(self, total_steps: int, start_step: int = 0, metrics: Sequence[str] = (), *,
                 description: str = "train", live: bool | None = None, console: Console | None = None,
                 status_every_s: float = 15.0):
        self.total_steps = total_steps
        self.status_every_s = status_every_s
        self._status_printed = -math.inf
        self.start_step = start_step
        self._labels = metric_labels(metrics)
        # Latest value of each shown metric, kept across steps: a validation score logged every N
        # steps stays beside the bar instead of flickering for one step.
        self._latest: dict[str, float] = {}
        self._console = console or Console()
        self.live = self._console.is_terminal if live is None else live
        self._progress: Progress | None = None
        if self.live:
            self._progress = _ProgressWithStatus(
                TextColumn("[progress.description]{task.description}"), BarColumn(), MofNCompleteColumn(),
                TimeElapsedColumn(), _CountdownColumn(),
                TextColumn("{task.fields[metrics]}", markup=False),
                console=self._console, refresh_per_second=2)
            self._task = self._progress.add_task(description, total=total_steps, completed=start_step,
                                                 metrics="", eta_s=None, eta_at=None)
            self._progress.start()

    def update(self, step: int, metrics: Mapping[str, float]) -> None:
        """Show that `step` is done, with its metrics."""
        if self._progress is None:
            text = format_metrics(self._labels, metrics, "  ")
            # print() resolves sys.stdout now, so redirections (pytest's capture, contextlib) are honoured.
            print(f"step {step}/{self.total_steps}" + (f"  {text}" if text else ""), file=sys.stdout,
                  flush=True)
            return
        self._latest.update((k, v) for k, v in metrics.items() if k in self._labels)
        task = self._progress.tasks[0]
        done, elapsed = step - self.start_step, task.elapsed or 0.0
        eta = elapsed / done * max(self.total_steps - step, 0) if done > 0 else None
        self._progress.update(self._task, completed=step, eta_s=eta, eta_at=elapsed,
                              metrics=format_metrics(self._labels, self._latest, " · "))

    def status(self, text: str) -> None:
        """What the step under way is doing (any thread): the line under the live bar, or a plain line
        at most every `status_every_s` seconds off a terminal ("" clears it)."""
        progress = self._progress
        if progress is not None:
            progress.status = text
            return
        now = time.monotonic()
        if text and now - self._status_printed >= self.status_every_s:
            self._status_printed = now
            print(f"  {text}", file=sys.stdout, flush=True)

    def close(self) -> None:
        """Stop the live bar, leaving its last state on screen. Idempotent."""
        if self._progress is not None:
            self._progress.status = ""
            self._progress.stop()
            self._progress = None
