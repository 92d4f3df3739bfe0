"""`rlboost bench control-plane`'s record (no run here: the bench takes minutes): the figure last on record
for each instance count is printed beside the measured one, and a broken record is refused in one line
before the run starts."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from rich.console import Console

from rlboost.bench import control_plane
from rlboost.bench.control_plane import ControlPlaneBenchConfig, last_on_record, load_record, render


def test_the_record_in_docs_loads_and_holds_the_counts_the_issue_is_held_to():
    rows = load_record(str(control_plane.RECORD))
    assert rows and all(row["commit"] and row["loop_busy_fraction"] for row in rows)
    assert all(last_on_record(rows, n) is not None for n in (4, 16, 64, 256))


def test_the_newest_row_with_a_count_is_the_one_on_record(tmp_path):
    record = tmp_path / "record.json"
    record.write_text(json.dumps([{"commit": "aaa", "loop_busy_fraction": {"16": 0.03, "64": 0.05}},
                                  {"commit": "bbb", "loop_busy_fraction": {"64": 0.16}}]))
    rows = load_record(str(record))
    assert last_on_record(rows, 64) == {"commit": "bbb", "loop_busy_fraction": 0.16}
    assert last_on_record(rows, 16) == {"commit": "aaa", "loop_busy_fraction": 0.03}
    assert last_on_record(rows, 256) is None
    assert load_record(str(tmp_path / "absent.json")) == []  # an installed package has no docs/

    result = {"results": [{"instances": 64, "worker": "light", "time_scale": 3.0, "samples_per_step": 2048,
                           "step_s": 60.0, "reports_per_s": 290.0, "loop_busy_fraction": 0.136,
                           "relay_busy_fraction": 0.071, "on_record": last_on_record(rows, 64)},
                          {"instances": 256, "worker": "light", "time_scale": 3.0, "samples_per_step": 8192,
                           "step_s": 80.0, "reports_per_s": 900.0, "loop_busy_fraction": 0.2, "on_record": None}]}
    console = Console(width=200, record=True)
    console.print(render(result))
    text = console.export_text()
    assert "13.6%" in text and "16.0% at bbb" in text and "7.1%" in text


@pytest.mark.parametrize("content, says", [
    ("[{\"commit\": \"a\"}]", "KeyError"),
    ("[{\"commit\": \"a\", \"loop_busy_fraction\": {\"sixty\": 0.1}}]", "instance counts to numeric fractions"),
    ("{not json", "JSONDecodeError"),
])
def test_a_broken_record_is_refused_in_one_line_before_the_run(tmp_path, content, says):
    record = tmp_path / "record.json"
    record.write_text(content)
    with pytest.raises(ValueError, match=f"--record={record}: not a list of .*{says}"):
        ControlPlaneBenchConfig(record=str(record)).validate()
    proc = subprocess.run([sys.executable, "-m", "rlboost.cli", "bench", "control-plane", "--record", str(record)],
                          capture_output=True, text=True, timeout=120)
    said = (proc.stdout + proc.stderr).strip()
    assert proc.returncode == 2 and "Traceback" not in said
    assert said.count("\n") == 0 and f"--record={record}" in said, said


def test_the_default_time_scale_keeps_the_report_rate_of_64_instances_at_3():
    assert [control_plane.default_time_scale(n) for n in (4, 16, 64, 256)] == [1.0, 1.0, 3.0, 12.0]


def test_the_emulated_workers_report_on_modelled_time():
    """Heartbeats and report delays scale with time_scale as every other time of the emulation does: at
    12 an idle worker heartbeating every wall second would send 12 a modelled second, inflating the
    report rate the manager's loop is measured at (64 idle reserved engines at 256 instances)."""
    from rlboost.bench.emulated_run import runtime_config
    from rlboost.bench.emulation import CheckConfig
    from rlboost.hybrid.config import HybridConfig

    one, twelve = runtime_config(CheckConfig(time_scale=1.0)), runtime_config(CheckConfig(time_scale=12.0))
    assert one.heartbeat_interval_s == HybridConfig().heartbeat_interval_s  # at 1, the runtime's own
    assert twelve.heartbeat_interval_s == 12 * one.heartbeat_interval_s
    assert twelve.heartbeat_timeout_s == 12 * one.heartbeat_timeout_s
    assert twelve.report_delay_s == pytest.approx(12 * one.report_delay_s)
