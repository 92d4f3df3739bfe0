"""Ray's workers at nice 15 (Ray's default) against nice 0 (what rlboost's clusters set), beside two
busy processes: a fleet's boot and one step, alternated in one run (a speed benchmark:
`make bench`, not CI; `pytest -m bench -s tests/test_bench_worker_priority.py` prints the numbers)."""

from __future__ import annotations

import multiprocessing
import statistics
import time

import pytest

from hybrid_util import run_step, start_fleet
from rlboost.cluster.config import RaySecurityConfig


def _busy() -> None:
    while True:
        pass


@pytest.mark.bench
def test_workers_at_the_default_priority_are_not_starved_by_busy_neighbours(tmp_path):
    neighbours = [multiprocessing.Process(target=_busy, daemon=True) for _ in range(2)]
    for p in neighbours:
        p.start()
    times: dict[int, list[tuple[float, float]]] = {15: [], 0: []}
    try:
        for i, nice in enumerate([15, 0, 15, 0]):
            t0 = time.monotonic()
            fleet, _ = start_fleet(tmp_path / str(i), num_preemptible=3, ray=RaySecurityConfig(worker_niceness=nice))
            try:
                t1 = time.monotonic()
                run_step(fleet)
                times[nice].append((t1 - t0, time.monotonic() - t1))
            finally:
                fleet.shutdown()
    finally:
        for p in neighbours:
            p.kill()
    boot = {n: statistics.mean(b for b, _ in r) for n, r in times.items()}
    step = {n: statistics.mean(s for _, s in r) for n, r in times.items()}
    for n in (15, 0):
        print(f"\nnice {n}: fleet up {boot[n]:.1f} s, one step {step[n]:.1f} s")
    print(f"nice 0 vs 15: boot {boot[15] / boot[0]:.1f}x faster, step {step[15] / step[0]:.1f}x faster")
    assert boot[0] < boot[15] and step[0] < step[15]
