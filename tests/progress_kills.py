"""Hard kills at token counts of a whole `rlboost train` run, for the tests that run the CLI:
`rollout.hybrid.preempt_every_tokens` (the `fixed` provider's seeded chaos with the run's progress,
response tokens generated, as its clock), with the provider ticking ten times as often as in a run.

A loaded machine and an idle one then kill at the same tokens of the run, only while it generates
(progress stands still while the trainer trains), and into the `fixed` pool, whose instances serve
before the first step. A kill lands at the provider's first tick after its token count; the tiny
model's steps generate for 0.1-0.9 s, a few ticks of a run's provider (`provider_tick_s`: 0.1 s),
so a kill would often come once the step's last tokens were in. A kill due while every instance is
still booting has no victim: count the kills that happened from the run's metrics
(`spot/preemptions`).
"""

from __future__ import annotations

TICK_S = 0.01
"""The provider's tick in these runs."""


def kills_every(mean_tokens: float) -> list[str]:
    """Overrides of a run killed once every `mean_tokens` generated tokens on average (seeded by `run.seed`)."""
    return [f"rollout.hybrid.preempt_every_tokens={mean_tokens:g}", "rollout.hybrid.preempt_every_s=0",
            f"rollout.hybrid.provider_tick_s={TICK_S:g}"]
