"""Simulator workload: deterministic response lengths, truncation, correlation within a GRPO group and
across epochs, drift, statistics."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from rlboost.sim.workload import Workload, WorkloadConfig, lognormal_truncation


def log_lengths(work: Workload, step: int) -> np.ndarray:
    return np.log(np.array(work.step(step), dtype=np.float64))


def test_shape_and_range():
    cfg = WorkloadConfig()
    lengths = Workload(cfg).step(0)
    assert len(lengths) == 128 and all(len(group) == 8 for group in lengths)
    flat = [n for group in lengths for n in group]
    assert all(isinstance(n, int) for n in flat)
    assert 1 <= min(flat) and max(flat) <= cfg.max_response


def test_deterministic_in_seed_and_step_whatever_the_call_order():
    a, b = Workload(WorkloadConfig()), Workload(WorkloadConfig())
    later_first = [b.step(5), b.step(0)]
    assert [a.step(5), a.step(0)] == later_first
    assert Workload(WorkloadConfig()).step(0) == a.step(0)
    assert Workload(WorkloadConfig(seed=1)).step(0) != a.step(0)
    assert a.step(1) != a.step(0)


def test_truncation_at_the_cap_and_the_floor_of_one_token():
    long = Workload(WorkloadConfig(median_response=12000, max_response=14336))
    flat = np.array(long.step(0)).ravel()
    assert flat.max() == 14336
    assert long.stats(2)["truncated"] > 0.3
    short = Workload(WorkloadConfig(median_response=1, sigma=2.0))
    assert np.array(short.step(0)).min() == 1


def test_prompt_ids_cycle_through_the_dataset():
    work = Workload(WorkloadConfig(dataset_size=200))
    assert work.prompt_ids(0) == list(range(128))
    assert work.prompt_ids(1) == list(range(128, 200)) + list(range(56))
    with pytest.raises(ValueError):
        work.prompt_ids(-1)


def test_samples_of_one_prompt_are_closer_than_samples_of_different_prompts():
    logs = log_lengths(Workload(WorkloadConfig(median_response=1000)), 0)  # median low: few capped
    within = logs.std(axis=1, ddof=1).mean()
    across = logs.mean(axis=1).std(ddof=1)
    assert within < 0.6 * across
    assert within == pytest.approx(0.4, rel=0.15)  # within_group_sigma
    assert across == pytest.approx(np.hypot(0.7, 0.4 / np.sqrt(8)), rel=0.15)


def test_a_recurring_prompt_keeps_its_length_across_epochs():
    cfg = WorkloadConfig(dataset_size=256, median_response=1000)  # an epoch is 2 steps
    work = Workload(cfg)
    assert work.prompt_ids(2) == work.prompt_ids(0)
    epoch0, epoch1 = log_lengths(work, 0).mean(axis=1), log_lengths(work, 2).mean(axis=1)
    assert np.corrcoef(epoch0, epoch1)[0, 1] > 0.85  # expected 0.49 / (0.49 + 0.16 / 8) = 0.96
    assert work.step(0) != work.step(2)  # fresh samples, same prompts
    # Without a per-prompt spread nothing carries over.
    flat = Workload(replace(cfg, sigma=0.0))
    r = np.corrcoef(log_lengths(flat, 0).mean(axis=1), log_lengths(flat, 2).mean(axis=1))[0, 1]
    assert abs(r) < 0.3


def test_a_prompts_length_does_not_depend_on_the_dataset_size():
    small, large = Workload(WorkloadConfig(dataset_size=128)), Workload(WorkloadConfig(dataset_size=100_000))
    assert small.step(0) == large.step(0)  # same prompts 0..127, same step noise


def test_drift_raises_the_mean():
    work = Workload(WorkloadConfig(drift_per_step=0.01, median_response=1000))
    assert work.median(100) == pytest.approx(1000 * 1.01**100)
    assert work.stats(1, start=100)["mean"] > 2 * work.stats(1, start=0)["mean"]
    assert Workload(WorkloadConfig()).median(100) == 3500


def test_default_stats_match_the_documented_distribution():
    cfg = WorkloadConfig()
    stats = Workload(cfg).stats(32)  # one epoch
    assert set(stats) == {"mean", "median", "p90", "p99", "std", "truncated", "samples"}
    assert stats["samples"] == 32 * 128 * 8
    assert stats["median"] == pytest.approx(3500, rel=0.08)
    assert 4000 < stats["mean"] < 5000
    assert stats["median"] < stats["p90"] < stats["p99"] <= cfg.max_response
    assert stats["truncated"] == pytest.approx(lognormal_truncation(cfg), abs=0.015)
    assert 0.02 < stats["truncated"] < 0.06  # "a few percent" at the 14K cap


def test_fixed_and_uniform_distributions():
    fixed = Workload(WorkloadConfig(distribution="fixed", median_response=2000)).stats(2)
    assert fixed["mean"] == fixed["median"] == 2000 and fixed["truncated"] == 0.0
    uniform = Workload(WorkloadConfig(distribution="uniform", median_response=2000))
    flat = np.array(uniform.step(0)).ravel()
    assert 1 <= flat.min() and flat.max() <= 4000
    assert flat.mean() == pytest.approx(2000, rel=0.05)


@pytest.mark.parametrize("field, value", [("distribution", "pareto"), ("prompts_per_step", 0), ("sigma", -0.1),
                                          ("drift_per_step", -1.0), ("dataset_size", 0), ("prompt_len", -1)])
def test_config_is_validated(field, value):
    with pytest.raises(ValueError, match=field):
        Workload(replace(WorkloadConfig(), **{field: value}))
