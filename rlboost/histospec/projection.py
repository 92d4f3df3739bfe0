"""A replay's acceptance projected to a decode speed-up at a batch size, on hardware a verify curve
describes (`rlboost bench spec --replay FILE --verify-curve JSON`). A projection, not a measurement:

- each decode step of a batch of `batch` requests verifies whole drafts; the requests' drafts in a step
  are independent draws from the replay's rounds (the histogram of draft sizes, 0 = no draft), so the
  step computes 1 + max(draft sizes) positions per request (an engine that pads to its widest draft:
  rlboost's) and costs `curve.relative(batch, 1 + max)` plain steps, or exactly one where no request
  drafted (the step runs plain);
- a request advances by its accepted tokens plus one per step, as in the replay;
- plain decoding advances one token per request per step, at one plain step's cost.

The speed-up is then (tokens advanced per request-step) / (expected cost of a step). It leaves out what
the budget adds (cuts, plain steps where drafting would not pay: it can only do better than whole
drafts everywhere), drafting's own time, and correlation between a batch's drafts. Pure.
"""

from __future__ import annotations

from collections.abc import Mapping

from rlboost.policies.verify_curve import VerifyCurve


def step_cost(draft_sizes: Mapping[int, int], batch: int, curve: VerifyCurve) -> float:
    """Expected cost of one decode step of `batch` requests, in plain steps; `draft_sizes`: rounds per
    draft size (0: a round without a draft)."""
    rounds = sum(draft_sizes.values())
    if rounds == 0:
        return 1.0
    cost, below = 0.0, 0.0  # below: P(one request's draft size <= the previous k)
    for k in sorted(draft_sizes):
        at_most = below + draft_sizes[k] / rounds
        p_max = at_most**batch - below**batch  # P(the largest of `batch` draws is k)
        cost += p_max * (1.0 if k == 0 else curve.relative(batch, 1 + k))
        below = at_most
    return cost


def projected_speedup(tally: Mapping, batch: int, curve: VerifyCurve) -> float:
    """Decode speed-up over plain decoding at `batch`, projected from a replay row (`steps`, `accepted`
    and `draft_sizes` of `rlboost.histospec.replay.Tally.row`)."""
    if tally["steps"] == 0:
        return 1.0
    advanced = (tally["accepted"] + tally["steps"]) / tally["steps"]
    return advanced / step_cost(tally["draft_sizes"], batch, curve)


__all__ = ["projected_speedup", "step_cost"]
