"""`MetricsTracker`: one `log(step, metrics)` call fans a step's metrics out to the configured sinks.

Sinks: `metrics.jsonl` (the durable record the report is built from), TensorBoard, W&B and the console
progress bar. Metric names follow veRL (`critic/score/mean`, `timing_s/step`, ...). Only the process
that owns the run (rank 0) should create a tracker.

Resuming: a run restarted from the checkpoint of step k passes `start_step=k`; the tracker drops the
metrics.jsonl lines of steps after k (they ran after the checkpoint and will run again) and hides
those steps' TensorBoard events, so neither holds two versions of a step.
"""

from __future__ import annotations

import json
import logging
import math
import numbers
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

from rlboost.tracking.config import TrackingConfig
from rlboost.tracking.progress import StepProgress
from rlboost.tracking.report import METRICS_FILE, write_report

logger = logging.getLogger(__name__)

TENSORBOARD_DIR = "tensorboard"


def to_float(name: str, value: Any) -> float:
    """A metric value as a Python float: numbers, numpy scalars, one-element arrays and tensors
    (`.item()`, which also brings a CUDA tensor to the host)."""
    if isinstance(value, numbers.Real):
        return float(value)
    item = getattr(value, "item", None)
    if callable(item):
        try:
            return float(item())
        except (TypeError, ValueError, RuntimeError):
            pass  # several elements, or not a number: reported below with the metric's name
    raise TypeError(f"metric {name!r} must be a scalar number, got {type(value).__name__}: {value!r:.80}")


def truncate_metrics(path: Path, last_step: int) -> None:
    """Rewrite the metrics.jsonl at `path` keeping only the lines of steps <= `last_step`, e.g. on
    resume from the checkpoint of `last_step`. Unreadable lines (a killed run's cut-off last line)
    are dropped too. The rewrite goes to a temporary file that replaces the original in one rename,
    so a crash midway leaves the old file whole. A missing file is left missing."""
    path = Path(path)
    if not path.exists():
        return
    tmp = path.with_name(path.name + ".tmp")
    with path.open(encoding="utf-8") as src, tmp.open("w", encoding="utf-8") as dst:
        for line in src:
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue
            step = record.get("step") if isinstance(record, dict) else None
            if isinstance(step, int) and step <= last_step:
                dst.write(line.rstrip("\n") + "\n")
        dst.flush()
        os.fsync(dst.fileno())
    os.replace(tmp, path)


class Sink(Protocol):
    def log(self, step: int, metrics: Mapping[str, float]) -> None: ...

    def close(self) -> None: ...


class JsonlSink:
    """Appends `{"step": step, **metrics}` as one line per call, flushed at once so a killed run keeps
    every step it logged. NaN and inf are written as null: JSON has no spelling for them, and the
    non-standard `NaN` that Python would write breaks jq and most other readers."""

    def __init__(self, path: Path):
        path.parent.mkdir(parents=True, exist_ok=True)
        # A run killed mid-write leaves a last line without its newline; appending to it would spoil
        # the first line of this run too.
        needs_newline = False
        if path.exists() and path.stat().st_size > 0:
            with path.open("rb") as existing:
                existing.seek(-1, os.SEEK_END)
                needs_newline = existing.read(1) != b"\n"
        self._file = path.open("a", encoding="utf-8")
        if needs_newline:
            self._file.write("\n")

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        record = {"step": step, **{k: (v if math.isfinite(v) else None) for k, v in metrics.items()}}
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()


class TensorBoardSink:
    """One scalar per metric under `<run_dir>/tensorboard/`, flushed every step."""

    def __init__(self, log_dir: Path, start_step: int):
        from torch.utils.tensorboard import SummaryWriter  # imported here: only this sink needs it

        # purge_step hides the events a killed run wrote after its last checkpoint (steps > start_step),
        # which would otherwise be drawn alongside the re-run steps.
        purge_step = start_step + 1 if start_step > 0 else None
        self._writer = SummaryWriter(log_dir=str(log_dir), purge_step=purge_step)

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        for name, value in metrics.items():
            self._writer.add_scalar(name, value, step)
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()


class WandbSink:
    """A Weights & Biases run in project `rlboost`, its files under `<run_dir>/wandb/`."""

    def __init__(self, run_dir: Path, run_name: str):
        import wandb

        self._run = wandb.init(project="rlboost", name=run_name or None, dir=str(run_dir))

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        self._run.log(dict(metrics), step=step)

    def close(self) -> None:
        self._run.finish()


class ConsoleSink:
    """The progress bar (or plain lines off a terminal), see `StepProgress`."""

    def __init__(self, config: TrackingConfig, total_steps: int, start_step: int):
        self._progress = StepProgress(total_steps, start_step, config.console_metrics)

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        self._progress.update(step, metrics)

    def status(self, text: str) -> None:
        self._progress.status(text)

    def close(self) -> None:
        self._progress.close()


class MetricsTracker:
    """Sends each step's metrics to the sinks named in `config.loggers`; on `close()` writes the report
    when `config.report` is set. Use as a context manager so sinks are closed (and the report written)
    also when training raises."""

    def __init__(self, run_dir: Path, config: TrackingConfig, total_steps: int, start_step: int = 0,
                 run_name: str = ""):
        config.validate()
        self.run_dir = Path(run_dir)
        self.config = config
        self.metrics_path = self.run_dir / METRICS_FILE
        self.report_path: Path | None = None
        self._closed = False
        self.run_dir.mkdir(parents=True, exist_ok=True)
        loggers = set(config.loggers)
        self._sinks: list[Sink] = []
        try:
            # Durable sinks first: if a later one raises in log(), the step is already on disk. The
            # console comes last so the live bar starts below whatever W&B prints when it starts.
            if "jsonl" in loggers:
                if start_step > 0:
                    truncate_metrics(self.metrics_path, start_step)
                self._sinks.append(JsonlSink(self.metrics_path))
            if "tensorboard" in loggers:
                self._sinks.append(TensorBoardSink(self.run_dir / TENSORBOARD_DIR, start_step))
            if "wandb" in loggers:
                self._sinks.append(WandbSink(self.run_dir, run_name or self.run_dir.name))
            if "console" in loggers:
                self._sinks.append(ConsoleSink(config, total_steps, start_step))
        except BaseException:
            try:
                self._close_sinks()
            except Exception:  # noqa: BLE001 - the error that stopped the start-up is the one to see
                pass
            raise

    def log(self, step: int, metrics: Mapping[str, Any]) -> None:
        """Record `metrics` (name -> scalar: float, int, numpy or torch scalar) for `step`."""
        if self._closed:
            raise RuntimeError("MetricsTracker.log() after close()")
        if "step" in metrics:
            raise ValueError("'step' is reserved for the step number; pass it as the step argument")
        values = {name: to_float(name, value) for name, value in metrics.items()}
        for sink in self._sinks:
            sink.log(step, values)

    def status(self, text: str) -> None:
        """What the step under way is doing, for the console (any thread; dropped elsewhere)."""
        for sink in self._sinks:
            if isinstance(sink, ConsoleSink):
                sink.status(text)

    def close(self) -> None:
        """Close every sink, then write the report if configured. Idempotent."""
        if self._closed:
            return
        self._closed = True
        try:
            self._close_sinks()
        finally:
            self._write_report()

    def _write_report(self) -> None:
        if self.config.report and self.metrics_path.is_file() and self.metrics_path.stat().st_size > 0:
            try:
                self.report_path = write_report(self.run_dir)
            except Exception:
                # The metrics are safe on disk and the report can be rebuilt from them; a plotting
                # failure must not turn a finished training run into a failed one.
                logger.warning("could not write the run report; rebuild it with "
                            "rlboost.tracking.write_report(%r)", str(self.run_dir), exc_info=True)

    def _close_sinks(self) -> None:
        # Close all of them even if one fails (the live bar must stop whatever W&B does), then raise
        # the first failure.
        error: BaseException | None = None
        for sink in self._sinks:
            try:
                sink.close()
            except Exception as e:  # noqa: BLE001 - re-raised below
                error = error or e
        self._sinks = []
        if error is not None:
            raise error

    def __enter__(self) -> MetricsTracker:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
