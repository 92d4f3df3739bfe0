"""`rlboost simulate`: every policy on every model and trace segment, relative to veRL, as a table, a
JSON file and plots (throughput over time above instance availability; bars of relative throughput
and cost efficiency next to the RLBoost paper's numbers)."""

from __future__ import annotations

from dataclasses import asdict, replace
from pathlib import Path

from rich.table import Table

from rlboost.sim.simulator import POLICIES, SimConfig, SimResult, best_verl_async, offered_instances, simulate

PAPER_RLBOOST = {"qwen3-8b": (1.66, 1.34), "qwen3-14b": (1.97, 1.49), "qwen3-32b": (1.51, 1.28)}
"""RLBoost vs veRL in the paper, averaged over segments A, B, C: (throughput, cost efficiency)."""
MODELS = ("qwen3-8b", "qwen3-14b", "qwen3-32b")


def windows(base: SimConfig, segments: str = "ABC", spec: str = "") -> dict[str, SimConfig]:
    """The runs of one model and policy, by label. The bundled trace: one run per named segment. A
    CSV of one's own (`trace.path`): one run over its whole length ("all"), or one per window of
    `spec`, hours as "0-2,2-4.5" (an end past the file's is clipped to it)."""
    if not base.trace.path:
        if spec:
            raise ValueError("--windows applies to a trace of one's own (trace.path); the bundled trace has --segments")
        return {segment: replace(base, segment=segment) for segment in segments}
    length_h = offered_instances(replace(base, trace=replace(base.trace, start_h=0.0, end_h=0.0))).duration_s
    length_h = length_h * base.trace.time_scale / 3600
    runs = {}
    for part in (spec.split(",") if spec else [""]):
        if part:
            try:
                start_h, end_h = (float(x) for x in part.split("-"))
            except ValueError:
                raise ValueError(f"--windows: {part!r} is not a window in hours like 0-2") from None
            if not 0 <= start_h < min(end_h, length_h):
                raise ValueError(f"--windows: {part!r} is empty or outside the trace (0-{length_h:g} h)")
            end_h = min(end_h, length_h)
        else:
            start_h, end_h = 0.0, length_h
        trace = replace(base.trace, start_h=start_h, end_h=end_h if end_h < length_h else 0.0)
        runs[part or "all"] = replace(base, trace=trace, duration_s=(end_h - start_h) * 3600 / base.trace.time_scale)
    return runs


STALENESS = (1, 2, 4)
"""The bounds `rlboost simulate` also runs rlboost at, beside the config's own (`--staleness`)."""


def label(row: dict) -> str:
    """A row's policy, with its staleness bound where rlboost runs several."""
    k = row["max_staleness"]
    return f"{row['policy']} k={k}" if row["policy"].startswith("rlboost") and k else row["policy"]


def evaluate(base: SimConfig, models=MODELS, segments: str = "ABC", policies=POLICIES,
             window_spec: str = "", staleness=()) -> tuple[dict, dict[tuple[str, str, str], SimResult]]:
    """Simulate every (model, trace window, policy); rows as in the JSON, plus `avg` rows over the
    windows. A window is a segment of the bundled trace or a window of one's own CSV (`windows`).
    `staleness`: bounds rlboost also runs at, each a row of policy rlboost with its `max_staleness`
    (runs keyed by `label`: "rlboost k=2")."""
    rows, runs = [], {}
    runs_by_label = windows(base, segments, window_spec)
    for model in models:
        # veRL and the static split use no instances: one run stands for every window as long
        fixed: dict[tuple[str, float], SimResult] = {}
        for window, config in runs_by_label.items():
            for policy in ("verl",) + tuple(p for p in policies if p != "verl"):
                key = (policy, config.duration_s)
                if key in fixed:
                    r = fixed[key]
                elif policy == "verl-async":  # the baseline at its best staleness bound and split
                    r = fixed[key] = best_verl_async(replace(config, model=model))
                else:
                    bound = config.max_staleness if policy.startswith("rlboost") else 0  # the others: synchronous
                    r = simulate(replace(config, model=model, policy=policy, max_staleness=bound))
                    if policy in ("verl", "verl2x", "disagg"):
                        fixed[key] = r
                runs[(model, window, policy)] = r
                if policy in policies:
                    rows.append(_row(model, window, policy, r, runs[(model, window, "verl")],
                                     runs.get((model, window, "verl-async"))))
            for k in staleness if "rlboost" in policies else ():
                if k == config.max_staleness:
                    continue  # the rlboost row already
                r = simulate(replace(config, model=model, policy="rlboost", max_staleness=k))
                row = _row(model, window, "rlboost", r, runs[(model, window, "verl")],
                           runs.get((model, window, "verl-async")))
                runs[(model, window, label(row))] = r
                rows.append(row)
        for policy in dict.fromkeys(label(row) for row in rows if row["model"] == model):
            per = [row for row in rows if row["model"] == model and label(row) == policy]
            rows.append({"model": model, "segment": "avg", "policy": per[0]["policy"],
                         **{k: sum(row[k] for row in per) / len(per) for k in _AVERAGED if k in per[0]},
                         "worst_step_rel_verl": min(row["worst_step_rel_verl"] for row in per),
                         "max_staleness": per[0]["max_staleness"], "rollout_gpus": per[0]["rollout_gpus"]})
    return {"config": asdict(base), "results": rows}, runs


_AVERAGED = ("throughput_tokens_per_s", "cost_usd", "tokens_per_usd", "throughput_rel_verl",
             "cost_efficiency_rel_verl", "instances_mean", "preemptions", "throughput_rel_verl_async",
             "cost_efficiency_rel_verl_async", "step_s", "train_s")


def worst_step(r: SimResult, verl: SimResult) -> float:
    """The lowest throughput of a step relative to veRL's same step (the same samples): the regret a
    user would see at a glance. Steps past veRL's last are compared with nothing."""
    ratios = [(b.end_s - b.start_s) / (s.end_s - s.start_s) * s.tokens_trained / b.tokens_trained
              for s, b in zip(r.steps, verl.steps) if s.end_s > s.start_s and b.tokens_trained]
    return min(ratios, default=1.0)


def _row(model: str, segment: str, policy: str, r: SimResult, verl: SimResult,
         verl_async: SimResult | None = None) -> dict:
    """One run's row; with `verl_async` (when that baseline ran), its ratios to it too."""
    rel = r.relative_to(verl)
    row = {"model": model, "segment": segment, "policy": policy,
           "throughput_tokens_per_s": r.throughput_tokens_per_s, "cost_usd": r.cost_usd,
           "tokens_per_usd": r.tokens_per_usd, "throughput_rel_verl": rel["throughput"],
           "cost_efficiency_rel_verl": rel["cost_efficiency"],
           "instances_mean": r.instance_seconds / r.wall_s if r.wall_s else 0.0,
           "preemptions": r.preemptions, "steps": len(r.steps), "worst_step_rel_verl": worst_step(r, verl),
           "max_staleness": r.config.max_staleness, "rollout_gpus": r.rollout_gpus,
           # the trainer's compute per step: no overlap of rollout with training makes a step shorter
           "step_s": r.wall_s / len(r.steps) if r.steps else 0.0,
           "train_s": sum(s.train_s for s in r.steps) / len(r.steps) if r.steps else 0.0}
    if verl_async is not None:
        versus = r.relative_to(verl_async)
        row |= {"throughput_rel_verl_async": versus["throughput"],
                "cost_efficiency_rel_verl_async": versus["cost_efficiency"]}
    return row


def render(result: dict) -> Table:
    table = Table(title="simulated runs, relative to veRL (colocated) on the same model and trace window")
    for col in ("model", "segment", "policy", "tokens/s", "vs verl", "tokens/$", "vs verl", "worst step", "instances",
                "preemptions", "paper"):
        table.add_column(col, justify="left" if col in ("model", "segment", "policy") else "right")
    for row in sorted(result["results"], key=lambda r: (r["model"], r["segment"] == "avg", r["segment"])):
        paper = ""
        bundled = not result["config"]["trace"]["path"]  # the paper's numbers are for the bundled segments
        if bundled and row["segment"] == "avg" and label(row) == "rlboost" and row["model"] in PAPER_RLBOOST:
            paper = "{:.2f}x / {:.2f}x".format(*PAPER_RLBOOST[row["model"]])
        style = "bold" if row["segment"] == "avg" else None
        policy = label(row)
        if policy == "verl-async":  # the baseline at its best: say which bound and split won
            policy += f" (k={row['max_staleness']}, {row['rollout_gpus']} rollout GPUs)"
        table.add_row(row["model"], row["segment"], policy, f"{row['throughput_tokens_per_s']:,.0f}",
                      f"{row['throughput_rel_verl']:.2f}x", f"{row['tokens_per_usd']:,.0f}",
                      f"{row['cost_efficiency_rel_verl']:.2f}x", f"{row['worst_step_rel_verl']:.2f}x",
                      f"{row['instances_mean']:.1f}",
                      f"{row['preemptions']:.0f}", paper, style=style)
    return table


def plot(result: dict, runs: dict[tuple[str, str, str], SimResult], out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    written = []
    models = list(dict.fromkeys(k[0] for k in runs))
    segments = list(dict.fromkeys(k[1] for k in runs))
    policies = list(dict.fromkeys(label(r) for r in result["results"]))
    for model in models:
        fig, axes = plt.subplots(2, len(segments), figsize=(5 * len(segments), 6), sharex=True,
                                 gridspec_kw={"height_ratios": [3, 1.3]}, squeeze=False)
        for j, segment in enumerate(segments):
            top, bottom = axes[0][j], axes[1][j]
            for policy in policies:
                r = runs[(model, segment, policy)]
                t = [s.end_s / 60 for s in r.steps]
                tput = [s.tokens_trained / (s.end_s - s.start_s) for s in r.steps]
                top.step(t, tput, where="pre", label=policy)
            top.set_title(f"{model}, segment {segment}")
            top.set_ylabel("tokens/s (per step)")
            r = runs[(model, segment, "rlboost")] if (model, segment, "rlboost") in runs else None
            if r is not None:
                trace = offered_instances(r.config)
                bottom.step([x / 60 for x in trace.times_s], trace.counts, where="post", color="0.75", linewidth=3,
                            label="available")
                bottom.step([x / 60 for x, _ in r.timeline], [n for _, n in r.timeline], where="post",
                            label="held by rlboost")
                caps = [(x / 60, c) for x, c in r.caps if c is not None]
                if caps:
                    bottom.step([x for x, _ in caps], [c for _, c in caps], where="post", linestyle=":",
                                label="cap")
            bottom.set_xlabel("minutes")
            bottom.set_ylabel("spot instances")
        axes[0][0].legend(fontsize=7)
        axes[1][0].legend(fontsize=7)
        fig.tight_layout()
        path = out / f"throughput_{model}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)

    avg = {(r["model"], label(r)): r for r in result["results"] if r["segment"] == "avg"}
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    width = 0.8 / len(policies)
    for ax, key, title, idx in ((axes[0], "throughput_rel_verl", "throughput vs veRL", 0),
                                (axes[1], "cost_efficiency_rel_verl", "cost efficiency vs veRL", 1)):
        for i, policy in enumerate(policies):
            ax.bar([m + i * width for m in range(len(models))], [avg[(model, policy)][key] for model in models],
                   width, label=policy)
        paper = [PAPER_RLBOOST.get(model, (None, None))[idx] for model in models]
        rl = policies.index("rlboost") if "rlboost" in policies else None
        if rl is not None:
            ax.scatter([m + rl * width for m, p in enumerate(paper) if p], [p for p in paper if p], marker="*",
                       s=120, color="black", zorder=3, label="paper (RLBoost)")
        ax.axhline(1.0, color="0.5", linewidth=0.8)
        ax.set_xticks([m + 0.4 - width / 2 for m in range(len(models))], models)
        ax.set_title(f"{title} (mean of segments)")
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    path = out / "relative.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    written.append(path)
    return written
