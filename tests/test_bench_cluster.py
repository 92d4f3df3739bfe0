"""`rlboost bench cluster` end to end, small (a benchmark, 2-6 min: `make bench`, not CI; the behaviour it
measures is tested in the ordinary suite by tests/in_room/room_vanish.py): the tiny model on one
100 Mbit/s spot host. The command
enters a room of emulated hosts itself; a vanished host must be found within the heartbeat timeout
plus a margin, a crashed worker (its sockets reset) sooner, and no token may be lost."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hybrid_util import load_factor, patience

ROOT = Path(__file__).resolve().parent.parent
HEARTBEAT_TIMEOUT_S = 3.0


@pytest.mark.bench
def test_bench_cluster_reports_links_joins_and_detection(tmp_path):
    out = tmp_path / "cluster.json"
    done = subprocess.run([sys.executable, "-m", "rlboost.cli", "bench", "cluster", "--models", "tiny:qwen2",
                           "--links", "100mbit", "--spot-hosts", "1", "--prompts", "4", "--max-tokens", "24",
                           "--heartbeat-timeout-s", str(HEARTBEAT_TIMEOUT_S), "--json", str(out)],
                          cwd=tmp_path, env=os.environ | {"PYTHONPATH": str(ROOT)}, capture_output=True, text=True,
                          timeout=patience(600))
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    result = json.loads(out.read_text())
    assert result["heartbeat_timeout_s"] == HEARTBEAT_TIMEOUT_S
    hosts, one_host = result["results"]
    assert (hosts["link"], one_host["link"]) == ("100mbit", "one host")
    for row in (hosts, one_host):
        assert row["lost_tokens"] == 0 and row["step_s"] > 0
    assert hosts["weight_bytes_per_join"] > 0 and hosts["join_s"] >= hosts["pull_s"] > 0
    assert hosts["transfer_floor_s"] == hosts["weight_bytes_per_join"] * 8 / 1e8
    assert hosts["vanish_detect_s"] <= HEARTBEAT_TIMEOUT_S + 2 * load_factor()
    assert hosts["kill_detect_s"] < hosts["vanish_detect_s"]  # a reset is news at once; silence takes the timeout
