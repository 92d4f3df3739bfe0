"""`rlboost bench staleness` (rlboost.bench.staleness): the real control plane on emulated engines at a
staleness bound, beside the simulator's twin. Inside, every step is checked as the emulation check
checks it (each sample once, exact tokens across migrations and version swaps), with the bound."""

from __future__ import annotations

import pytest

from rlboost.bench import emulated_run
from rlboost.bench.emulated_run import EmulatedStep
from rlboost.bench.emulation import CheckResult
from rlboost.bench.staleness import StalenessBenchConfig, bench_staleness, render, row


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
    [measured] = result["results"]
    assert measured["part"] == "emulated" and measured["k"] == 1 and measured["steps"] == 2
    assert measured["tokens_per_s"] > 0 and measured["sim_tokens_per_s"] > 0 and measured["step_s"] > 0
    # no overlap brings a step below its training; the seeding window is planned, and with the batch ahead
    # started in the tail (the default) little or nothing may be left to seed when its trainer comes
    assert 0 < measured["train_s"] < measured["step_s"] and measured["seed_s"] > 0
    assert 0 < measured["spot_decode_use"] < 1
    assert versions[0] == {0}
    # steps 1 and 2 were started ahead of their trainer, on the version before theirs
    assert all(step - 1 in versions[step] and versions[step] <= {step - 1, step} for step in (1, 2))
    assert "| 1 |" in render(result)


def test_a_negative_bound_is_refused_by_name():
    with pytest.raises(ValueError, match="max_staleness must be >= 0"):
        StalenessBenchConfig(bounds=[-1]).checks()


def _step(k: int, **fields) -> EmulatedStep:
    base = dict(step=k, step_s=10.0, rollout_s=8.0, seed_s=2.0, wait_train_s=1.0, wait_remote_s=1.5, train_s=5.0,
                instances=2, preemptions=0, migrations=0, cap=None, loop_cpu_s=0.0, relay_cpu_s=0.0,
                driver_cpu_s=0.0, tokens=1000, samples=10, instance_s=20.0, preemptible_share=0.5)
    return EmulatedStep(**{**base, **fields})


def test_a_rows_bounds_are_the_reserved_gpus_busy_times_and_the_instances_share_of_a_full_batch():
    """`seed_s` and `train_s` are the seeding window and the modelled training, per step, in modelled seconds;
    `spot_decode_use` the instances' tokens over their instance-seconds at the engine's full-batch rate.
    Step 0 runs nothing ahead and is left out, as from the rates."""
    cfg = StalenessBenchConfig(bounds=[1], time_scale=2.0, max_num_seqs=8, prompt_len=100)
    steps = [_step(0, tokens=99_999, seed_s=50.0, instance_s=1.0),
             _step(1, seed_s=2.0, train_s=6.0, tokens=1000, samples=10, instance_s=20.0, preemptible_share=0.5),
             _step(2, seed_s=4.0, train_s=10.0, tokens=3000, samples=10, instance_s=40.0, preemptible_share=1.0)]
    simulated = [{"tokens_trained": 1000, "start_s": 0.0, "end_s": 5.0, "instances_start": 2}] * 3
    r = row(CheckResult(cfg.checks()[0], steps, simulated, startup_s=0.0, boot_wall_s=0.0, wall_s=0.0))
    assert r["seed_s"] == pytest.approx((2 + 4) / 2 / 2.0) and r["train_s"] == pytest.approx((6 + 10) / 2 / 2.0)
    engine, _ = cfg.emulation().profiles()
    context = 100 + (4000 / 20) / 2  # the prompt and half the mean response of steps 1 and 2
    full = engine.tokens_per_s(engine.max_batch(context), context)
    assert engine.max_batch(context) == 8  # the run's max_num_seqs, not the KV cache, bounds the batch here
    assert r["spot_decode_use"] == pytest.approx((500 + 3000) / ((20 + 40) / 2.0 * full))
