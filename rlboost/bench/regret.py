"""`rlboost bench regret`: RLBoost against colocated on the real control plane, in a scarce market.

Contract: `bench_regret(RegretBenchConfig(...))` runs the same emulated workload (rlboost.bench.emulation:
the real HybridRollout, Fleet, manager, offload controller and trace provider with real SIGKILLs, on
emulated engines) `repeats` times each way, taking turns:
- rlboost: the trace provider replays a seeded bursty market (rlboost.spot.markets.bursty),
  compressed, capped at `instances`;
- colocated: no instance at all (the reserved engines generate, then train), the veRL baseline on
  the same control plane.
It returns every run's wall time, tokens, dollars (the reserved GPUs for the wall time, the
instances for their seconds, at the paper's prices per GPU) and the ratios of the means, with the
noise measured as the spread between repeats of the same side. The claim it checks: rlboost ends no
slower and no costlier per token than colocated, within that noise.
"""

from __future__ import annotations

import dataclasses
import statistics
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path

from rlboost.bench.emulation import CheckConfig, run_emulation
from rlboost.spot.markets import bursty, write_csv


@dataclass
class RegretBenchConfig(CheckConfig):
    """A CheckConfig run both ways; the market is a seeded bursty one."""

    provider: str = "trace"
    """Always the trace provider on the rlboost side (the colocated side has no instance)."""
    market_seed: int = 4
    """Seed of the bursty market (seed 4: 0 to 3 instances, a stretch with none, preemptions in its
    first minute at the default compression)."""
    repeats: int = 2
    """Runs of each side (taking turns), for the noise."""
    steps: int = 4


def _run(cfg: CheckConfig, log) -> dict:
    steps = run_emulation(cfg, log)[0]
    wall = sum(s.step_s for s in steps)
    tokens = sum(s.tokens for s in steps)
    reserved_usd_per_s, instance_usd_per_s = cfg.prices()
    usd = reserved_usd_per_s * wall + instance_usd_per_s * sum(s.instance_s for s in steps)
    return {"wall_s": wall, "tokens": tokens, "tokens_per_s": tokens / wall, "usd": usd,
            "tokens_per_usd": tokens / usd, "instance_s": sum(s.instance_s for s in steps),
            "preemptions": sum(s.preemptions for s in steps), "steps_s": [s.step_s for s in steps]}


def _spread(values: list[float]) -> float:
    """(max - min) / mean of repeats: the noise of one side."""
    return (max(values) - min(values)) / statistics.fmean(values) if len(values) > 1 else float("nan")


def bench_regret(cfg: RegretBenchConfig, log=None) -> dict:
    base = CheckConfig(**{f.name: getattr(cfg, f.name) for f in dataclasses.fields(CheckConfig)})
    runs: dict[str, list[dict]] = {"rlboost": [], "colocated": []}
    with tempfile.TemporaryDirectory() as tmp:
        market = write_csv(bursty(cfg.market_seed), Path(tmp) / "market.csv")
        sides = {"rlboost": replace(base, provider="trace", trace_path=str(market)),
                 "colocated": replace(base, colocated=True)}
        for repeat in range(cfg.repeats):
            for side, config in sides.items():
                if log:
                    log(f"{side}, run {repeat + 1} of {cfg.repeats}:")
                runs[side].append(_run(config, log))
    mean = {side: {k: statistics.fmean(r[k] for r in rs) for k in ("tokens_per_s", "tokens_per_usd")}
            for side, rs in runs.items()}
    noise = max(_spread([r[k] for r in rs]) for rs in runs.values() for k in ("tokens_per_s", "tokens_per_usd"))
    return {"config": dataclasses.asdict(cfg), "runs": runs,
            "throughput_ratio": mean["rlboost"]["tokens_per_s"] / mean["colocated"]["tokens_per_s"],
            "cost_efficiency_ratio": mean["rlboost"]["tokens_per_usd"] / mean["colocated"]["tokens_per_usd"],
            "noise": noise}


def render(result: dict) -> str:
    lines = ["| side | run | wall s | tokens/s | tokens/$ | instance s | preemptions |", "|---|---|---|---|---|---|---|"]
    for side, rs in result["runs"].items():
        for i, r in enumerate(rs, 1):
            lines.append(f"| {side} | {i} | {r['wall_s']:.1f} | {r['tokens_per_s']:,.0f} | {r['tokens_per_usd']:,.0f} "
                         f"| {r['instance_s']:.1f} | {r['preemptions']} |")
    lines.append("")
    lines.append(f"rlboost vs colocated: throughput {result['throughput_ratio']:.3f}x, tokens per dollar "
                 f"{result['cost_efficiency_ratio']:.3f}x; noise (spread between repeats of one side, worst) "
                 f"{result['noise']:.1%}")
    return "\n".join(lines)


__all__ = ["RegretBenchConfig", "bench_regret", "render"]
