"""Hard kills at token counts of a whole `rlboost train` run, for the tests that run the CLI in their
own process: the `fixed` provider's chaos (`rlboost.hybrid.providers.FixedPool`: a seeded Poisson
process of SIGKILLs of a random live instance, replaced at once) with the run's progress as its clock
(`rlboost.spot.ProgressClock`: response tokens generated, evaluations included) instead of wall
seconds, so production code carries no fault hook.

A loaded machine and an idle one then kill at the same tokens of the run, only while it generates
(progress stands still while the trainer trains), and into the `fixed` pool, whose instances serve
before the first step: the first kills cannot come before an instance exists to take them, as they
can on a trace replay, whose instances boot during the run. A kill lands at the provider's first
tick after its token count (a tick every `TICK_S` here), and the next one is drawn from there. A
kill due while every instance is still booting is skipped (`FixedPool.tick`): count the kills that
happened from the run's metrics (`spot/preemptions`).

In the test's process: `kill_on_progress(mean_tokens, seed, monkeypatch.setattr)`, then
`rlboost.cli.main([... *ON_PROGRESS])`. A run in a process of its own:
`python -m progress_kills MEAN_TOKENS SEED train CONFIG ... ` with this folder on PYTHONPATH (`command`).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path

import rlboost.hybrid.providers as providers
import rlboost.hybrid.rollout as hybrid_rollout
from rlboost.hybrid.providers import FixedPool

TICK_S = 0.01
"""The provider's tick in these runs, a tenth of a run's: the tiny model's steps generate for 0.1-0.9 s,
a few ticks of the real one, and a kill would often come once the step's last tokens were in."""

ON_PROGRESS = ["rollout.hybrid.trace.tokens_per_s=1", "rollout.hybrid.preempt_every_s=0"]
"""Overrides a run killed by `kill_on_progress` needs: the run's progress clock, one replay second
per generated token (the `fixed` provider reads no other trace.* key), and no chaos on wall time."""


def kill_on_progress(mean_tokens: float, seed: int, patch: Callable = setattr) -> list[FixedPool]:
    """From now on, hybrid runs in this process get the `fixed` pool killing one instance every
    `mean_tokens` generated tokens on average (seeded by `seed`, not the run's seed, so that a test's
    kills stay where they are when its data changes). `patch`: how to set the module attributes (a
    test's `monkeypatch.setattr`, undone after it). Returns the pools built, one per run."""
    pools: list[FixedPool] = []

    def fixed_pool_on_progress(cfg, fleet, run_seed, progress=None) -> FixedPool:
        if cfg.provider != "fixed" or progress is None or progress.tokens_per_s != 1:
            raise ValueError(f"kill_on_progress needs rollout.hybrid.provider=fixed and the overrides {ON_PROGRESS}")
        pool = FixedPool(fleet, cfg.num_preemptible, mean_tokens, seed, cfg.respawn, clock=progress)
        pools.append(pool)
        return pool

    patch(hybrid_rollout, "make_provider", fixed_pool_on_progress)
    patch(providers, "TICK_S", TICK_S)
    return pools


def command(mean_tokens: float, seed: int, *argv: str) -> tuple[list[str], dict[str, str]]:
    """(command line, environment) of `rlboost <argv>` in a process of its own, killed by
    `kill_on_progress`; run it from the repository's root (`-m` finds `rlboost` there)."""
    paths = [str(Path(__file__).parent), *filter(None, [os.environ.get("PYTHONPATH")])]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(paths))
    return [sys.executable, "-m", "progress_kills", str(mean_tokens), str(seed), *argv], env


if __name__ == "__main__":
    from rlboost.cli import main

    kill_on_progress(float(sys.argv[1]), int(sys.argv[2]))
    sys.exit(main(sys.argv[3:]))
