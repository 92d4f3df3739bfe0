"""`rlboost bench hybrid` end to end (a benchmark: `make bench`, not CI; the
behaviour it reports, kills and migrations losing no sample, is what tests/test_hybrid.py checks)."""

from __future__ import annotations

import json

import pytest

from rlboost.cli import main


@pytest.mark.bench
def test_bench_hybrid_reports_both_modes_side_by_side(tmp_path):
    out = tmp_path / "bench.json"
    assert main(["bench", "hybrid", "--prompts", "8", "--max-tokens", "96", "--backpressure-rounds", "1",
                 "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    for mode in ("colocated", "hybrid"):
        assert {"step_time_s", "tokens_per_s", "preemptions", "migrated_samples", "wasted_tokens",
                "in_flight_at_preemption"} <= set(result[mode])
    hybrid = result["hybrid"]
    assert hybrid["preemptions"] == 1 and hybrid["migrated_samples"] == hybrid["in_flight_at_preemption"] > 0
    per_sample = (result["config"]["max_unacked_reports"] + 1) * result["config"]["stream_interval"]
    assert hybrid["wasted_tokens"] <= per_sample * hybrid["in_flight_at_preemption"]
    assert hybrid["identical_samples"] == 1.0  # tiny model: migration changes no sampled token
    cost = result["backpressure"]  # one undisturbed step with and one without, side by side
    assert len(cost["on_tokens_per_s"]) == len(cost["off_tokens_per_s"]) == 1 and cost["ratio"] > 0
