"""What the run report is made of: the metric names it reads from `metrics.jsonl`, the file read into
rows per step, and the summary table with its number formats (`rlboost.tracking.report` writes the report;
`rlboost.tracking.report_plots` draws its plots from the same rows)."""

from __future__ import annotations

import json
import math
from datetime import timedelta
from pathlib import Path

METRICS_FILE = "metrics.jsonl"
REPORT_DIR = "report"
HTML_REPORT = "report.html"

SCORE = "critic/score/mean"
VAL_SCORE = "val/score/mean"
LENGTH = "response_length/mean"
LENGTH_MAX = "response_length/max"
LENGTH_MIN = "response_length/min"
STEP_TIME = "timing_s/step"
INSTANCES = "spot/instances"
INSTANCES_END = "spot/instances_end"
CAP = "spot/cap"
CAP_ADVISED = "spot/cap_advised"
PREEMPTIONS = "spot/preemptions"
JOINS = "spot/joins"
MIGRATED = "migration/samples"
WASTED = "migration/wasted_tokens"
PULL = "weights/pull_s"
PROVISION = "weights/provision_s"
SEED_WINDOW = "rollout/seed_window_s"
WAIT_TRAIN = "timing_s/wait_train"
WAIT_REMOTE = "timing_s/wait_remote"
TOKENS_PER_USD = "cost/tokens_per_usd"
COLOCATED_EST = "cost/colocated_est_tokens_per_usd"
TOTAL_USD = "cost/total_usd"
TOTAL_TOKENS_PER_USD = "cost/total_tokens_per_usd"
TIMING_PREFIX = "timing_s/"
THROUGHPUT = "perf/throughput"
STALENESS = "staleness/mean"
STALENESS_MAX = "staleness/max"
ESS = "actor/ess"

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
            table.append((name, (f"first {format_number(values[0])} · last {format_number(values[-1])} · "
                                 f"best {format_number(values[best])} (step {steps[best]})")))
    _, step_times = series(rows, STEP_TIME)
    if step_times:
        total = sum(step_times)
        table.append(("mean step time", f"{format_number(total / len(step_times))} s"))
        table.append(("total wall time", f"{format_number(total)} s ({timedelta(seconds=round(total))})"))
    _, throughput = series(rows, THROUGHPUT)
    if throughput:
        table.append((f"mean {THROUGHPUT}", f"{format_number(sum(throughput) / len(throughput))} tokens/s"))
    # Hybrid runs: the preemptible fleet. Colocated runs log none of these, so get none of the rows.
    for label, name in (("total preemptions", PREEMPTIONS), ("total instance joins", JOINS),
                        ("samples migrated", MIGRATED), ("tokens wasted", WASTED)):
        _, values = series(rows, name)
        if values:
            table.append((label, format_number(sum(values))))
    advised = advised_cap(rows)
    if advised:
        table.append(("instance cap, not enforced", advised))
    for label, name in (("mean weight pull time", PULL), ("mean provisioning time", PROVISION)):
        _, values = series(rows, name)
        if values:  # steps without a pull (or a join) log 0; they are not pulls that took no time
            done = [v for v in values if v > 0]
            table.append((label, f"{format_number(sum(done) / len(done))} s (over {len(done)} steps)"
                                 if done else "none"))
    _, total_usd = series(rows, TOTAL_USD)
    if total_usd:
        table.append(("total cost", format_usd(total_usd[-1])))
    _, per_usd = series(rows, TOTAL_TOKENS_PER_USD)
    _, estimated = series(rows, COLOCATED_EST)
    if per_usd or estimated:
        parts = [f"{format_number(per_usd[-1])} tokens/$"] if per_usd else []
        if estimated:
            mean_estimate = sum(estimated) / len(estimated)
            ratio = f" (×{per_usd[-1] / mean_estimate:.2f})" if per_usd and mean_estimate > 0 else ""
            parts.append(f"colocated (estimated) {format_number(mean_estimate)} tokens/${ratio}")
        table.append(("tokens per $", " · ".join(parts)))
    return table


def advised_cap(rows: Rows) -> str:
    """What the offload controller would have held in a run that did not enforce its cap
    (`offload.enforce_cap=false`, the showcase), beside what the run held; empty for other runs."""
    steps, caps = series(rows, CAP_ADVISED)
    if not caps:
        return ""
    changes = [(step, cap) for i, (step, cap) in enumerate(zip(steps, caps)) if i == 0 or cap != caps[i - 1]]
    would = ", then ".join(f"{cap:g} after step {step}" for step, cap in changes)
    _, held = series(rows, INSTANCES)
    if not held:
        return f"the no-regret controller would have held {would}"
    span = f"{min(held):g}" if min(held) == max(held) else f"{min(held):g}–{max(held):g}"
    return f"the no-regret controller would have held {would}; the run held {span} (instances at each step's start)"


def format_usd(value: float) -> str:
    """Dollars with 2–4 significant digits: $1,234 · $123 · $12.35 · $1.20 · $0.012."""
    sign, value = ("-" if value < 0 else ""), abs(value)
    if value >= 100:
        text = f"{value:,.0f}"
    elif value >= 1 or value == 0:
        text = f"{value:.2f}"
    else:
        text = f"{value:#.2g}"
    return f"{sign}${text}"
