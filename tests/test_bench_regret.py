"""RLBoost against colocated on the real control plane (emulated engines, real SIGKILLs) in a scarce,
bursty market: no slower, within the noise measured between repeats (slow: `make test-slow`,
which CI runs; `pytest -m slow -s tests/test_bench_regret.py` prints the numbers)."""

from __future__ import annotations

import pytest

from rlboost.bench.regret import RegretBenchConfig, bench_regret, render


@pytest.mark.slow
def test_rlboost_ends_no_slower_than_colocated_in_a_bursty_market():
    result = bench_regret(RegretBenchConfig(repeats=2))
    print(render(result))
    assert all(r["preemptions"] > 0 for r in result["runs"]["rlboost"])  # the market killed instances
    assert result["throughput_ratio"] >= 1.0 - result["noise"] - 0.01
