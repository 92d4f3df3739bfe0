"""Where a run's metrics go and what the console shows."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field

LOGGERS = ("console", "jsonl", "tensorboard", "wandb")


@dataclass
class TrackingConfig:
    loggers: list[str] = field(default_factory=lambda: ["console", "jsonl", "tensorboard"])
    """Sinks every step's metrics go to, any of: `console` (a progress bar with `console_metrics`, or one
    plain line per step when stdout is not a terminal), `jsonl` (`<run_dir>/metrics.jsonl`, one line per
    step), `tensorboard` (`<run_dir>/tensorboard/`), `wandb` (Weights & Biases, project `rlboost`; needs
    `pip install wandb`, checked when the config is validated)."""

    console_metrics: list[str] = field(default_factory=lambda: [
        "critic/score/mean", "response_length/mean", "val/score/mean", "spot/preemptions", "migration/samples",
        "timing_s/step"])
    """Metric names shown next to the progress bar, in this order, with short labels
    (`critic/score/mean` → `score`, `val/score/mean` → `val`, `timing_s/step` → `step …s`,
    `migration/samples` → `migrated`). The spot/migration ones appear in hybrid mode only.
    A metric a step did not log is left out of that step's line."""

    report: bool = True
    """When the run ends, write `<run_dir>/report/report.md` with plots (reward, response length, time
    breakdown, and preemptible instances in hybrid runs) built from `metrics.jsonl`; needs the `jsonl`
    logger, and the same as one page with the plots inline, `report.html`. `rlboost report RUN_DIR` (or
    `rlboost.tracking.write_report(run_dir)`) rebuilds both any time, also for a run that was stopped or killed."""

    def validate(self) -> None:
        """Raise ValueError naming the first invalid field."""
        unknown = [name for name in self.loggers if name not in LOGGERS]
        if unknown:
            raise ValueError(f"tracking.loggers: unknown logger(s) {', '.join(map(repr, unknown))}; "
                             f"valid: {', '.join(LOGGERS)}")
        # Checked here rather than at the first log() so a missing package fails the run before any
        # model is loaded, not after the first (possibly hour-long) step.
        if "wandb" in self.loggers and importlib.util.find_spec("wandb") is None:
            raise ValueError("tracking.loggers includes 'wandb' but the wandb package is not installed; "
                             "`pip install wandb` or remove 'wandb' from tracking.loggers")
        if self.report and "jsonl" not in self.loggers:
            raise ValueError("tracking.report needs 'jsonl' in tracking.loggers (the report is built from "
                             "metrics.jsonl); add it or set tracking.report=false")
        bad = [m for m in self.console_metrics if not isinstance(m, str) or not m]
        if bad:
            raise ValueError(f"tracking.console_metrics must be metric names, got {bad!r}")
