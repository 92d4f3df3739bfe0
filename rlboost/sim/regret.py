"""Where a hybrid run loses against colocated, step by step (docs/simulator.md, "No regret").

Contract: `breakdown(run, verl)` compares every step of a simulated hybrid run with veRL's step of the
same index (the same samples) and files the seconds and dollars it lost (never the gains) under the
first cause that fits the step's record:
- preempted after the hand-off: the reserved workers handed off and an instance died in the step;
- tail on too few instances: they handed off, nobody died, and the trainer waited for groups;
- instances barely serving: instances were billed but generated for under a tenth of the step
  (booting, pulling, or idle beside the reserved workers);
- other.
`python -m rlboost.sim.regret` prints the breakdown over the scarce markets of the no-regret tests,
for the paper's controller and for rlboost's. Pure: no clock.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

from rlboost.sim.records import StepRecord
from rlboost.sim.simulator import SimConfig, SimResult, simulate

CAUSES = ("preempted after the hand-off", "tail on too few instances", "instances barely serving", "other")


def cause(step: StepRecord) -> str:
    handed = step.migrated.get("seed_handoff", 0) > 0
    if handed and step.preemptions > 0:
        return CAUSES[0]
    if handed and step.wait_train_s > 0:
        return CAUSES[1]
    if step.instance_s > 0 and step.remote_s < 0.1 * (step.end_s - step.start_s):
        return CAUSES[2]
    return CAUSES[3]


def breakdown(run: SimResult, verl: SimResult) -> dict[str, Counter]:
    """{"seconds": cause -> seconds lost, "usd": cause -> dollars lost} over the steps both runs have."""
    seconds, usd = Counter(), Counter()
    for s, b in zip(run.steps, verl.steps):
        why = cause(s)
        seconds[why] += max(0.0, (s.end_s - s.start_s) - (b.end_s - b.start_s))
        usd[why] += max(0.0, s.usd - b.usd)
    return {"seconds": seconds, "usd": usd}


def main() -> None:
    import tempfile
    from pathlib import Path

    from rlboost.sim.simulator import _sim_offload
    from rlboost.spot.markets import SCARCE_BUNDLED, bursty, write_csv
    from rlboost.spot.trace import TraceConfig

    paper = replace(_sim_offload(), gate_handoff=False, preemption_risk=False, objective="throughput")
    with tempfile.TemporaryDirectory() as tmp:
        markets = {name: SimConfig(segment=segment, trace=TraceConfig(sample=sample, time_scale=1.0))
                   for name, (segment, sample) in SCARCE_BUNDLED.items()}
        for seed in range(6):
            path = write_csv(bursty(seed), Path(tmp) / f"bursty{seed}.csv")
            markets[f"bursty{seed}"] = SimConfig(trace=TraceConfig(path=str(path), sample=1.0, time_scale=1.0))
        print("| controller | model | lost s: " + " | ".join(CAUSES) + " | lost $: " + " | ".join(CAUSES)
              + " | worst throughput | worst tokens/$ |")
        print("|---" * (4 + 2 * len(CAUSES)) + "|")
        for label, offload in (("paper", paper), ("rlboost", _sim_offload())):
            for model in ("qwen3-8b", "qwen3-14b", "qwen3-32b"):
                seconds, usd, worst_t, worst_c = Counter(), Counter(), 9.0, 9.0
                for cfg in markets.values():
                    verl = simulate(replace(cfg, model=model, policy="verl"))
                    run = simulate(replace(cfg, model=model, offload=offload))
                    parts = breakdown(run, verl)
                    seconds.update(parts["seconds"])
                    usd.update(parts["usd"])
                    rel = run.relative_to(verl)
                    worst_t, worst_c = min(worst_t, rel["throughput"]), min(worst_c, rel["cost_efficiency"])
                print(f"| {label} | {model} | " + " | ".join(f"{seconds[c]:,.0f}" for c in CAUSES) + " | "
                      + " | ".join(f"{usd[c]:,.0f}" for c in CAUSES) + f" | {worst_t:.3f}x | {worst_c:.3f}x |")


__all__ = ["CAUSES", "breakdown", "cause"]


if __name__ == "__main__":
    main()
