"""`rlboost bench staleness`: what running rollout ahead of the trainer buys (docs/staleness.md).

Contract: `bench_staleness(StalenessBenchConfig(...))` runs, for each bound k of `bounds`, the emulation
check's run (`rlboost.bench.emulation.run_check`): `steps` RL steps of the REAL hybrid runtime on
emulated engines at modelled H100 speed, spot instances coming and going by a compressed trace segment,
a stand-in trainer sleeping its modelled training time, at `max_staleness` = k; and the simulator's
twin of the same run. One row per k (`part: "emulated"`):
- `tokens_per_s`: response tokens of the run over its modelled seconds (wall / time_scale), the first
  step left out (nothing runs ahead of it);
- `step_s`: the mean modelled step; `trainer_idle_s`: the stand-in trainer's mean wait for groups
  once it has the reserved GPUs; `spot_idle_s`: the mean time from the step's last response to its end;
- `sim_tokens_per_s`: the simulator's prediction of the same run, and `sim_diff`; `startup_s`: the
  instances' measured launch-to-serving time the twin was given, `sim_instances_mean` what it held.

Every emulated step is checked as the emulation check checks it, the bound included: each group and
sample once, every token within k versions, each response the emulation's exact tokens.

On one 2-core machine the emulated engines sleep through their modelled time, so the overlap shows as
it would on GPUs: the CPUs only run the control plane. The learning half of the question (does
training on stale tokens learn as well) needs real engines: `rlboost train` at the bounds to compare.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, replace

from rlboost.bench.emulation import CheckResult, run_check
from rlboost.bench.emulation_config import CheckConfig


@dataclass
class StalenessBenchConfig(CheckConfig):
    """The emulated run of `rlboost bench emulation` (`CheckConfig`), at each staleness bound."""

    bounds: list[int] = dataclasses.field(default_factory=lambda: [0, 1, 2, 4])
    """max_staleness values to run (0: the synchronous step, the baseline of the ratios)."""
    provider: str = "trace"
    """Spot instances coming and going by the compressed trace segment (`fixed`: a constant pool)."""
    steps: int = 6
    """RL steps of each run (the first runs nothing ahead and is left out of the rates)."""

    def checks(self) -> list[CheckConfig]:
        shared = {f.name: getattr(self, f.name) for f in dataclasses.fields(CheckConfig)}
        out = []
        for k in self.bounds:
            cfg = replace(CheckConfig(**shared), max_staleness=k)
            cfg.validate()
            out.append(cfg)
        return out


def row(result: CheckResult) -> dict:
    """The bound's row (the module docstring), from its emulated run and its simulated twin."""
    cfg = result.config
    ts = cfg.time_scale
    emulated = result.emulated[1:]
    simulated = result.simulated[1:len(result.emulated)]
    tokens = sum(e.tokens for e in emulated)
    emu_s = sum(e.step_s for e in emulated) / ts
    sim_tokens = sum(s["tokens_trained"] for s in simulated)
    sim_s = sum(s["end_s"] - s["start_s"] for s in simulated)
    rate, sim_rate = tokens / emu_s, sim_tokens / sim_s
    n = len(emulated)
    return {"part": "emulated", "k": cfg.max_staleness, "steps": n, "tokens_per_s": rate, "step_s": emu_s / n,
            "trainer_idle_s": sum(e.wait_train_s for e in emulated) / n / ts,
            "spot_idle_s": sum(e.wait_remote_s for e in emulated) / n / ts,
            "instances_mean": sum(e.instances for e in emulated) / n,
            "preemptions": sum(e.preemptions for e in emulated),
            "sim_tokens_per_s": sim_rate, "sim_diff": rate / sim_rate - 1,
            "startup_s": result.startup_s if cfg.provider == "trace" else 0.0,  # a fixed pool serves from the start
            "sim_instances_mean": sum(s["instances_start"] for s in simulated) / n}


def bench_staleness(cfg: StalenessBenchConfig, log=None) -> dict:
    """Each bound's emulated run and its simulated twin; rows as in the module docstring, with the rate
    relative to k = 0 where it ran."""
    rows = []
    for check in cfg.checks():
        if log:
            log(f"max_staleness {check.max_staleness}: {check.instances} instances ({check.provider}), "
                f"{check.prompts} x {check.samples} samples, {check.steps} steps, time_scale {check.time_scale:g}:")
        rows.append(row(run_check(check, log)))
    base = next((r for r in rows if r["k"] == 0), None)
    for r in rows:
        if base is not None:
            r["vs_k0"] = r["tokens_per_s"] / base["tokens_per_s"]
    return {"config": dataclasses.asdict(cfg), "results": rows}


def render(result: dict) -> str:
    lines = ["| k | tokens/s | vs k = 0 | step s | trainer idle s | spot idle s | instances | preempted "
             "| simulated tokens/s | emulated vs simulated | startup s | simulated instances |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in result["results"]:
        versus = f"{r['vs_k0']:.2f}x" if "vs_k0" in r else "-"
        lines.append(f"| {r['k']} | {r['tokens_per_s']:,.0f} | {versus} | {r['step_s']:.1f} | {r['trainer_idle_s']:.2f} "
                     f"| {r['spot_idle_s']:.2f} | {r['instances_mean']:.1f} | {r['preemptions']} "
                     f"| {r['sim_tokens_per_s']:,.0f} | {r['sim_diff']:+.1%} | {r['startup_s']:.1f} "
                     f"| {r['sim_instances_mean']:.1f} |")
    return "\n".join(lines)


__all__ = ["StalenessBenchConfig", "bench_staleness", "render", "row"]
