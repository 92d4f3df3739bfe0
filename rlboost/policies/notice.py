"""Which samples of an instance under a preemption notice may stay until it goes (docs/hybrid.md, "Notices").

A notice says when the instance will be killed. Taking every sample back at once (an abort each, and a
resubmission elsewhere that prefills again) throws away the instance's remaining time: a sample that
would finish well before the kill moves for nothing. A sample stays when its expected remaining tokens
(its expected length, from the history of its prompt, less what it has generated) at the instance's
measured speed per sample take no longer than the time left less a margin; the rest are taken back at
once, and whatever is still there `margin_s` before the kill is taken back then (the step does that),
so a sample that runs longer than expected moves with an exact partial output, not through a kill.

Pure: no clock, no Ray; the runtime's step and the simulator's call the same function.
"""

from __future__ import annotations

from collections.abc import Mapping


def samples_to_take_back(so_far: Mapping[str, int], expected: Mapping[str, float | None],
                         per_sample_tokens_per_s: float | None, seconds_left: float, margin_s: float) -> list[str]:
    """The uids of `so_far` (uid -> response tokens so far) to take back now, sorted: all of them without a
    measured speed, and otherwise each whose expected length (`expected`: uid -> tokens, None: no
    history) is unknown or would not be reached by `seconds_left - margin_s` at `per_sample_tokens_per_s`,
    and each that has no token yet (queued, or just admitted: moving it loses nothing, and it would wait
    for a slot behind the others). A sample already past its expected length is expected to need one
    token more, not none."""
    if not per_sample_tokens_per_s or per_sample_tokens_per_s <= 0:
        return sorted(so_far)
    budget_s = seconds_left - margin_s
    back = []
    for uid, tokens in so_far.items():
        length = expected.get(uid)
        if not tokens or length is None or max(1.0, length - tokens) / per_sample_tokens_per_s > budget_s:
            back.append(uid)
    return sorted(back)


__all__ = ["samples_to_take_back"]
