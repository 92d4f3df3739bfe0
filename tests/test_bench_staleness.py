"""`rlboost bench staleness` (rlboost.bench.staleness): the real control plane on emulated engines at a
staleness bound, beside the simulator's twin. Inside, every step is checked as the emulation check
checks it (each sample once, exact tokens across migrations and version swaps), with the bound."""

from __future__ import annotations

import pytest

from rlboost.bench import emulated_run
from rlboost.bench.staleness import StalenessBenchConfig, bench_staleness, render


@pytest.mark.e2e
def test_the_bench_runs_ahead_of_its_trainer_within_the_bound(monkeypatch):
    versions: dict[int, set[int]] = {}
    check = emulated_run.check_step

    def spy(groups, cfg, emu, step):
        check(groups, cfg, emu, step)  # exactly once, exact tokens, and every version within the bound
        versions[step] = {v for g in groups for s in g.samples for v in s.versions}

    monkeypatch.setattr(emulated_run, "check_step", spy)
    cfg = StalenessBenchConfig(bounds=[1], provider="fixed", instances=2, reserved_engines=1, prompts=8, samples=4,
                               steps=3, length_scale=1 / 24, max_num_seqs=8, seed_window_s=1.0, worker="light")
    result = bench_staleness(cfg)
    [row] = result["results"]
    assert row["part"] == "emulated" and row["k"] == 1 and row["steps"] == 2
    assert row["tokens_per_s"] > 0 and row["sim_tokens_per_s"] > 0 and row["step_s"] > 0
    assert versions[0] == {0}
    # steps 1 and 2 were started ahead of their trainer, on the version before theirs
    assert all(step - 1 in versions[step] and versions[step] <= {step - 1, step} for step in (1, 2))
    assert "| 1 |" in render(result)


def test_a_negative_bound_is_refused_by_name():
    with pytest.raises(ValueError, match="max_staleness must be >= 0"):
        StalenessBenchConfig(bounds=[-1]).checks()
