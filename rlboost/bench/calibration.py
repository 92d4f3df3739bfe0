"""`rlboost bench calibration`: how the simulator's performance model is calibrated, as tables.

The H100 profile (`rlboost.sim.profile`) has one fitted factor, `mem_efficiency`, chosen so that veRL
on Qwen3-8B on one 8xH100 node makes `CALIBRATION_TARGET` tokens/s (`rlboost.sim.baselines`). This
prints that fit, how it leans on every fixed factor, what the calibrated profile gives for each model,
the workload's length statistics and how sensitive veRL's throughput is to the workload's shape: the
tables of docs/simulator.md, regenerated. Pure arithmetic on the models: about a minute on 2 cores.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace
from collections.abc import Sequence

from rlboost.sim.baselines import CALIBRATION_TARGET, colocated_run
from rlboost.sim.profile import ProfileConfig, make_profiles
from rlboost.sim.specs import MODELS
from rlboost.sim.workload import Workload, WorkloadConfig


@dataclass
class CalibrationBenchConfig:
    steps: int = 32
    """veRL steps averaged per number (32: one epoch of the default workload's 4096 prompts)."""
    factors: bool = True
    """Also refit mem_efficiency with each fixed factor moved (the slowest table)."""


def bench_calibration(cfg: CalibrationBenchConfig) -> dict:
    profile = ProfileConfig()
    run = colocated_run("qwen3-8b", cfg=profile, steps=cfg.steps)
    result = {"config": asdict(cfg), "target_tokens_per_s": CALIBRATION_TARGET,
              "verl_qwen3_8b_tokens_per_s": run["tokens_per_s"],
              "fitted_mem_efficiency": fit_mem_efficiency(profile, steps=cfg.steps),
              "tables": {"calibration": calibration_table(profile),
                         "models": model_table(profile, cfg.steps),
                         "workload": stats_table({"default": WorkloadConfig()}, steps=cfg.steps),
                         "workload_sensitivity": sensitivity_table(cfg.steps),
                         "constants": config_table(profile)}}
    if cfg.factors:
        result["tables"]["factors"] = factor_table(profile)
    return result


def render(result: dict) -> str:
    """The tables, as markdown (they are pasted into docs/simulator.md)."""
    lines = [f"Calibration: veRL qwen3-8b on 8xH100, {result['config']['steps']} steps of the default workload: "
             f"{result['verl_qwen3_8b_tokens_per_s']:,.0f} tokens/s (target {result['target_tokens_per_s']:,.0f}, "
             f"{result['verl_qwen3_8b_tokens_per_s'] / result['target_tokens_per_s'] - 1:+.1%}); fitted "
             f"mem_efficiency (exact) {result['fitted_mem_efficiency']:.3f}", ""]
    titles = {"calibration": "The fitted factor", "factors": "How the fit leans on each fixed factor",
              "models": "veRL on one 8xH100 node, per model (* the batch's KV at 4K context does not fit)",
              "workload": "The default workload", "workload_sensitivity": "veRL Qwen3-8B under other workloads",
              "constants": "The constants in use"}
    for key, title in titles.items():
        if key in result["tables"]:
            lines += [f"## {title}", "", result["tables"][key], ""]
    return "\n".join(lines)


def model_table(cfg: ProfileConfig | None = None, steps: int = 32) -> str:
    """The markdown table of docs/simulator.md: veRL on one 8xH100 node and one engine's decode speed."""
    cfg = cfg if cfg is not None else ProfileConfig()
    lines = ["| model | params | tp | engines/node | rollout_s | train_s | tokens/s per node | tokens/s per GPU "
             "| KV evictions/step | engine decode tokens/s at 4K context: batch 1 / 64 / 256 |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for name in MODELS:
        run = colocated_run(name, cfg=cfg, steps=steps)
        engine, _ = make_profiles(name, cfg)
        decode = []
        for batch in (1, 64, 256):
            mark = "*" if batch * 4096 > engine.kv_capacity_tokens else ""
            decode.append(f"{engine.tokens_per_s(batch, 4096):,.0f}{mark}")
        lines.append(f"| {name} | {engine.model.params / 1e9:.2f}B | {run['tp']} | {run['engines']} "
                     f"| {run['rollout_s']:.0f} | {run['train_s']:.0f} | {run['tokens_per_s']:,.0f} "
                     f"| {run['tokens_per_gpu_s']:,.0f} | {run['preemptions']:.0f} | {' / '.join(decode)} |")
    return "\n".join(lines)


def config_table(cfg: ProfileConfig | None = None) -> str:
    """The constants in use, as a markdown table."""
    cfg = cfg if cfg is not None else ProfileConfig()
    lines = ["| field | value |", "|---|---|"]
    lines += [f"| `{f.name}` | {getattr(cfg, f.name)} |" for f in fields(cfg)]
    return "\n".join(lines)


def calibration_table(cfg: ProfileConfig | None = None,
                      efficiencies: Sequence[float] = (0.6, 0.65, 0.7, 0.75, 0.8)) -> str:
    """veRL Qwen3-8B tokens/s per node against the fitted factor, mem_efficiency, as a markdown table."""
    cfg = cfg if cfg is not None else ProfileConfig()
    lines = ["| mem_efficiency | rollout_s | train_s | tokens/s per node | vs target |", "|---|---|---|---|---|"]
    for eff in efficiencies:
        run = colocated_run("qwen3-8b", cfg=replace(cfg, mem_efficiency=eff))
        lines.append(f"| {eff:g}{' (default)' if eff == cfg.mem_efficiency else ''} | {run['rollout_s']:.0f} "
                     f"| {run['train_s']:.0f} | {run['tokens_per_s']:,.0f} "
                     f"| {run['tokens_per_s'] / CALIBRATION_TARGET - 1:+.1%} |")
    return "\n".join(lines)


def fit_mem_efficiency(cfg: ProfileConfig | None = None, target: float = CALIBRATION_TARGET,
                       steps: int = 32, tolerance: float = 1e-3) -> float:
    """The mem_efficiency at which veRL Qwen3-8B on one 8xH100 node makes `target` tokens/s, the other
    factors as in `cfg` (bisection: throughput only grows with bandwidth). Raises ValueError when no
    efficiency in (0, 1] reaches the target."""
    cfg = cfg if cfg is not None else ProfileConfig()

    def throughput(eff: float) -> float:
        return colocated_run("qwen3-8b", cfg=replace(cfg, mem_efficiency=eff), steps=steps)["tokens_per_s"]

    lo, hi = 0.05, 1.0
    if throughput(hi) < target or throughput(lo) > target:
        raise ValueError(f"no mem_efficiency in [{lo}, {hi}] gives {target:,.0f} tokens/s with these factors")
    while hi - lo > tolerance:
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if throughput(mid) < target else (lo, mid)
    return (lo + hi) / 2


def factor_table(cfg: ProfileConfig | None = None) -> str:
    """How the calibration leans on each fixed factor: veRL Qwen3-8B tokens/s with that factor moved
    (mem_efficiency kept), and the mem_efficiency the fit would then need."""
    cfg = cfg if cfg is not None else ProfileConfig()
    moves = [("train_mfu", 0.25), ("train_mfu", 0.45), ("compute_mfu_decode", 0.3), ("compute_mfu_decode", 0.6),
             ("step_overhead_s", 0.002), ("step_overhead_s", 0.005), ("kv_memory_fraction", 0.5),
             ("kv_memory_fraction", 0.9), ("prefill_mfu", 0.3), ("train_flops_factor", 6.0)]
    lines = ["| factor moved | tokens/s per node (mem_efficiency kept) | refitted mem_efficiency |", "|---|---|---|"]
    for name, value in moves:
        moved = replace(cfg, **{name: value})
        run = colocated_run("qwen3-8b", cfg=moved)
        try:
            refit = f"{fit_mem_efficiency(moved, tolerance=0.005):.2f}"
        except ValueError:
            refit = "none in (0, 1]"
        lines.append(f"| `{name}` {getattr(cfg, name):g} -> {value:g} | {run['tokens_per_s']:,.0f} "
                     f"| {refit} |")
    return "\n".join(lines)


def stats_table(configs: dict[str, WorkloadConfig], steps: int = 8) -> str:
    """Length statistics of each named workload, as a markdown table."""
    lines = ["| workload | mean | median | p90 | p99 | at the cap |", "|---|---|---|---|---|---|"]
    for name, cfg in configs.items():
        st = Workload(cfg).stats(steps)
        lines.append(f"| {name} | {st['mean']:,.0f} | {st['median']:,.0f} | {st['p90']:,.0f} | {st['p99']:,.0f} "
                     f"| {st['truncated']:.1%} |")
    return "\n".join(lines)


def sensitivity_configs() -> dict[str, WorkloadConfig]:
    """The default workload and one-at-a-time variations of its shape."""
    base = WorkloadConfig()
    variants = {"default (median 3500, sigma 0.7, within 0.4)": base}
    for factor in (0.5, 2.0):
        variants[f"median x{factor:g}"] = replace(base, median_response=round(base.median_response * factor))
    for sigma in (0.4, 1.0):
        variants[f"sigma {sigma}"] = replace(base, sigma=sigma)
    for within in (0.2, 0.6):
        variants[f"within_group_sigma {within}"] = replace(base, within_group_sigma=within)
    variants["uniform on [1, 2 x median]"] = replace(base, distribution="uniform")
    variants["fixed at the median"] = replace(base, distribution="fixed")
    return variants


def sensitivity_table(steps: int = 32) -> str:
    """veRL on Qwen3-8B (one 8xH100 node, calibrated profile) under each workload variation."""
    lines = ["| workload | mean length | at the cap | rollout_s | train_s | tokens/s per node | vs default |",
             "|---|---|---|---|---|---|---|"]
    baseline = None
    for name, cfg in sensitivity_configs().items():
        st = Workload(cfg).stats(steps)
        run = colocated_run("qwen3-8b", workload=cfg, steps=steps)
        baseline = baseline if baseline is not None else run["tokens_per_s"]
        lines.append(f"| {name} | {st['mean']:,.0f} | {st['truncated']:.1%} | {run['rollout_s']:.0f} "
                     f"| {run['train_s']:.0f} | {run['tokens_per_s']:,.0f} "
                     f"| {run['tokens_per_s'] / baseline - 1:+.0%} |")
    return "\n".join(lines)


__all__ = ["CalibrationBenchConfig", "bench_calibration", "fit_mem_efficiency", "render"]
