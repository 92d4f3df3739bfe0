"""Tracking: metrics.jsonl, TensorBoard, the console progress, resume truncation and the run report."""

from __future__ import annotations

import importlib.machinery
import io
import json
import sys
import types

import numpy as np
import pytest
import torch
from rich.console import Console

from rlboost.tracking import MetricsTracker, StepProgress, TrackingConfig, truncate_metrics, write_report
from rlboost.tracking.progress import short_label


def tracker(tmp_path, *loggers, total=10, start=0, report=False, **kw) -> MetricsTracker:
    return MetricsTracker(tmp_path, TrackingConfig(loggers=list(loggers), report=report), total, start, **kw)


def step_metrics(step: int, val: bool = True) -> dict[str, float]:
    metrics = {"critic/score/mean": 0.1 * step, "response_length/mean": 50.0 + step,
               "response_length/max": 80.0 + step, "response_length/min": 20.0 + step,
               "timing_s/gen": 2.0, "timing_s/update_actor": 1.0, "timing_s/step": 3.5,
               "perf/throughput": 1000.0 + step}
    if val and step % 2 == 0:
        metrics["val/score/mean"] = 0.2 * step
    return metrics


def write_metrics(run_dir, steps, val: bool = True) -> None:
    with (run_dir / "metrics.jsonl").open("w") as f:
        for step in steps:
            f.write(json.dumps({"step": step, **step_metrics(step, val)}) + "\n")


def read_lines(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_jsonl_lines_are_readable_before_close(tmp_path):
    t = tracker(tmp_path, "jsonl")
    t.log(1, {"a": np.float32(0.5), "b": torch.tensor(2.0), "c": 3, "d": np.array([4.0])})
    t.log(2, {"a": float("nan")})
    # not closed yet: a killed run must still have these lines on disk
    assert read_lines(tmp_path / "metrics.jsonl") == [{"step": 1, "a": 0.5, "b": 2.0, "c": 3.0, "d": 4.0},
                                                      {"step": 2, "a": None}]
    with pytest.raises(TypeError, match="'e'"):
        t.log(3, {"e": torch.ones(3)})
    with pytest.raises(ValueError, match="reserved"):
        t.log(3, {"step": 1.0})
    t.close()
    with pytest.raises(RuntimeError):
        t.log(4, {"a": 1.0})


def test_tensorboard_scalars_read_back(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    with tracker(tmp_path, "tensorboard") as t:
        t.log(1, {"critic/score/mean": 0.25})
        t.log(2, {"critic/score/mean": np.float64(0.75)})
    assert list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    scalars = events.Scalars("critic/score/mean")
    assert [(s.step, s.value) for s in scalars] == [(1, 0.25), (2, 0.75)]


def test_truncate_metrics_keeps_steps_up_to_n(tmp_path):
    path = tmp_path / "metrics.jsonl"
    write_metrics(tmp_path, range(0, 8))
    with path.open("a") as f:
        f.write('{"step": 8, "critic/sco')  # a killed run's cut-off last line
    truncate_metrics(path, 4)
    assert [r["step"] for r in read_lines(path)] == [0, 1, 2, 3, 4]
    assert not path.with_name("metrics.jsonl.tmp").exists()
    truncate_metrics(tmp_path / "missing.jsonl", 3)  # nothing to do, no error
    assert not (tmp_path / "missing.jsonl").exists()


def test_resumed_tracker_drops_steps_after_checkpoint(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    with tracker(tmp_path, "jsonl", "tensorboard") as t:  # killed after step 5, checkpoint at step 3
        for step in range(1, 6):
            t.log(step, {"critic/score/mean": float(step)})
    with tracker(tmp_path, "jsonl", "tensorboard", start=3) as t:
        t.log(4, {"critic/score/mean": 40.0})
    assert read_lines(tmp_path / "metrics.jsonl") == [{"step": s, "critic/score/mean": v}
                                                      for s, v in [(1, 1.0), (2, 2.0), (3, 3.0), (4, 40.0)]]
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    scalars = events.Scalars("critic/score/mean")
    assert [(s.step, s.value) for s in scalars] == [(1, 1), (2, 2), (3, 3), (4, 40)]


def test_report_writes_markdown_plots_and_summary(tmp_path):
    write_metrics(tmp_path, range(1, 6))
    report = write_report(tmp_path, title="demo run")
    assert report == tmp_path / "report" / "report.md"
    for name in ("reward.png", "response_length.png", "time_breakdown.png"):
        png = tmp_path / "report" / name
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert f"]({name})" in report.read_text()  # embedded with a relative link
    rows = dict(line.strip("|").split("|")[:2] for line in report.read_text().splitlines()
                if line.startswith("| "))
    rows = {k.strip(): v.strip() for k, v in rows.items()}
    assert report.read_text().startswith("# demo run")
    assert rows["steps"] == "5 (1–5)"
    assert rows["critic/score/mean"] == "first 0.1 · last 0.5 · best 0.5 (step 5)"
    assert rows["val/score/mean"] == "first 0.4 · last 0.8 · best 0.8 (step 4)"
    assert rows["mean step time"] == "3.5 s"
    assert rows["total wall time"] == "17.5 s (0:00:18)"
    assert rows["mean perf/throughput"] == "1,003 tokens/s"


def test_report_on_one_step_without_validation(tmp_path):
    write_metrics(tmp_path, [1], val=False)
    text = write_report(tmp_path).read_text()
    assert text.startswith(f"# {tmp_path.name}")
    assert "val/score/mean" not in text and "first 0.1 · last 0.1" in text
    assert len(list((tmp_path / "report").glob("*.png"))) == 3


def test_report_skips_plots_of_metrics_never_logged(tmp_path):
    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "timing_s/step": 2.0}\n')
    text = write_report(tmp_path).read_text()
    assert [p.name for p in (tmp_path / "report").glob("*.png")] == ["time_breakdown.png"]
    assert "reward.png" not in text and "total wall time" in text


def test_report_plots_preemptible_instances_of_hybrid_runs(tmp_path):
    lines = [{"step": s, "spot/instances": 2.0 - (s == 3), "spot/preemptions": float(s in (2, 3)),
              "migration/samples": 5.0 * s, "timing_s/step": 1.0} for s in range(1, 5)]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    text = write_report(tmp_path).read_text()
    assert (tmp_path / "report" / "spot.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "](spot.png)" in text
    write_metrics(tmp_path, [1])  # a colocated run: no spot metrics, no spot plot (nor a stale one)
    assert "spot.png" not in write_report(tmp_path).read_text()
    assert not (tmp_path / "report" / "spot.png").exists()


def hybrid_lines() -> list[dict]:
    """Four hybrid steps: a preemption of two instances at step 2, a join at step 3, a cap from step 2."""
    lines = []
    for s in range(1, 5):
        line = {"step": s, "spot/instances": 3.0 - (s == 3), "spot/instances_end": 3.0 - (s == 2),
                "spot/preemptions": 2.0 * (s == 2), "spot/joins": float(s in (1, 3)),
                "migration/samples": 4.0 * (s == 2), "migration/wasted_tokens": 1500.0 * (s == 2) + 10.0 * (s == 4),
                "weights/pull_s": [0.0, 2.0, 0.0, 4.0][s - 1], "weights/provision_s": 30.0 * (s in (1, 3)),
                "rollout/seed_window_s": 5.0 + s, "timing_s/wait_train": 0.5 * s, "timing_s/wait_remote": 1.0,
                "timing_s/step": 10.0, "cost/tokens_per_usd": 40_000.0 + 1000 * s,
                "cost/colocated_est_tokens_per_usd": 30_000.0 + 2000 * s, "cost/total_usd": 0.75 * s,
                "cost/total_tokens_per_usd": 42_500.0}
        if s >= 2:
            line["spot/cap"] = 3.0
        lines.append(line)
    return lines


def summary_rows(text: str) -> dict[str, str]:
    return {k.strip(): v.strip() for k, v in (line.strip("|").split("|")[:2] for line in text.splitlines()
                                              if line.startswith("| "))}


def test_report_of_a_hybrid_run_plots_offload_and_cost(tmp_path):
    lines = hybrid_lines()
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    text = write_report(tmp_path).read_text()
    for name in ("spot.png", "offload.png", "cost.png"):
        png = tmp_path / "report" / name
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 1000
        assert f"]({name})" in text
    assert text.index("](spot.png)") < text.index("](offload.png)") < text.index("](cost.png)")
    rows = summary_rows(text)
    assert rows["total preemptions"] == f"{sum(line['spot/preemptions'] for line in lines):g}" == "2"
    assert rows["total instance joins"] == "2"
    assert rows["samples migrated"] == "4"
    assert rows["tokens wasted"] == "1,510"
    assert rows["mean weight pull time"] == "3 s (over 2 steps)"  # steps without a pull don't count
    assert rows["mean provisioning time"] == "30 s (over 2 steps)"
    assert rows["total cost"] == "$3.00"  # the last step's cumulative cost, not a sum
    assert rows["tokens per $"] == "42,500 tokens/$ · colocated (estimated) 35,000 tokens/$ (×1.21)"
    assert "instance cap, not enforced" not in rows  # this run's cap was enforced


def test_report_of_a_run_that_did_not_enforce_its_cap_says_what_the_controller_would_have_held(tmp_path):
    lines = hybrid_lines()
    for line, advised in zip(lines, (2.0, 2.0, 0.0, 0.0)):  # the showcase: the cap advised, not enforced
        line.pop("spot/cap", None)
        line["spot/cap_advised"] = advised
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    rows = summary_rows(write_report(tmp_path).read_text())
    assert rows["instance cap, not enforced"] == ("the no-regret controller would have held 2 after step 1, "
                                                  "then 0 after step 3; the run held 2–3 (instances at each "
                                                  "step's start)")
    assert (tmp_path / "report" / "spot.png").stat().st_size > 1000
    for line in lines:
        line["spot/instances"] = 3.0
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    assert summary_rows(write_report(tmp_path).read_text())["instance cap, not enforced"].endswith(
        "; the run held 3 (instances at each step's start)")


def test_report_of_a_colocated_run_plots_cost_only(tmp_path):
    lines = [{"step": s, "timing_s/step": 2.0, "cost/tokens_per_usd": 20_000.0, "cost/total_usd": 0.01 * s,
              "cost/total_tokens_per_usd": 20_000.0} for s in (1, 2)]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    text = write_report(tmp_path).read_text()
    assert sorted(p.name for p in (tmp_path / "report").glob("*.png")) == ["cost.png", "time_breakdown.png"]
    assert "](cost.png)" in text and "spot.png" not in text and "offload.png" not in text
    rows = summary_rows(text)
    assert rows["total cost"] == "$0.020" and rows["tokens per $"] == "20,000 tokens/$"
    assert not {"total preemptions", "tokens wasted", "mean weight pull time"} & rows.keys()


def test_format_usd():
    from rlboost.tracking.report_data import format_usd

    assert [format_usd(v) for v in (1234.5, 123.4, 12.345, 1.2, 0.01234, 0)] \
        == ["$1,234", "$123", "$12.35", "$1.20", "$0.012", "$0.00"]


def test_report_without_metrics_raises(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        write_report(tmp_path)
    (tmp_path / "metrics.jsonl").write_text("")
    with pytest.raises(ValueError, match="empty"):
        write_report(tmp_path)


def test_tracker_writes_report_on_close(tmp_path, capsys):
    with MetricsTracker(tmp_path, TrackingConfig(), total_steps=2) as t:  # the default loggers
        for step in (1, 2):
            t.log(step, step_metrics(step))
    assert t.report_path == tmp_path / "report" / "report.md" and t.report_path.exists()
    assert capsys.readouterr().out.count("step ") >= 2


def test_console_off_a_terminal_prints_one_line_per_step(tmp_path, capsys):
    with tracker(tmp_path, "console", total=10, start=2) as t:
        t.log(3, step_metrics(3))
        t.log(4, step_metrics(4))
    lines = capsys.readouterr().out.splitlines()
    assert lines == ["step 3/10  score 0.3  len 53  step 3.5s",
                     "step 4/10  score 0.4  len 54  val 0.8  step 3.5s"]


def test_live_bar_on_a_terminal_shows_metrics():
    out = io.StringIO()
    progress = StepProgress(5, start_step=1, metrics=["critic/score/mean", "val/score/mean"],
                            console=Console(file=out, force_terminal=True, width=150))
    assert progress.live
    progress.update(2, {"critic/score/mean": 0.42, "val/score/mean": 0.38})
    progress.update(3, {"critic/score/mean": 0.5})  # the last val score stays on show
    progress.close()
    text = out.getvalue()
    assert "train" in text and "3/5" in text and "score 0.5 · val 0.38" in text


def test_short_labels():
    assert [short_label(n) for n in ("critic/score/mean", "response_length/mean", "val/score/mean",
                                     "timing_s/step", "response_length/max", "val/acc", "perf/throughput")] \
        == ["score", "len", "val", "step", "len max", "val acc", "tok/s"]


def test_config_errors(tmp_path, monkeypatch):
    with pytest.raises(ValueError, match="unknown logger.*'tensorbord'.*console, jsonl, tensorboard, wandb"):
        TrackingConfig(loggers=["console", "tensorbord"]).validate()
    with pytest.raises(ValueError, match="unknown logger"):
        MetricsTracker(tmp_path, TrackingConfig(loggers=["csv"]), 1)
    with pytest.raises(ValueError, match="needs 'jsonl'"):
        TrackingConfig(loggers=["console"], report=True).validate()
    monkeypatch.setitem(sys.modules, "wandb", None)  # an import of wandb now fails as if not installed
    with pytest.raises(ValueError, match="wandb package is not installed"):
        TrackingConfig(loggers=["wandb"], report=False).validate()


def test_wandb_sink_when_installed(tmp_path, monkeypatch):
    calls = []
    run = types.SimpleNamespace(log=lambda m, step: calls.append(("log", m, step)),
                                finish=lambda: calls.append(("finish",)))
    fake = types.ModuleType("wandb")
    fake.__spec__ = importlib.machinery.ModuleSpec("wandb", None)
    fake.init = lambda **kw: calls.append(("init", kw)) or run
    monkeypatch.setitem(sys.modules, "wandb", fake)
    with tracker(tmp_path, "wandb", run_name="exp1") as t:
        t.log(1, {"critic/score/mean": np.float32(0.5)})
    assert calls == [("init", {"project": "rlboost", "name": "exp1", "dir": str(tmp_path)}),
                     ("log", {"critic/score/mean": 0.5}, 1), ("finish",)]


def test_report_plots_staleness_and_the_effective_sample_size(tmp_path):
    lines = [{"step": s, "timing_s/step": 1.0, "staleness/mean": 0.5 * s, "staleness/max": float(s),
              "actor/ess": 1.0 - 0.2 * s} for s in (1, 2, 3)]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    text = write_report(tmp_path).read_text()
    assert "](off_policy.png)" in text
    assert (tmp_path / "report" / "off_policy.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "timing_s/step": 2.0}\n')  # a run that logged neither
    assert "off_policy.png" not in write_report(tmp_path).read_text()
