"""Hard kills at token counts of a whole `rlboost train` run, for the tests that run the CLI in their
own process: the `fixed` provider's chaos (`rlboost.hybrid.providers.FixedPool`: a seeded Poisson
process of SIGKILLs of a random live instance, replaced at once) with the run's progress as its clock
(`rlboost.spot.ProgressClock`: response tokens generated, evaluations included) instead of wall
seconds, so production code carries no fault hook.

A loaded machine and an idle one then kill at the same tokens of the run, only while it generates
(progress stands still while the trainer trains), and into the `fixed` pool, whose instances serve
before the first step: the first kills cannot come before an instance exists to take them, as they
can on a trace replay, whose instances boot during the run. A kill lands at the provider's first
tick after its token count (`TICK_S`: the tokens generated in one tick later at most); the next one
is drawn from there. A kill due while every instance is still booting is skipped (`FixedPool.tick`):
count the kills that happened from the run's metrics (`spot/preemptions`).
"""

from __future__ import annotations

import rlboost.hybrid.providers as providers
import rlboost.hybrid.rollout as hybrid_rollout
from rlboost.hybrid.providers import FixedPool

TICK_S = 0.01
"""The provider's tick in these runs, a tenth of a run's: the tiny model's steps generate for 0.1-0.9 s,
a few ticks of the real one, and a kill would often come once the step's last tokens were in."""

ON_PROGRESS = ["rollout.hybrid.trace.tokens_per_s=1", "rollout.hybrid.preempt_every_s=0"]
"""Overrides a run killed by `kill_on_progress` needs: the run's progress clock, one replay second
per generated token (the `fixed` provider reads no other trace.* key), and no chaos on wall time."""


def kill_on_progress(monkeypatch, mean_tokens: float, seed: int) -> list[FixedPool]:
    """From now on, hybrid runs in this process get the `fixed` pool killing one instance every
    `mean_tokens` generated tokens on average (seeded by `seed`, not the run's seed, so that a test's
    kills stay where they are when its data changes). Returns the pools built, one per run."""
    pools: list[FixedPool] = []

    def fixed_pool_on_progress(cfg, fleet, run_seed, progress=None) -> FixedPool:
        if cfg.provider != "fixed" or progress is None or progress.tokens_per_s != 1:
            raise ValueError(f"kill_on_progress needs rollout.hybrid.provider=fixed and the overrides {ON_PROGRESS}")
        pool = FixedPool(fleet, cfg.num_preemptible, mean_tokens, seed, cfg.respawn, clock=progress)
        pools.append(pool)
        return pool

    monkeypatch.setattr(hybrid_rollout, "make_provider", fixed_pool_on_progress)
    monkeypatch.setattr(providers, "TICK_S", TICK_S)
    return pools
