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
  instances' measured launch-to-serving time the twin was given, `sim_instances_mean` what it held;
- what bounds a faster step: the reserved GPUs' mean busy time per step, `seed_s` (the seeding window
  planned, T_seed: the reserved GPUs seed at most that long, less where the batch ahead left little to
  seed) then `train_s` (the modelled training), below which no overlap can bring the step; and
  `spot_decode_use`, the instances' generated tokens over what the instance-seconds held (booting
  included) would decode at a full batch (`max_num_seqs`, or what the KV cache fits, at the run's mean
  context): decode is memory-bound, so the rest is slots a rollout that never waits could fill.

Every emulated step is checked as the emulation check checks it, the bound included: each group and
sample once, every token within k versions, each response the emulation's exact tokens.

On one 2-core machine the emulated engines sleep through their modelled time, so the overlap shows as
it would on GPUs: the CPUs only run the control plane. The learning half of the question (does
training on stale tokens learn as well) needs real engines: with `parts` including `learning`, the
bench runs `rlboost train` (the showcase) at each of `learning_bounds` and `learning_seeds`, one row
per run (`part: "learning"`, rlboost.bench.staleness_learning). Those runs take about half an hour
each on a 2-core machine, so the default runs the emulated part only.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, replace

from rlboost.bench.emulation import CheckResult, run_check
from rlboost.bench.emulation_config import CheckConfig
from rlboost.bench.staleness_learning import learning_runs
from rlboost.configs import SHOWCASE

PARTS = ("emulated", "learning")


@dataclass
class StalenessBenchConfig(CheckConfig):
    """The emulated run of `rlboost bench emulation` (`CheckConfig`), at each staleness bound."""

    bounds: list[int] = dataclasses.field(default_factory=lambda: [0, 1, 2, 4])
    """max_staleness values to run (0: the synchronous step, the baseline of the ratios)."""
    provider: str = "trace"
    """Spot instances coming and going by the compressed trace segment (`fixed`: a constant pool)."""
    steps: int = 12
    """RL steps of each run (the first runs nothing ahead and is left out of the rates). Twelve, not
    the emulation check's six: the trace's first minute ramps from 0 to 4 instances over about three
    steps, and in six the rates and the twin's prediction hang on that ramp (docs/staleness.md)."""
    parts: list[str] = dataclasses.field(default_factory=lambda: ["emulated"])
    """Which rows to run: `emulated` (minutes), `learning` (real `rlboost train` runs: half an hour each)."""
    learning_config: str = ""
    """The learning runs' config file (empty: the showcase, rlboost/configs/showcase.yaml)."""
    learning_bounds: list[int] = dataclasses.field(default_factory=lambda: [0, 2])
    """max_staleness of the learning runs."""
    learning_seeds: list[int] = dataclasses.field(default_factory=lambda: [0, 1])
    """run.seed of the learning runs: every bound runs every seed."""
    learning_steps: int = 14
    """RL steps of every learning run (the showcase's)."""
    learning_overrides: list[str] = dataclasses.field(default_factory=lambda: ["trainer.loss=decoupled"])
    """Dotted overrides of every learning run, comma-separated on the command line. Decoupled PPO by
    default: at k = 0 it is GRPO's loss exactly, at k > 0 it weights each token by its behaviour policy."""
    learning_dir: str = "outputs/bench/staleness_learning"
    """Where the learning runs' folders go (`k<k>_seed<seed>`; a run's old folder is replaced)."""

    def validate(self) -> None:
        """The emulated runs' configs are checked here; the learning runs' by the CLI, which loads
        `train_runs()` as `rlboost train` would, before anything runs."""
        unknown = sorted(set(self.parts) - set(PARTS))
        if unknown or not self.parts:
            raise ValueError(f"parts={','.join(self.parts)}: each of {', '.join(PARTS)}")
        if "emulated" in self.parts:
            self.checks()
        if "learning" in self.parts:
            self.train_runs()

    def train_runs(self) -> list[tuple[str, list[str]]]:
        """(config file, overrides) of each learning bound's `rlboost train`, the seed aside (the CLI
        checks each as the run will load it); none unless `parts` has `learning`."""
        if "learning" not in self.parts:
            return []
        if not self.learning_seeds or not self.learning_bounds:
            raise ValueError("learning_bounds and learning_seeds: at least one each")
        if self.learning_steps < 1:
            raise ValueError(f"learning_steps must be >= 1, got {self.learning_steps}")
        return [(self.learning_config or str(SHOWCASE),
                 [*self.learning_overrides, f"run.total_steps={self.learning_steps}", f"algorithm.max_staleness={k}"])
                for k in self.learning_bounds]

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
    full_batch_rate = _instance_full_batch_rate(cfg, tokens / max(1, sum(e.samples for e in emulated)))
    instance_tokens = sum(e.tokens * e.preemptible_share for e in emulated)
    instance_s = sum(e.instance_s for e in emulated) / ts
    return {"part": "emulated", "k": cfg.max_staleness, "start_ahead": cfg.start_ahead if cfg.max_staleness else None,
            "steps": n, "tokens_per_s": rate, "step_s": emu_s / n,
            "trainer_idle_s": sum(e.wait_train_s for e in emulated) / n / ts,
            "spot_idle_s": sum(e.wait_remote_s for e in emulated) / n / ts,
            "instances_mean": sum(e.instances for e in emulated) / n,
            "preemptions": sum(e.preemptions for e in emulated),
            "sim_tokens_per_s": sim_rate, "sim_diff": rate / sim_rate - 1,
            "startup_s": result.startup_s if cfg.provider == "trace" else 0.0,  # a fixed pool serves from the start
            "sim_instances_mean": sum(s["instances_start"] for s in simulated) / n,
            "seed_s": sum(e.seed_s for e in emulated) / n / ts, "train_s": sum(e.train_s for e in emulated) / n / ts,
            "spot_decode_use": instance_tokens / (instance_s * full_batch_rate) if instance_s else 0.0}


def _instance_full_batch_rate(cfg: CheckConfig, mean_response: float) -> float:
    """Modelled decode tokens/s of one instance's engine at a full batch, its samples at the run's mean
    context (the prompt and half the mean response)."""
    engine, _ = cfg.emulation().profiles()
    context = cfg.prompt_len + mean_response / 2
    return engine.tokens_per_s(max(1, engine.max_batch(context)), context)


def bench_staleness(cfg: StalenessBenchConfig, log=None, save_partial=None) -> dict:
    """Each bound's emulated run and its simulated twin, then the learning runs, as `parts` says; rows
    as in the module docstring, the emulated rate relative to k = 0 where it ran. `save_partial` is
    called with the result so far after each row."""
    result = {"config": dataclasses.asdict(cfg), "results": []}
    rows = result["results"]
    if "emulated" in cfg.parts:
        for check in cfg.checks():
            if log:
                log(f"max_staleness {check.max_staleness}: {check.instances} instances ({check.provider}), "
                    f"{check.prompts} x {check.samples} samples, {check.steps} steps, time_scale {check.time_scale:g}:")
            rows.append(row(run_check(check, log)))
            if save_partial:
                save_partial(result)
        emulated = [r for r in rows if r["part"] == "emulated"]
        base = next((r for r in emulated if r["k"] == 0), None)
        for r in emulated:
            if base is not None:
                r["vs_k0"] = r["tokens_per_s"] / base["tokens_per_s"]
    if "learning" in cfg.parts:
        for learned in learning_runs(cfg.learning_config, cfg.learning_bounds, cfg.learning_seeds, cfg.learning_steps,
                                     cfg.learning_dir, cfg.learning_overrides, log):
            rows.append(learned)
            if save_partial:
                save_partial(result)
    return result


def render(result: dict) -> str:
    emulated = [r for r in result["results"] if r["part"] == "emulated"]
    learned = [r for r in result["results"] if r["part"] == "learning"]
    return "\n\n".join(table for table in (render_emulated(emulated) if emulated else "",
                                            render_learning(learned) if learned else "") if table)


def render_learning(rows: list[dict]) -> str:
    lines = ["| k | seed | steps | held-out first | held-out last | reward first | reward last | ESS mean "
             "| staleness mean | staleness max | preempted | migrated | wall s |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['k']} | {r['seed']} | {r['steps']} | {r['val_first']:.3f} | {r['val_last']:.3f} "
                     f"| {r['reward_first']:.3f} | {r['reward_last']:.3f} | {r['ess_mean']:.3f} "
                     f"| {r['staleness_mean']:.3f} | {r['staleness_max']:.0f} | {r['preemptions']:.0f} "
                     f"| {r['migrated']:.0f} | {r['wall_s']:.0f} |")
    for k in sorted({r["k"] for r in rows}):
        runs = [r for r in rows if r["k"] == k]
        lines.append(f"| {k} | mean of {len(runs)} | | {sum(r['val_first'] for r in runs) / len(runs):.3f} "
                     f"| {sum(r['val_last'] for r in runs) / len(runs):.3f} | | | "
                     f"{sum(r['ess_mean'] for r in runs) / len(runs):.3f} | "
                     f"{sum(r['staleness_mean'] for r in runs) / len(runs):.3f} | | | | |")
    return "\n".join(lines)


def render_emulated(rows: list[dict]) -> str:
    lines = ["| k | tokens/s | vs k = 0 | step s | trainer idle s | spot idle s | T_seed s | train s "
             "| instance decode use | instances | preempted | simulated tokens/s | emulated vs simulated "
             "| startup s | simulated instances |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        versus = f"{r['vs_k0']:.2f}x" if "vs_k0" in r else "-"
        lines.append(f"| {r['k']} | {r['tokens_per_s']:,.0f} | {versus} | {r['step_s']:.1f} | {r['trainer_idle_s']:.2f} "
                     f"| {r['spot_idle_s']:.2f} | {r['seed_s']:.1f} | {r['train_s']:.1f} | {r['spot_decode_use']:.0%} "
                     f"| {r['instances_mean']:.1f} | {r['preemptions']} "
                     f"| {r['sim_tokens_per_s']:,.0f} | {r['sim_diff']:+.1%} | {r['startup_s']:.1f} "
                     f"| {r['sim_instances_mean']:.1f} |")
    return "\n".join(lines)


__all__ = ["PARTS", "StalenessBenchConfig", "bench_staleness", "render", "row"]
