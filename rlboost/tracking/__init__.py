"""Run tracking: per-step metrics to console, JSONL, TensorBoard and W&B; the end-of-run report.

Files: config (`TrackingConfig`), sinks (`MetricsTracker` and the sinks it fans out to), progress
(the console progress bar), report (`report/report.md` and plots from `metrics.jsonl`), report_html (the
same as one self-contained page).
"""

from rlboost.tracking.config import TrackingConfig
from rlboost.tracking.progress import StepProgress
from rlboost.tracking.report import read_metrics, write_report
from rlboost.tracking.sinks import MetricsTracker, truncate_metrics

__all__ = ["TrackingConfig", "MetricsTracker", "StepProgress", "truncate_metrics", "write_report",
           "read_metrics"]
