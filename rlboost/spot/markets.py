"""Spot markets other than the bundled trace's abundant hours, to check the offload policies where
spot capacity is scarce: the bundled trace thinned out, and seeded synthetic bursty markets.

A bursty market alternates stretches with no instance (exponential, mean `mean_gap_s`) and bursts
(exponential, mean `mean_burst_s`) that open with 1..max_instances instances; within a burst the
count moves at random moments (Poisson, `changes_per_hour`), down (a preemption of one or more
instances) or up by one. Pure and deterministic: the same arguments give the same trace.

`python -m rlboost.spot.markets bursty --seed 3 out.csv` writes one as a `time_s,available_instances`
CSV that `rlboost simulate trace.path=out.csv` (or a run's `rollout.hybrid.trace.path`) replays.
"""

from __future__ import annotations

import argparse
import random
from pathlib import Path

from rlboost.spot.trace import HEADER, SpotTrace, _normalised

SCARCE_BUNDLED: dict[str, tuple[str, float]] = {
    "C@0.5": ("C", 0.5), "C@0.25": ("C", 0.25), "B@0.15": ("B", 0.15), "A@0.1": ("A", 0.1), "C@0.1": ("C", 0.1),
}
"""Scarce markets cut from the bundled trace: name -> (segment, fraction of its GPUs kept). Segment C
at the paper's 50% is the scarcest the paper shows; the others keep fewer GPUs (0 to 4 2-GPU
instances, long stretches with none)."""


def bursty(seed: int, *, hours: float = 2.0, max_instances: int = 4, mean_gap_s: float = 1200.0,
           mean_burst_s: float = 900.0, changes_per_hour: float = 3.0) -> SpotTrace:
    """A seeded bursty market of `hours` (module docstring), counted in instances."""
    if hours <= 0 or max_instances < 1 or min(mean_gap_s, mean_burst_s, changes_per_hour) <= 0:
        raise ValueError("bursty: hours, max_instances, mean_gap_s, mean_burst_s and changes_per_hour must be > 0")
    rng = random.Random(seed)
    end = hours * 3600.0
    times, counts = [0.0], [0]
    t = rng.expovariate(1.0 / mean_gap_s)
    while t < end:
        n = rng.randint(1, max_instances)
        times.append(t)
        counts.append(n)
        burst_end = min(t + rng.expovariate(1.0 / mean_burst_s), end)
        change = t + rng.expovariate(changes_per_hour / 3600.0)
        while change < burst_end:
            n = rng.randint(1, n - 1) if n > 1 and rng.random() < 0.5 else min(max_instances, n + 1)
            times.append(change)
            counts.append(n)
            change += rng.expovariate(changes_per_hour / 3600.0)
        if burst_end >= end:
            break
        times.append(burst_end)
        counts.append(0)
        t = burst_end + rng.expovariate(1.0 / mean_gap_s)
    times.append(end)
    counts.append(counts[-1])
    return _normalised(times, counts)


def write_csv(trace: SpotTrace, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = [",".join(HEADER)] + [f"{t!r},{c}" for t, c in zip(trace.times_s, trace.counts)]
    path.write_text("\n".join(rows) + "\n")
    return path


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m rlboost.spot.markets", description=__doc__.split("\n\n")[0])
    parser.add_argument("kind", choices=["bursty"])
    parser.add_argument("out", help="CSV to write")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--hours", type=float, default=2.0)
    parser.add_argument("--max-instances", type=int, default=4)
    args = parser.parse_args(argv)
    trace = bursty(args.seed, hours=args.hours, max_instances=args.max_instances)
    print(f"wrote {write_csv(trace, args.out)}: {trace.stats()}")


__all__ = ["SCARCE_BUNDLED", "bursty", "write_csv"]


if __name__ == "__main__":
    main()
