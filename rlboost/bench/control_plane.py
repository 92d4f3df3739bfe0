"""`rlboost bench control-plane`: what the rollout manager's own loop costs as instances multiply.

The real runtime (Ray, the manager, its StepState, weight pulls) runs RL steps on emulated rollout
workers (`rlboost.bench.emulation`: engines that sleep through the H100 profile's time, light workers
that never load torch above 8 instances), scaled so that every engine carries about the same load at
every count. Reported per instance count: the CPU time of the manager's loop thread as a fraction of
the step's wall time (`loop_busy_fraction`, over all steps, and per step: the first includes the
first dispatch of every sample and the instances' first pulls; the goal is under 5% at 64 instances),
the step time, and how many worker reports the loop handled per second of rollout.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, replace

from rich.table import Table

from rlboost.bench.emulation import CheckConfig, run_emulation, scaled_config


@dataclass
class ControlPlaneBenchConfig:
    instances: list[int] = dataclasses.field(default_factory=lambda: [4, 16, 64])
    """Instance counts to measure."""
    steps: int = 2
    """RL steps per count (the first includes the instances' first dispatch)."""
    time_scale: float = 0.0
    """Wall seconds per modelled second; 0: 1 up to 16 instances, 3 above (64 emulated engines at the
    modelled H100 speed do not fit on 2 cores beside the manager; slower engines send fewer reports per
    second, so the fraction measured at 3 is the one a 3x faster machine would see at 1)."""
    stream_interval: int = 8
    seed: int = 0


def bench_control_plane(cfg: ControlPlaneBenchConfig, log=None) -> dict:
    results = []
    for n in cfg.instances:
        scale = cfg.time_scale or (1.0 if n <= 16 else 3.0)
        check = replace(scaled_config(n, CheckConfig(steps=cfg.steps, stream_interval=cfg.stream_interval,
                                                     seed=cfg.seed, time_scale=scale)),
                        worker="rollout" if n <= 8 else "light")
        if log:
            log(f"{n} instances ({check.worker} workers, time_scale {scale:g}):")
        steps, _, _, _, _ = run_emulation(check, log)
        wall = sum(s.step_s for s in steps)
        rollout = sum(s.rollout_s for s in steps)
        results.append({"instances": n, "loop_busy_fraction": sum(s.loop_cpu_s for s in steps) / wall,
                        "loop_busy_fraction_per_step": [s.loop_cpu_s / s.step_s for s in steps],
                        "step_s": wall / len(steps), "rollout_s": rollout / len(steps),
                        "reports_per_s": sum(s.reports for s in steps) / rollout, "time_scale": scale,
                        "worker": check.worker, "samples_per_step": steps[0].samples})
    return {"config": dataclasses.asdict(cfg), "results": results}


def render(result: dict) -> Table:
    table = Table(title="The rollout manager's loop CPU, as a share of step time (goal: < 5% at 64 instances)")
    for col in ("instances", "worker", "time_scale", "samples/step", "step s", "reports/s", "loop CPU / step"):
        table.add_column(col, justify="right")
    for r in result["results"]:
        table.add_row(str(r["instances"]), r["worker"], f"{r['time_scale']:g}", str(r["samples_per_step"]),
                      f"{r['step_s']:.1f}", f"{r['reports_per_s']:.0f}", f"{r['loop_busy_fraction']:.1%}")
    return table


__all__ = ["ControlPlaneBenchConfig", "bench_control_plane", "render"]
