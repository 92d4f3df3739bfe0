"""`rlboost bench emulation`: the simulator against the real control plane, a few RL steps run twice.

Contract: `run_check(CheckConfig(...))` runs `steps` RL steps of the REAL hybrid runtime
(`HybridRollout`: Fleet, RolloutManager, the OffloadController, a provider, real SIGKILLs, real weight
pulls) on rollout workers whose engine is emulated (`rlboost.sim.emulated`: it sleeps through the
profile's time, plugged in through the worker's engine factory),
with a stand-in trainer that stream-trains each finished group by sleeping its modelled training
time on the reserved GPUs and publishes new weights after every step. Then it runs
`rlboost.sim.simulator.simulate` on the matching `SimConfig` (same model profile, engines, scaled
workload, instances, T_seed behaviour) and returns both step by step, with the manager's CPU time.

Matching, one for one:
- the reserved node is `reserved_engines` engines at the model's tp, and trains on their GPUs;
  an instance is one engine (gpus_per_instance = tp);
- samples: prompt g, sample j of step k carries `workload_seed(k, g, j)`, so its emulated length is
  `Workload.step(k)[g][j]` of the scaled workload the simulator is given;
- the profile's max_num_seqs, the dispatcher's cap Θ, stream_interval, the initial T_seed and the
  offload controller's settings (in modelled seconds; the runtime's in wall seconds);
- instances: `fixed` is a constant trace of `instances` for the simulator and a FixedPool ready
  before the first step for the runtime (the controller's cap cannot go below it); `trace` replays
  the same compressed segment in both, the simulator's boot time set to the runtime's measured
  provisioning time (launch to verified weights);
- weight transfers take their real time in the emulation (a tiny model's bytes: milliseconds) and
  about none in the simulator (bandwidths of 1e6 Gb/s).

Every emulated step is checked: each group and sample exactly once, every token of the step's
version, each response the emulation's exact tokens for its seed (continuation across migrations)
and exactly the workload's length.

`rlboost bench emulation [--instances 4] [--steps 4] [--json PATH]` prints the comparison and the
manager's overhead per instance count (see docs/simulator.md, "Emulated engine");
`rlboost bench control-plane` (rlboost.bench.control_plane) runs it for the manager's CPU alone.

Where it lives: the configuration in `rlboost.bench.emulation_config`, the emulated run and its
per-step check in `rlboost.bench.emulated_run`; this module holds the simulated twin, the comparison
of the two and the command.
"""


from __future__ import annotations

import dataclasses
import os
import tempfile
from dataclasses import dataclass, replace

from rlboost.bench.emulated_run import EmulatedStep, run_emulation
from rlboost.bench.emulation_config import FAST_GBPS, CheckConfig
from rlboost.sim.profile import ProfileConfig
from rlboost.spot.cost import CostConfig
from rlboost.spot.trace import TraceConfig


@dataclass
class CheckResult:
    config: CheckConfig
    emulated: list[EmulatedStep]
    simulated: list[dict]
    """The simulator's StepRecords of the same steps, as dicts."""
    startup_s: float
    """Modelled seconds an instance took from launch to verified weights in the emulation (what the
    simulator's instance_startup_s was set to; 0 for a fixed pool, ready before the first step)."""
    boot_wall_s: float
    """Wall seconds from the start of the run to the first step (Ray, workers, first weights)."""
    wall_s: float
    memory: dict = dataclasses.field(default_factory=dict)
    """The workers' processes after the first step: mean RSS and private memory (MB), and how many
    have torch loaded (Linux /proc; empty elsewhere)."""

    def rows(self) -> list[dict]:
        """Per step: simulated and emulated step time (modelled seconds), the difference, overhead."""
        ts = self.config.time_scale
        out = []
        for e, s in zip(self.emulated, self.simulated):
            sim_s = s["end_s"] - s["start_s"]
            emu_s = e.step_s / ts
            out.append({"step": e.step, "sim_step_s": sim_s, "emu_step_s": emu_s, "diff": emu_s / sim_s - 1,
                        "sim_rollout_s": s["rollout_s"], "emu_rollout_s": e.rollout_s / ts,
                        "sim_seed_s": s["seed_s"], "emu_seed_s": e.seed_s / ts,
                        "sim_migrations": s["migrations"], "emu_migrations": e.migrations,
                        "sim_instances": s["instances_start"], "emu_instances": e.instances,
                        "sim_preemptions": s["preemptions"], "emu_preemptions": e.preemptions,
                        "sim_cap": s["cap"], "emu_cap": e.cap,
                        "loop_cpu_s": e.loop_cpu_s, "driver_cpu_s": e.driver_cpu_s,
                        # overhead: CPU seconds over the wall seconds they were spent in, at the run's
                        # speed (at time_scale 1, the modelled H100 speed)
                        "loop_share": e.loop_cpu_s / e.step_s, "loop_share_rollout": e.loop_cpu_s / e.rollout_s,
                        "driver_share": e.driver_cpu_s / e.step_s})
        return out

    def summary(self) -> dict:
        rows = self.rows()
        sim = sum(r["sim_step_s"] for r in rows)
        emu = sum(r["emu_step_s"] for r in rows)
        loop = sum(e.loop_cpu_s for e in self.emulated)
        return {"instances": self.config.instances, "steps": len(rows), "sim_total_s": sim, "emu_total_s": emu,
                "diff_total": emu / sim - 1, "max_abs_diff": max(abs(r["diff"]) for r in rows),
                "loop_share": loop / sum(e.step_s for e in self.emulated),
                "loop_share_rollout": loop / sum(e.rollout_s for e in self.emulated),
                "driver_share": sum(e.driver_cpu_s for e in self.emulated) / sum(e.step_s for e in self.emulated),
                "loop_cpu_per_step_s": sum(r["loop_cpu_s"] for r in rows) / len(rows),
                "samples_per_step": self.emulated[0].samples, "tokens_per_step": emu and sum(
                    e.tokens for e in self.emulated) / len(rows),
                "time_scale": self.config.time_scale, "worker": self.config.worker,
                "boot_wall_s": self.boot_wall_s, "wall_s": self.wall_s} | self.memory

    def to_json(self) -> dict:
        return {"config": dataclasses.asdict(self.config), "summary": self.summary(), "rows": self.rows(),
                "emulated": [dataclasses.asdict(e) for e in self.emulated], "simulated": self.simulated,
                "startup_s": self.startup_s}


# ---- the simulated twin ----------------------------------------------------------------------------

def sim_config(cfg: CheckConfig, startup_s: float, trace_csv: str = ""):
    """The SimConfig matching `cfg` (see the module docstring); `trace_csv`: the constant trace of a
    fixed pool."""
    from rlboost.sim.simulator import SimConfig

    emu = cfg.emulation()
    tp = emu.profiles()[0].tp
    reserved_usd_per_s, instance_usd_per_s = cfg.prices()  # per wall second; the simulator's are per modelled one
    if cfg.provider == "fixed":
        trace = TraceConfig(path=trace_csv, sample=1.0, time_scale=1.0, seed=cfg.seed)
    else:
        trace = cfg.trace_config(wall=False)
    return SimConfig(
        model=cfg.model, policy="rlboost", segment=cfg.segment, trace=trace, reserved_nodes=1,
        gpus_per_node=cfg.reserved_engines * tp, gpus_per_instance=tp, instance_startup_s=startup_s,
        trace_gpus_per_instance=tp,  # the runtime's replay counts a trace row as one of its instances
        stream_interval=cfg.stream_interval, max_pending=cfg.max_pending, offload=cfg.offload_config(),
        initial_seed_s=cfg.seed_window_s, workload=emu.lengths(), seed=cfg.seed, duration_s=1.0,
        cost=CostConfig(reserved_usd_per_hour=reserved_usd_per_s * 3600 * cfg.time_scale,
                        instance_usd_per_hour={"spot-2xH100": instance_usd_per_s * 3600 * cfg.time_scale}),
        link_gbps=2 * FAST_GBPS, max_staleness=cfg.max_staleness, start_ahead=cfg.start_ahead,
        profile=replace(ProfileConfig(), max_num_seqs=cfg.max_num_seqs, reserved_gbps=FAST_GBPS))


def run_simulation(cfg: CheckConfig, startup_s: float) -> list[dict]:
    """The simulator's first `steps` steps of the matching run, as dicts of StepRecord."""
    from rlboost.sim.simulator import simulate

    with tempfile.TemporaryDirectory() as tmp:
        csv = os.path.join(tmp, "fixed.csv")
        duration = 30.0 * cfg.steps
        while True:
            if cfg.provider == "fixed":
                with open(csv, "w") as f:
                    f.write(f"time_s,available_instances\n0,{cfg.instances}\n{2 * duration:g},{cfg.instances}\n")
            sim = replace(sim_config(cfg, startup_s, csv), duration_s=duration)
            result = simulate(sim)
            if len(result.steps) >= cfg.steps:
                return [dataclasses.asdict(s) for s in result.steps[:cfg.steps]]
            duration *= 2


def run_check(cfg: CheckConfig, log=None) -> CheckResult:
    """The emulated run, then its simulated twin."""
    emulated, startup, boot_wall, wall, memory = run_emulation(cfg, log)
    simulated = run_simulation(cfg, startup if cfg.provider == "trace" else 0.0)
    return CheckResult(cfg, emulated, simulated, startup, boot_wall, wall, memory)


# ---- the command -----------------------------------------------------------------------------------

def table(results: list[CheckResult]) -> str:
    lines = ["| instances | step | simulated s | emulated s | difference | rollout sim / emu s | T_seed sim / emu s "
             "| instances at start sim / emu | preempted sim / emu | cap sim / emu | migrations sim / emu "
             "| manager loop CPU s | loop / step | loop / rollout | driver CPU / step |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        for row in r.rows():
            lines.append(
                f"| {r.config.instances} | {row['step']} | {row['sim_step_s']:.2f} | {row['emu_step_s']:.2f} "
                f"| {row['diff']:+.1%} | {row['sim_rollout_s']:.2f} / {row['emu_rollout_s']:.2f} "
                f"| {row['sim_seed_s']:.2f} / {row['emu_seed_s']:.2f} "
                f"| {row['sim_instances']} / {row['emu_instances']} "
                f"| {row['sim_preemptions']} / {row['emu_preemptions']} | {row['sim_cap']} / {row['emu_cap']} "
                f"| {row['sim_migrations']} / {row['emu_migrations']} "
                f"| {row['loop_cpu_s']:.3f} | {row['loop_share']:.1%} | {row['loop_share_rollout']:.1%} "
                f"| {row['driver_share']:.1%} |")
    lines += ["", "| instances | reserved engines | samples/step | worker (private MB) | time_scale | sim total s "
              "| emu total s | difference | worst step | manager loop CPU / step | loop / step time | loop / rollout "
              "| driver CPU / step time |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        s = r.summary()
        mem = f" ({s['worker_private_mb']:.0f})" if "worker_private_mb" in s else ""
        lines.append(f"| {s['instances']} | {r.config.reserved_engines} | {s['samples_per_step']} | {s['worker']}{mem} "
                     f"| {s['time_scale']:g} | {s['sim_total_s']:.1f} | {s['emu_total_s']:.1f} "
                     f"| {s['diff_total']:+.1%} "
                     f"| {s['max_abs_diff']:.1%} | {s['loop_cpu_per_step_s']:.2f} s | {s['loop_share']:.1%} "
                     f"| {s['loop_share_rollout']:.1%} | {s['driver_share']:.1%} |")
    return "\n".join(lines)


def scaled_config(instances: int, base: CheckConfig) -> CheckConfig:
    """The configuration of one instance count: 4 prompts and a quarter reserved engine per instance
    (at least the base's), so every engine carries about the same load at every scale."""
    return replace(base, instances=instances, prompts=max(base.prompts, 4 * instances),
                   reserved_engines=max(base.reserved_engines, instances // 4))


@dataclass
class EmulationBenchConfig(CheckConfig):
    """`rlboost bench emulation`: a CheckConfig run at each of several instance counts (scaled so that
    every engine carries about the same load: `scaled_config`)."""

    instances: list[int] = dataclasses.field(default_factory=lambda: [4])
    """Instance counts; each runs 4 prompts and a quarter reserved engine per instance."""
    worker: str = ""
    """`rollout` or `light`; empty: rollout up to 8 instances, light above (memory: docs/simulator.md)."""

    def checks(self) -> list[CheckConfig]:
        shared = {f.name: getattr(self, f.name) for f in dataclasses.fields(CheckConfig)
                  if f.name not in ("instances", "worker")}
        out = []
        for n in self.instances:
            cfg = replace(scaled_config(n, CheckConfig(**shared)), worker=self.worker or ("rollout" if n <= 8 else "light"))
            cfg.validate()
            out.append(cfg)
        return out


def bench_emulation(cfg: EmulationBenchConfig, log=None) -> dict:
    """Every instance count's emulated run and its simulated twin, step by step."""
    results = []
    for check in cfg.checks():
        if log:
            log(f"{check.instances} instances, {check.reserved_engines} reserved engines, {check.prompts} x "
                f"{check.samples} samples, {check.worker} workers, time_scale {check.time_scale:g}:")
        results.append(run_check(check, log))
    return {"config": dataclasses.asdict(cfg), "runs": [r.to_json() for r in results], "table": table(results)}


def render(result: dict) -> str:
    return result["table"]


__all__ = ["CheckConfig", "CheckResult", "EmulatedStep", "EmulationBenchConfig", "bench_emulation",
           "render", "run_check", "run_emulation", "run_simulation", "scaled_config", "sim_config", "table"]
