"""Hard kills at token counts of a whole `rlboost train` run, for the tests that run the CLI:
`rollout.hybrid.preempt_every_tokens` (the `fixed` provider's seeded chaos with the run's progress,
response tokens generated, as its clock), with the provider ticking ten times as often as in a run.

A loaded machine and an idle one then kill at the same tokens of the run, only while it generates
(progress stands still while the trainer trains), and into the `fixed` pool, whose instances serve
before the first step. A kill lands at the provider's first tick after its token count; the tiny
model's steps generate for 0.1-0.9 s, a few ticks of a run's provider (`TICK_S` there: 0.1 s), so a
kill would often come once the step's last tokens were in. A kill due while every instance is still
booting has no victim: count the kills that happened from the run's metrics (`spot/preemptions`).

In the test's process: `faster_ticks(monkeypatch.setattr)`, then `rlboost.cli.main([...,
*kills_every(tokens)])`. A run in a process of its own: `command(*argv)` runs `python -m progress_kills
ARGV...` with this folder on PYTHONPATH.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path

import rlboost.hybrid.providers as providers

TICK_S = 0.01
"""The provider's tick in these runs."""


def kills_every(mean_tokens: float) -> list[str]:
    """Overrides of a run killed once every `mean_tokens` generated tokens on average (seeded by `run.seed`)."""
    return [f"rollout.hybrid.preempt_every_tokens={mean_tokens:g}", "rollout.hybrid.preempt_every_s=0"]


def faster_ticks(patch: Callable = setattr) -> None:
    """Providers started from now on in this process tick every TICK_S (`patch`: a test's
    `monkeypatch.setattr`, undone after it)."""
    patch(providers, "TICK_S", TICK_S)


def command(*argv: str) -> tuple[list[str], dict[str, str]]:
    """(command line, environment) of `rlboost <argv>` in a process of its own whose providers tick
    every TICK_S; run it from the repository's root (`-m` finds `rlboost` there)."""
    paths = [str(Path(__file__).parent), *filter(None, [os.environ.get("PYTHONPATH")])]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(paths))
    return [sys.executable, "-m", "progress_kills", *argv], env


if __name__ == "__main__":
    from rlboost.cli import main

    faster_ticks()
    sys.exit(main(sys.argv[1:]))
