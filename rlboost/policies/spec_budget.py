"""When to speculate: a batch-aware budget from measured step times (docs/histospec.md, "How it works").

Speculation pays while decoding is memory-bound: verifying a few draft tokens per request costs
about one step, so every accepted token is nearly free. As the batch grows the step becomes
compute-bound and each draft token costs real time, accepted or not. Rather than model that, the
budget measures it: per batch size, the time per emitted token of plain decode steps and of
verification steps, and speculates only where verification is the cheaper one. Time per token is
the ratio of moving averages of a step's seconds and of its tokens, a throughput: a moving average of
each step's ratio would be ruled by unlucky verifications (a full draft verified, one token emitted),
and keep speculation off where, step for step, it pays.
Every `probe_every`-th eligible step runs plain so the baseline stays measured (and a batch size
where speculation lost gets retried on the probes' schedule).

How much of a draft to verify (`nodes`, for engines that verify any prefix of a draft tree): a verify
step costs a plain step of its batch plus s + k*x, x the positions it computes beyond one per request
(`extra_positions`), the line fitted to its measured steps (per batch size where the drafts' sizes
let it, else over all). Node i of a tree (parents first) is accepted with a probability measured per
index; with coupled draws that does not depend on which other nodes are verified, so the first n
nodes of every tree are expected to add the sum of those probabilities in tokens, each saving a
plain token's time. The budget keeps the n with the largest expected saving net of their cost: none
where nothing pays (the step is then plain), few where positions are dear (a large batch on a CPU),
all where they are nearly free (a memory-bound GPU step). Every `4 * probe_every`-th speculating
step verifies whole drafts, so the acceptance of nodes it cut stays measured; before any verify step
was timed, whole drafts only where they add at most `FIRST_POSITIONS` positions (one node of a
large batch: whole drafts there cost several plain steps on a CPU). An engine that pads
its verify batch to the widest draft (rlboost's) pays node i's position for every request of the
step; one that verifies ragged drafts (vLLM: `ragged=True`) only for the drafts that have a node i.
Once an engine reports these costs, whether a step drafts at all follows the same sum over the
drafts steps have typically had (the share of requests with an i-th node), not the per-token time
of past verify steps, which whole drafts verified before any cut was possible would set.
A verify curve (`prior`, e.g. from `make gpu-check`) seeds a batch size's cost fit once its plain step
is measured, so the first cuts weigh drafts by the hardware's curve rather than `FIRST_POSITIONS`; the
steps measured after correct it, and it fades as they come.
Pure: the engine passes the times in.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from rlboost.policies.verify_curve import VerifyCurve


NODE_MEMORY = 2000
"""Verified drafts after which the node acceptance counts are halved (the policy changes as it trains)."""


FIRST_POSITIONS = 32
"""Draft positions per request times the batch that a verify step may add before any was timed: whole
drafts at small batches, one node at a large one (where whole drafts would cost several plain steps)."""


class LineFit:
    """y = intercept + slope * x by exponentially weighted least squares (`forget`: each older
    observation's weight shrinks by that factor)."""

    def __init__(self, forget: float = 0.95):
        self.forget = forget
        self._sums = [0.0] * 5  # weights, x, y, x*x, x*y

    def add(self, x: float, y: float, weight: float = 1.0) -> None:
        """One observation (`weight`: as many as that; the prior's points weigh less than one)."""
        f = self.forget
        self._sums = [f * old + weight * new for old, new in zip(self._sums, (1.0, x, y, x * x, x * y))]

    def line(self) -> tuple[float, float] | None:
        """(intercept, slope >= 0), or None before two observations. Where x hardly varied the
        intercept is not identified: the line through the origin, every second charged per position."""
        w, sx, sy, sxx, sxy = self._sums
        if w < 1.5:
            return None
        if sx <= 0:  # every draft was cut whole: what verifying costs beyond that is not measured yet
            return sy / w, 0.0
        spread = w * sxx - sx * sx
        if spread > 1e-3 * w * sxx:
            slope = (w * sxy - sx * sy) / spread
            if slope >= 0:
                return (sy - slope * sx) / w, slope
        return 0.0, max(sy, 0.0) / sx


PRIOR_WEIGHT = 3.0
"""Observations the verify curve's prior counts for, per batch size: measured verify steps outweigh it
after a few, and it fades as they come (LineFit's forgetting)."""


class SpecBudget:
    def __init__(self, max_batch: int, probe_every: int = 8, smoothing: float = 0.3, ragged: bool = False,
                 prior: VerifyCurve | None = None):
        if probe_every < 2:
            raise ValueError(f"probe_every must be >= 2, got {probe_every}")
        self.max_batch, self.probe_every, self.smoothing = max_batch, probe_every, smoothing
        self.ragged = ragged
        """Whether a verify step computes only its drafts' own positions (else every request's row is
        padded to the widest draft): what a cut node costs."""
        self.prior = prior
        """A verify curve (rlboost.policies.verify_curve) the cost fit of a batch size starts from, once
        that batch's plain step is measured (its seconds scale the curve's ratios); None: no prior."""
        self._plain: dict[int, tuple[float, float]] = {}
        """Batch size -> moving averages of (seconds, emitted tokens) of plain decode steps."""
        self._spec: dict[int, tuple[float, float]] = {}
        """Batch size -> the same of verification steps."""
        self._eligible: Counter[int] = Counter()
        self._extra: dict[int, LineFit] = {}
        """Batch size -> the fit of a verify step's seconds beyond its batch's plain step, against the
        positions it computed beyond one per request; key 0: over every batch size."""
        self._node_counts: list[list[float]] = []
        """Per node index (a tree's nodes parents first): [times verified, times accepted]."""
        self._speculating = 0
        self._drafted_share: list[float] = []
        """Per node index: moving average of the share of a drafting step's requests whose draft has it."""

    def speculate(self, batch: int) -> bool:
        """Whether the coming decode step of `batch` requests should draft: where the verify cost and
        the acceptance are measured (engines that report both), where the best cut of typical drafts
        is expected to save time; else where verify steps of this batch size measured cheaper per token."""
        if not 0 < batch <= self.max_batch:
            return False
        self._eligible[batch] += 1
        count = self._eligible[batch]
        if batch not in self._plain or count % self.probe_every == 0:
            return False  # measure (or refresh) the plain baseline first
        if batch not in self._spec or count % (4 * self.probe_every) == 1:
            return True  # measure speculation too, and retry it now and then where it lost
        expected = self._best_cut(batch, [share * batch for share in self._drafted_share])
        if expected is not None:
            return expected[0] > 0
        return self.per_token(batch, True) < self.per_token(batch, False)

    def fresh(self) -> SpecBudget:
        """A budget of the same settings that has measured nothing."""
        return SpecBudget(self.max_batch, self.probe_every, self.smoothing, self.ragged, self.prior)

    def nodes(self, batch: int, sizes: Sequence[int]) -> int:
        """How many nodes of each of the step's drafts (their sizes `sizes`, one per request that has
        one) to verify: the first n of every tree, n chosen for the largest expected saving (0: run the
        step plain). Until the cost is measured, whole drafts up to `FIRST_POSITIONS` positions; whole
        drafts on every `4 * probe_every`-th call."""
        largest = max(sizes, default=0)
        drafting = [sum(size > i for size in sizes) for i in range(largest)]
        a = self.smoothing
        self._drafted_share += [0.0] * (largest - len(self._drafted_share))
        self._drafted_share = [old + a * ((drafting[i] if i < largest else 0) / batch - old)
                               for i, old in enumerate(self._drafted_share)]
        self._speculating += 1
        best = self._best_cut(batch, drafting)
        if best is None:  # nothing measured yet: whole drafts, up to a first step's positions
            return min(largest, max(1, FIRST_POSITIONS // batch))
        if self._speculating % (4 * self.probe_every) == 0:
            return largest
        return best[0]

    def _best_cut(self, batch: int, drafting: Sequence[float]) -> tuple[int, float] | None:
        """(n, the expected seconds saved) for verifying the first n nodes of drafts of which
        `drafting[i]` have an i-th node, n = 0 where none saves any; None before the cost is measured."""
        fits = [fit for fit in (self._extra.get(batch), self._extra.get(0)) if fit is not None]
        line = next((line for line in map(LineFit.line, fits) if line is not None), None)
        plain = self.plain_step_s(batch)
        if line is None or plain is None:
            return None
        intercept, slope = line
        per_token = plain / batch
        best, gain = (0, 0.0), -intercept
        for n, count in enumerate(drafting, 1):
            gain += per_token * self.acceptance(n - 1) * count - slope * (count if self.ragged else batch)
            if gain > best[1]:
                best = (n, gain)
        return best

    def acceptance(self, index: int) -> float:
        """The measured probability that node `index` of a draft (parents first) is accepted; a
        prior of 1/2 until measured."""
        verified, accepted = self._node_counts[index] if index < len(self._node_counts) else (0.0, 0.0)
        return (accepted + 0.5) / (verified + 1.0)

    def verified(self, size: int, accepted: Sequence[int]) -> None:
        """A draft of `size` nodes was verified and the nodes `accepted` (indices) were accepted."""
        while len(self._node_counts) < size:
            self._node_counts.append([0.0, 0.0])
        if self._node_counts and self._node_counts[0][0] >= NODE_MEMORY:  # the policy moves on: so do they
            self._node_counts = [[verified / 2, accepted / 2] for verified, accepted in self._node_counts]
        for counts in self._node_counts[:size]:
            counts[0] += 1
        for index in accepted:
            self._node_counts[index][1] += 1

    def observe(self, batch: int, seconds: float, tokens: int, speculative: bool,
                extra_positions: int | None = None) -> None:
        """A decode step of `batch` requests took `seconds` and emitted `tokens` tokens; a verify step
        may say how many positions it computed beyond one per request (`extra_positions`, 0 when its
        drafts were all cut), which fits the cost `nodes` weighs."""
        if batch <= 0 or tokens <= 0 or seconds <= 0:
            return
        plain = self.plain_step_s(batch)
        if speculative and extra_positions is not None and plain is not None:
            for key in (batch, 0):
                self._extra.setdefault(key, LineFit()).add(extra_positions, seconds - plain)
        table = self._spec if speculative else self._plain
        old = table.get(batch)
        a = self.smoothing
        table[batch] = (seconds, tokens) if old is None else (old[0] + a * (seconds - old[0]),
                                                              old[1] + a * (tokens - old[1]))
        if not speculative and old is None and self.prior is not None and batch not in self._extra:
            self._seed_from_prior(batch)

    def _seed_from_prior(self, batch: int) -> None:
        """The batch's cost fit starts from the verify curve: a verify step of n positions per request
        costs plain x (relative(n) - 1) more, at (n - 1) positions per request beyond one (as many for
        a ragged engine when every request drafts n - 1)."""
        plain = self.plain_step_s(batch)
        points = self.prior.positions(batch)
        fit = self._extra.setdefault(batch, LineFit())
        for n in points:
            fit.add(batch * (n - 1), plain * (self.prior.relative(batch, n) - 1), PRIOR_WEIGHT / len(points))

    def per_token(self, batch: int, speculative: bool) -> float | None:
        """Measured seconds per emitted token of `batch`-request steps, verifying or plain (None: never
        measured)."""
        measured = (self._spec if speculative else self._plain).get(batch)
        return None if measured is None else measured[0] / measured[1]

    def plain_step_s(self, batch: int) -> float | None:
        """Measured seconds of a plain decode step of `batch` requests (None if never measured)."""
        per_token = self.per_token(batch, False)
        return None if per_token is None else per_token * batch
