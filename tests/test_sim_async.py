"""veRL's fully-async mode in the simulator (`policy=verl-async`, `rlboost.sim.async_baseline`): the
staleness bound holds the rollout back exactly, k = 0 is the synchronous split, a larger bound never
slows a run, and the baseline runs at its best split and bound."""

from __future__ import annotations

from dataclasses import replace

import pytest

from rlboost.sim.async_baseline import async_steps, saturated_rate, shares
from rlboost.sim.batching import engine_rollout
from rlboost.sim.profile import make_profiles
from rlboost.sim.simulator import ASYNC_STALENESS, SimConfig, best_verl_async, simulate
from rlboost.sim.workload import Workload, WorkloadConfig
from rlboost.spot.cost import CostConfig, CostMeter

SMALL = WorkloadConfig(prompts_per_step=16, median_response=1200, max_response=4096)
SYNC_S = 5.0


def run(k: int, rollout_gpus: int = 4, steps: int = 8):
    engine, train = make_profiles("qwen3-8b")
    return async_steps(engine, train, Workload(SMALL), CostMeter(CostConfig()), rollout_gpus=rollout_gpus,
                       train_gpus=8 - rollout_gpus, max_staleness=k, sync_s=SYNC_S, duration_s=1e9,
                       max_steps=steps)


def test_at_k_0_each_batch_waits_for_the_last_update_and_drains_its_engines():
    engine, _ = make_profiles("qwen3-8b")
    work = Workload(SMALL)
    for step in run(0):
        lengths = [x for group in work.step(step.step) for x in group]
        tail = max(engine_rollout(engine, share, SMALL.prompt_len).seconds for share in shares(lengths, 2) if share)
        assert step.rollout_s == pytest.approx(tail)  # synchronous: the long tail, every batch
        waited = step.rollout_s + (SYNC_S if step.step else 0.0)  # the new weights reach the engines first
        assert step.wait_train_s == pytest.approx(waited) and step.rollout_window[0] == pytest.approx(
            step.start_s + (SYNC_S if step.step else 0.0))


@pytest.mark.parametrize("k", [1, 2])
def test_the_rollout_runs_at_most_k_versions_ahead(k):
    """Batch i starts once version i - k is on the engines: its generation ends no sooner than the
    update of batch i - k - 1 plus the sync plus its own saturated time. Three engines outrun two
    trainers, so the bound is what holds the rollout back."""
    steps = run(k, rollout_gpus=6)
    engine, _ = make_profiles("qwen3-8b")
    rate = saturated_rate(engine, Workload(SMALL), 3) * 3
    held = 0
    for i, step in enumerate(steps):
        start, generated = step.rollout_window
        assert generated == pytest.approx(start + step.tokens_generated / rate)  # saturated: no tail
        if i - k - 1 >= 0:
            assert start >= steps[i - k - 1].end_s + SYNC_S - 1e-6
            held += start == pytest.approx(steps[i - k - 1].end_s + SYNC_S)  # it started when its version came
    assert held >= len(steps) - k - 2  # the bound did bind: the test tests it


def test_a_looser_bound_never_slows_the_run():
    ends = [run(k)[-1].end_s for k in (0, 1, 2, 4)]
    assert ends == sorted(ends, reverse=True) and ends[1] < ends[0]


def test_the_baseline_runs_at_its_best_bound_and_split():
    cfg = SimConfig(policy="verl-async", duration_s=1800.0, workload=SMALL)
    best = best_verl_async(cfg)
    tried = [simulate(replace(cfg, max_staleness=k, rollout_gpus=r)) for k in ASYNC_STALENESS for r in (2, 4, 6)]
    assert best.throughput_tokens_per_s == pytest.approx(max(r.throughput_tokens_per_s for r in tried))
    assert best.config.max_staleness in ASYNC_STALENESS and best.rollout_gpus + best.train_gpus == 8


@pytest.mark.parametrize("policy", ["verl", "verl2x", "disagg"])
def test_the_synchronous_policies_take_no_staleness_bound(policy):
    with pytest.raises(ValueError, match=f"policy {policy} is synchronous"):
        SimConfig(policy=policy, max_staleness=1).validate()
    SimConfig(policy="rlboost", max_staleness=1).validate()
    with pytest.raises(ValueError, match="max_staleness must be >= 0"):
        SimConfig(policy="verl-async", max_staleness=-1).validate()


def test_rlboost_simulate_names_the_bound_and_split_of_verl_async(tmp_path, capsys):
    from rlboost.cli import main

    assert main(["simulate", "--models", "qwen3-8b", "--segments", "A", "--policies", "verl,verl-async,rlboost",
                 "--staleness", "0", "duration_s=1800", "--json", str(tmp_path / "out.json"),
                 "--plots", str(tmp_path)]) == 0
    import json

    rows = json.loads((tmp_path / "out.json").read_text())["results"]
    [async_row] = [r for r in rows if r["policy"] == "verl-async" and r["segment"] == "A"]
    assert async_row["max_staleness"] in ASYNC_STALENESS and async_row["rollout_gpus"] in (2, 4, 6)
    [rlboost] = [r for r in rows if r["policy"] == "rlboost" and r["segment"] == "avg"]  # the target's ratio
    assert rlboost["throughput_rel_verl_async"] == pytest.approx(
        rlboost["throughput_rel_verl"] / async_row["throughput_rel_verl"])
    assert f"verl-async (k={async_row['max_staleness']}, {async_row['rollout_gpus']} rollout GPUs)" in \
        capsys.readouterr().out
