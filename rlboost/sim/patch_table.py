"""RLBoost against veRL with full weight pulls and with patches, per model and spot link
(docs/simulator.md, "Weight patches"; issue 25).

Contract: `rows(...)` simulates veRL and rlboost on every model, link and trace segment twice, once
with full pulls (patch_share = from_base_share = 1) and once with the given shares, and returns one
row per (model, link, pulls) with the segments' mean ratios to veRL; `markdown(rows)` is the doc's
table. `python -m rlboost.sim.patch_table --patch-share 0.01 --from-base-share 0.1 --links 1,10`
prints it; rerun it with measured shares. Pure: the simulator's runs, no clock.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace

from rlboost.sim.profile import make_profiles
from rlboost.sim.report import MODELS, evaluate
from rlboost.sim.simulator import SimConfig
from rlboost.sim.table_cli import numbers, run_and_print, validate_each


def rows(base: SimConfig, links: list[float], patch_share: float, from_base_share: float,
         models=MODELS, segments: str = "ABC") -> list[dict]:
    """One row per (model, link, pulls): join and refresh seconds, and rlboost against veRL. Every
    config is validated before the first run (ValueError naming the key)."""
    runs = {(link, pulls): replace(base, link_gbps=link, patch_share=patch, from_base_share=from_base)
            for link in links for pulls, patch, from_base in (("full", 1.0, 1.0),
                                                              ("patches", patch_share, from_base_share))}
    validate_each(runs.values(), models)
    out = []
    for (link, pulls), cfg in runs.items():
        result, _ = evaluate(cfg, models, segments, ("verl", "rlboost"))
        for model in models:
            mine = {r["segment"]: r for r in result["results"] if r["model"] == model and r["policy"] == "rlboost"}
            full_s = make_profiles(model, cfg.profile)[1].weight_sync_s(link, cfg.wire_dtype)
            out.append({"model": model, "link_gbps": link, "pulls": pulls, "patch_share": cfg.patch_share,
                        "from_base_share": cfg.from_base_share, "startup_s": cfg.instance_startup_s,
                        "join_pull_s": cfg.from_base_share * full_s, "refresh_s": cfg.patch_share * full_s,
                        "throughput_rel_verl": mine["avg"]["throughput_rel_verl"],
                        "cost_efficiency_rel_verl": mine["avg"]["cost_efficiency_rel_verl"],
                        "segments": {s: mine[s]["throughput_rel_verl"] for s in segments},
                        "instances_mean": mine["avg"]["instances_mean"],
                        "preemptions": mine["avg"]["preemptions"]})
    return sorted(out, key=lambda r: (list(models).index(r["model"]), r["link_gbps"], r["pulls"]))


def _seconds(value: float) -> str:
    return f"{value:.1f} s" if value >= 10 else f"{value:.2f} s"


def markdown(table_rows: list[dict]) -> str:
    segments = list(table_rows[0]["segments"]) if table_rows else []
    lines = ["| model | link | pulls | join: boot + pull | refresh | throughput vs veRL | cost efficiency vs veRL "
             f"| segments {' / '.join(segments)} (throughput) | instances held (mean) "
             "| preemptions (mean per segment) |", "|---" * 10 + "|"]
    for r in table_rows:
        pulls = "full" if r["pulls"] == "full" else f"patches {r['patch_share']:g} / {r['from_base_share']:g}"
        per_segment = " / ".join(f"{v:.2f}x" for v in r["segments"].values())
        lines.append(f"| {r['model']} | {r['link_gbps']:g} Gbit/s | {pulls} "
                     f"| {r['startup_s']:g} + {_seconds(r['join_pull_s'])} | {_seconds(r['refresh_s'])} "
                     f"| {r['throughput_rel_verl']:.2f}x | {r['cost_efficiency_rel_verl']:.2f}x | {per_segment} "
                     f"| {r['instances_mean']:.1f} | {r['preemptions']:.1f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rlboost.sim.patch_table", description=__doc__.splitlines()[0])
    parser.add_argument("--links", default="1,10", help="spot links in Gbit/s, e.g. 1,10")
    parser.add_argument("--patch-share", type=float, default=0.01, help="share of a version a refresh moves")
    parser.add_argument("--from-base-share", type=float, default=0.10, help="share of a version a joiner moves")
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--segments", default="ABC")
    parser.add_argument("--json", help="also write the rows to this JSON file")
    args = parser.parse_args(argv)
    return run_and_print(lambda: rows(SimConfig(), numbers(args.links, "--links", "Gbit/s"), args.patch_share,
                                      args.from_base_share, args.models.split(","), args.segments),
                         markdown, args.json)


__all__ = ["markdown", "rows"]


if __name__ == "__main__":
    sys.exit(main())
