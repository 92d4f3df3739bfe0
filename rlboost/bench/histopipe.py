"""`rlboost bench histopipe`: what HistoPipe's ordering does to a rollout step's tail.

A step of the simulator's workload (128 prompts x 8 samples, long-tailed lengths that correlate per
prompt and recur every epoch, `rlboost.sim.workload`) is list-scheduled onto E engines with S slots
each (`rlboost.policies.histopipe.simulate_tail`, a decode step of b samples costing what the
H100 profile of `rlboost.sim.profile` says). Twice per step, in one run: in the dataset's order
(default scheduling) and in HistoPipe's order, drawn from the previous epoch's lengths of the same
prompts (history that is correlated, not exact: each epoch draws new lengths). Reported per (E, S):
the tail (first engine done -> last engine done) and the makespan, averaged over the steps.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from rich.table import Table

from rlboost.policies.histopipe import HistoPipe, HistoPipeConfig, SampleInfo, simulate_tail


@dataclass
class HistoPipeBenchConfig:
    model: str = "qwen3-8b"
    """Profile (`rlboost.sim.specs.MODELS`) whose decode step time prices a batch."""
    engines: list[int] = field(default_factory=lambda: [8, 16])
    """Rollout engines (8: one 8xH100 node at tp 1; 16: plus four 2xH100 instances)."""
    slots: list[int] = field(default_factory=lambda: [32, 64, 128])
    """Samples an engine runs at once (its KV capacity); the rest queue."""
    steps: int = 8
    """Steps measured, each after an epoch of history."""
    alternate: bool = False
    """rollout.histopipe.alternate: odd steps shortest first."""
    seed: int = 0


def bench_histopipe(cfg: HistoPipeBenchConfig) -> dict:
    from rlboost.sim.profile import make_profiles
    from rlboost.sim.workload import Workload, WorkloadConfig

    wcfg = WorkloadConfig(seed=cfg.seed)
    wcfg.dataset_size = wcfg.prompts_per_step  # every step is a new epoch of the same prompts
    workload = Workload(wcfg)
    engine, _ = make_profiles(cfg.model)
    context = wcfg.prompt_len + wcfg.median_response

    def step_cost(batch: int) -> float:
        return engine.step_s(batch, batch * context)

    results = []
    for engines in cfg.engines:
        for slots in cfg.slots:
            pipe = HistoPipe(HistoPipeConfig(enabled=True, alternate=cfg.alternate))
            pipe.observe_step(_by_prompt(workload, 0))
            base, piped = [], []
            for step in range(1, cfg.steps + 1):
                lengths = {f"{g}:{j}": n for g, row in enumerate(workload.step(step)) for j, n in enumerate(row)}
                infos = [SampleInfo(uid, f"p{uid.split(':')[0]}", int(uid.split(':')[0])) for uid in lengths]
                order = pipe.order(step, infos)
                base.append(simulate_tail(list(lengths.values()), engines, slots, step_cost))
                piped.append(simulate_tail([lengths[uid] for uid in order], engines, slots, step_cost))
                pipe.observe_step(_by_prompt(workload, step))
            row = {"engines": engines, "slots": slots,
                   "tail_s_base": _mean(last - first for first, last in base),
                   "tail_s_histopipe": _mean(last - first for first, last in piped),
                   "makespan_s_base": _mean(last for _, last in base),
                   "makespan_s_histopipe": _mean(last for _, last in piped)}
            row["tail_ratio"] = row["tail_s_histopipe"] / row["tail_s_base"] if row["tail_s_base"] else 1.0
            row["makespan_ratio"] = row["makespan_s_histopipe"] / row["makespan_s_base"]
            results.append(row)
    return {"config": asdict(cfg), "results": results}


def _by_prompt(workload, step: int) -> dict[str, list[int]]:
    return {f"p{g}": row for g, row in enumerate(workload.step(step))}


def _mean(values) -> float:
    values = list(values)
    return sum(values) / len(values)


def render(result: dict) -> Table:
    table = Table(title=f"HistoPipe on a step of {result['config']['model']} "
                        f"(mean of {result['config']['steps']} steps)")
    for col in ("engines", "slots", "tail s: default", "tail s: HistoPipe", "tail ratio",
                "makespan s: default", "makespan s: HistoPipe", "makespan ratio"):
        table.add_column(col, justify="right")
    for r in result["results"]:
        table.add_row(str(r["engines"]), str(r["slots"]), f"{r['tail_s_base']:.0f}", f"{r['tail_s_histopipe']:.0f}",
                      f"{r['tail_ratio']:.2f}", f"{r['makespan_s_base']:.0f}", f"{r['makespan_s_histopipe']:.0f}",
                      f"{r['makespan_ratio']:.2f}")
    return table
