"""`rlboost bench control-plane`: what the rollout manager's own loop costs as instances multiply.

The real runtime (Ray, the manager, its StepState, weight pulls) runs RL steps on emulated rollout
workers (`rlboost.bench.emulation`: engines that sleep through the H100 profile's time, light workers
that never load torch above 8 instances), scaled so that every engine carries about the same load at
every count. Reported per instance count: the CPU time of the manager's loop thread as a fraction of
the step's wall time (`loop_busy_fraction`, over all steps, and per step: the first includes the
first dispatch of every sample and the instances' first pulls; the goal is under 5% at 64 instances),
the step time, and how many worker reports the loop handled per second of rollout. Beside each count it
prints the figure last on record for it (`RECORD`: the fraction per count at each landed commit that
was measured, newest last), so a regression shows the day it lands.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, replace
from pathlib import Path

from rich.table import Table

from rlboost.bench.emulation import CheckConfig, run_emulation, scaled_config

RECORD = Path(__file__).resolve().parents[2] / "docs" / "results" / "control_plane_record.json"
"""`loop_busy_fraction` per instance count at landed commits, as this bench measured it on a 2-core
machine: a JSON list of {"commit", "date", "note", "loop_busy_fraction": {"64": 0.158, ...}}, oldest
first (docs/simulator.md, "The manager's overhead")."""


@dataclass
class ControlPlaneBenchConfig:
    instances: list[int] = dataclasses.field(default_factory=lambda: [4, 16, 64])
    """Instance counts to measure."""
    steps: int = 2
    """RL steps per count (the first includes the instances' first dispatch)."""
    time_scale: float = 0.0
    """Wall seconds per modelled second; 0: 1 up to 16 instances, 3 at 64, in proportion above 16
    (`default_time_scale`: 64 emulated engines at the modelled H100 speed do not fit on 2 cores beside
    the manager; slower engines send fewer reports per second, so the fraction measured at 3 is the one
    a 3x faster machine would see at 1, and 256 instances at 12 send what 64 send at 3; the workers'
    heartbeats and report delays scale with it too, `rlboost.bench.emulated_run.runtime_config`)."""
    workers_per_process: int = 0
    """Emulated workers sharing one process (rollout.hybrid.workers_per_process); 0: 1 up to 64
    instances, 16 above (`default_workers_per_process`: 256 instances and 64 reserved engines as
    processes of their own do not fit a 24 GB machine; the manager's side of every call is the same)."""
    stream_interval: int = 8
    seed: int = 0
    record: str = str(RECORD)
    """The figures on record (`RECORD`'s format), printed beside each count's; '' for none."""

    def validate(self) -> None:
        if self.workers_per_process < 0:
            raise ValueError(f"--workers-per-process must be >= 0 (0: by instance count), "
                             f"got {self.workers_per_process}")
        if self.record:
            load_record(self.record)  # a broken record is refused before the minutes of the run


def load_record(path: str) -> list[dict]:
    """The record's rows, oldest first; a missing file is an empty record (an installed package has no
    docs/). ValueError naming the file and what is wrong."""
    file = Path(path)
    if not file.exists():
        return []
    try:
        rows = json.loads(file.read_text())
        for row in rows:
            fractions = row["loop_busy_fraction"]
            if not isinstance(row["commit"], str) or not all(
                    k.isdigit() and isinstance(v, (int, float)) for k, v in fractions.items()):
                raise TypeError(f"row {row!r}: a commit, and instance counts to numeric fractions")
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise ValueError(f"--record={path}: not a list of {{commit, loop_busy_fraction: {{instances: fraction}}}} "
                         f"rows: {type(e).__name__}: {e}") from None
    return rows


def last_on_record(rows: list[dict], instances: int) -> dict | None:
    """The newest row with a figure at `instances`: {"commit", "loop_busy_fraction"}."""
    for row in reversed(rows):
        if str(instances) in row["loop_busy_fraction"]:
            return {"commit": row["commit"], "loop_busy_fraction": row["loop_busy_fraction"][str(instances)]}
    return None


def default_time_scale(instances: int) -> float:
    """1 up to 16 instances; above, 3 per 64 instances: the reports per second of 64 instances at 3, which
    this machine's 2 cores carry beside the manager, at any count."""
    return 1.0 if instances <= 16 else 3.0 * instances / 64


def default_workers_per_process(instances: int) -> int:
    """1 (a process per worker, as a real run) up to 64 instances; 16 a process above."""
    return 1 if instances <= 64 else 16


def bench_control_plane(cfg: ControlPlaneBenchConfig, log=None) -> dict:
    results = []
    record = load_record(cfg.record) if cfg.record else []
    for n in cfg.instances:
        scale = cfg.time_scale or default_time_scale(n)
        check = replace(scaled_config(n, CheckConfig(steps=cfg.steps, stream_interval=cfg.stream_interval,
                                                     seed=cfg.seed, time_scale=scale)),
                        worker="rollout" if n <= 8 else "light",
                        workers_per_process=cfg.workers_per_process or default_workers_per_process(n))
        if log:
            log(f"{n} instances ({check.worker} workers, {check.workers_per_process} a process, time_scale {scale:g}):")
        steps, _, _, _, _ = run_emulation(check, log)
        wall = sum(s.step_s for s in steps)
        rollout = sum(s.rollout_s for s in steps)
        results.append({"instances": n, "loop_busy_fraction": sum(s.loop_cpu_s for s in steps) / wall,
                        "loop_busy_fraction_per_step": [s.loop_cpu_s / s.step_s for s in steps],
                        "relay_busy_fraction": sum(s.relay_cpu_s for s in steps) / wall,
                        "driver_busy_fraction": sum(s.driver_cpu_s for s in steps) / wall,
                        "step_s": wall / len(steps), "rollout_s": rollout / len(steps),
                        "reports_per_s": sum(s.reports for s in steps) / rollout, "time_scale": scale,
                        "worker": check.worker, "workers_per_process": check.workers_per_process,
                        "samples_per_step": steps[0].samples,
                        "on_record": last_on_record(record, n)})
    return {"config": dataclasses.asdict(cfg), "results": results}


def render(result: dict) -> Table:
    table = Table(title="The rollout manager's loop CPU, as a share of step time (goal: < 5% at 64 instances)")
    for col in ("instances", "worker", "time_scale", "samples/step", "step s", "reports/s", "loop CPU / step",
                "on record", "relay CPU / step"):
        table.add_column(col, justify="right")
    for r in result["results"]:
        prior = r.get("on_record")
        table.add_row(str(r["instances"]), r["worker"], f"{r['time_scale']:g}", str(r["samples_per_step"]),
                      f"{r['step_s']:.1f}", f"{r['reports_per_s']:.0f}", f"{r['loop_busy_fraction']:.1%}",
                      f"{prior['loop_busy_fraction']:.1%} at {prior['commit']}" if prior else "-",
                      f"{r['relay_busy_fraction']:.1%}" if "relay_busy_fraction" in r else "-")
    return table


__all__ = ["RECORD", "ControlPlaneBenchConfig", "bench_control_plane", "default_time_scale",
           "default_workers_per_process", "last_on_record",
           "load_record", "render"]
