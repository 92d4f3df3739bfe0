"""RLBoost and veRL with and without HistoSpec, per model, at given accepted tokens per verify step
(docs/simulator.md, "HistoSpec at paper scale"; issue 27, item 4).

Contract: `rows(...)` simulates veRL, rlboost and rlboost with its instance cap not enforced on every model and trace segment once without
speculative decoding and once per value of `accepted` (`simulate.histospec.accepted_per_verify`, an
input: what the replay harness measures on recorded histories), and returns one row per (model,
accepted, policy) with the segments' means: throughput and cost efficiency, each relative to the
same policy without HistoSpec, to plain veRL (the paper's baseline) and to veRL with the same
HistoSpec, and the engine's modelled decode speed-up at a full batch. `markdown(rows)` is the doc's table.
`python -m rlboost.sim.histospec_table --accepted 1,2,3 --json out.json` prints it; rerun it with
measured acceptance. Pure: the simulator's runs, no clock.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace

from rlboost.sim.profile import make_profiles
from rlboost.sim.report import MODELS, evaluate
from rlboost.sim.simulator import SimConfig
from rlboost.sim.speculation import speculating
from rlboost.sim.table_cli import numbers, run_and_print, validate_each

POLICIES = ("verl", "rlboost", "rlboost-uncapped")
"""rlboost-uncapped: rlboost with the controller's instance cap computed but not enforced
(`offload.enforce_cap=False`, every instance the trace offers), to tell what HistoSpec gives the
rollout from how the controller sizes the instances around a faster rollout."""
SPEEDUP_AT = ((256, 1000), (256, 4000))
"""(batch, context per request) at which rows give the engine's modelled decode speed-up: a full
engine early in its samples' responses (where verifying may be compute-bound) and later on."""


def rows(base: SimConfig, accepted: list[float], models=MODELS, segments: str = "ABC") -> list[dict]:
    """One row per (model, accepted per verify, policy); accepted 0 is the run without HistoSpec. Every
    config is validated before the first run (ValueError naming the key)."""
    configs = {a: replace(base, histospec=replace(base.histospec, accepted_per_verify=a))
               for a in [0.0] + [a for a in accepted if a != 0.0]}
    validate_each(configs.values(), models)
    runs = {a: _runs(cfg, models, segments) for a, cfg in configs.items()}
    out = []
    for model in models:
        plain_engine = make_profiles(model, base.profile)[0]
        for a, cfg in configs.items():
            engine = speculating(plain_engine, cfg.histospec)
            speedup = {f"batch {b}, {c} tokens": engine.tokens_per_s(b, c) / plain_engine.tokens_per_s(b, c)
                       for b, c in SPEEDUP_AT}
            for policy in POLICIES:
                mine = [runs[a][(model, s, policy)] for s in segments]
                without = [runs[0.0][(model, s, policy)] for s in segments]
                verl = [runs[0.0][(model, s, "verl")] for s in segments]
                verl_same = [runs[a][(model, s, "verl")] for s in segments]

                def mean(values) -> float:
                    values = list(values)
                    return sum(values) / len(values)

                out.append({
                    "model": model, "policy": policy, "accepted_per_verify": a,
                    "draft_tokens": cfg.histospec.draft_tokens, "max_batch": cfg.histospec.max_batch,
                    "throughput_tokens_per_s": mean(r.throughput_tokens_per_s for r in mine),
                    "tokens_per_usd": mean(r.tokens_per_usd for r in mine),
                    "throughput_rel_without": mean(r.throughput_tokens_per_s / w.throughput_tokens_per_s
                                                   for r, w in zip(mine, without)),
                    "cost_efficiency_rel_without": mean(r.tokens_per_usd / w.tokens_per_usd for r, w in zip(mine, without)),
                    "throughput_rel_verl": mean(r.relative_to(v)["throughput"] for r, v in zip(mine, verl)),
                    "cost_efficiency_rel_verl": mean(r.relative_to(v)["cost_efficiency"] for r, v in zip(mine, verl)),
                    "throughput_rel_verl_same": mean(r.relative_to(v)["throughput"] for r, v in zip(mine, verl_same)),
                    "cost_efficiency_rel_verl_same": mean(r.relative_to(v)["cost_efficiency"]
                                                          for r, v in zip(mine, verl_same)),
                    "rollout_share": mean(sum(s.rollout_s for s in r.steps) / r.wall_s for r in mine),
                    "instances_mean": mean(sum(s.instance_s for s in r.steps) / r.wall_s for r in mine),
                    "steps": mean(len(r.steps) for r in mine),
                    "engine_speedup": speedup,
                    "segments": {s: r.throughput_tokens_per_s for s, r in zip(segments, mine)}})
    return out


def _runs(cfg: SimConfig, models, segments: str) -> dict:
    """(model, segment, policy) -> SimResult for every policy of POLICIES."""
    runs = evaluate(cfg, models, segments, ("verl", "rlboost"))[1]
    uncapped = evaluate(replace(cfg, offload=replace(cfg.offload, enforce_cap=False)), models, segments, ("rlboost",))[1]
    runs.update({(m, s, "rlboost-uncapped"): r for (m, s, p), r in uncapped.items() if p == "rlboost"})
    return runs


def markdown(table_rows: list[dict]) -> str:
    speedups = list(table_rows[0]["engine_speedup"]) if table_rows else []
    lines = ["| model | policy | accepted per verify step (input) | tokens/s | vs without | vs veRL | vs veRL, same "
             "HistoSpec | tokens/$ | vs without | vs veRL | vs veRL, same HistoSpec | instances held (mean) "
             f"| engine decode speed-up ({'; '.join(speedups)}) |", "|---" * 13 + "|"]
    for r in table_rows:
        a = r["accepted_per_verify"]
        histospec = "without" if a == 0 else f"{a:g} (draft {r['draft_tokens']:g})"
        speedup = " / ".join(f"{v:.2f}x" for v in r["engine_speedup"].values())
        lines.append(f"| {r['model']} | {r['policy']} | {histospec} | {r['throughput_tokens_per_s']:,.0f} "
                     f"| {r['throughput_rel_without']:.2f}x | {r['throughput_rel_verl']:.2f}x "
                     f"| {r['throughput_rel_verl_same']:.2f}x | {r['tokens_per_usd']:,.0f} "
                     f"| {r['cost_efficiency_rel_without']:.2f}x | {r['cost_efficiency_rel_verl']:.2f}x "
                     f"| {r['cost_efficiency_rel_verl_same']:.2f}x | {r['instances_mean']:.1f} | {speedup} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rlboost.sim.histospec_table", description=__doc__.splitlines()[0])
    parser.add_argument("--accepted", default="1,2,3", help="accepted tokens per verify step, e.g. 1,2,3")
    parser.add_argument("--draft-tokens", type=float, default=None, help="draft tokens per verify step (default: "
                        "simulate.histospec.draft_tokens)")
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--segments", default="ABC")
    parser.add_argument("--json", help="also write the rows to this JSON file")
    args = parser.parse_args(argv)
    base = SimConfig()
    if args.draft_tokens is not None:
        base = replace(base, histospec=replace(base.histospec, draft_tokens=args.draft_tokens))
    return run_and_print(lambda: rows(base, numbers(args.accepted, "--accepted", "tokens per verify step"),
                                      args.models.split(","), args.segments),
                         markdown, args.json,
                         note="accepted_per_verify values are assumed inputs, not measured acceptance")


__all__ = ["markdown", "rows"]


if __name__ == "__main__":
    sys.exit(main())
