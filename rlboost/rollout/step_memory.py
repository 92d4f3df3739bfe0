"""What a run carries from one training step to the next, for both rollout backends: HistoPipe's response
lengths (the next epoch's dispatch order and overrun check) and HistoSpec's history (the next epoch's
drafts), each optional.

Contract: `plan(groups, version)` gives a training step's (dispatch order, overrun check, expected
lengths) from what was absorbed so far; `remember(groups)` keeps the step's groups, and `absorb()`
(between steps, off the rollout's critical path) turns their lengths and responses into the next
epoch's history, returning whether HistoSpec's history changed (drafters built on it must forget their
caches).
`state_dict()` / `load_state_dict()` keep both in a checkpoint under the keys `history` and
`histopipe`. Torch- and Ray-free: the colocated backend and the hybrid one (whose workers get each
prompt's share of `responses` with its requests) hold one each.
"""

from __future__ import annotations

from collections.abc import Callable

from rlboost.histospec.history import HistoryStore
from rlboost.policies.histopipe import HistoPipe
from rlboost.rollout.sample import Group
from rlboost.rollout.scheduling import dispatch_order, length_expectation, overrun_check, record_lengths


class StepMemory:
    """See the module docstring."""

    def __init__(self, history: HistoryStore | None = None, histopipe: HistoPipe | None = None):
        self.history = history
        """HistoSpec's store of each prompt's latest responses; None: HistoSpec off."""
        self.histopipe = histopipe
        """HistoPipe's policy and its length history; None: HistoPipe off."""
        self._remembered: list[Group] = []
        """The last training step's groups, absorbed at the next `absorb()`."""

    def plan(self, groups: list[Group], version: int) -> tuple[list[str] | None, Callable | None, Callable | None]:
        """(the sample uids in dispatch order, uid -> tokens so far => the overrunning uids, uid -> its
        expected length or None) for a training step's groups; (None, None, None) without HistoPipe."""
        if self.histopipe is None:
            return None, None, None
        return (dispatch_order(self.histopipe, groups, version), overrun_check(self.histopipe, groups),
                length_expectation(self.histopipe, groups))

    def remember(self, groups: list[Group]) -> None:
        """The training step's groups (their samples may still be filling in): absorbed at `absorb()`."""
        self._remembered = groups

    def absorb(self) -> bool:
        """Between steps: the remembered step's lengths and responses become the next epoch's history.
        Whether HistoSpec's history changed."""
        groups, self._remembered = self._remembered, []
        if self.histopipe is not None:
            record_lengths(self.histopipe, groups)
        if self.history is None:
            return False
        for group in groups:
            self.history.update(group.samples[0].prompt_ids, [s.response_ids for s in group.samples])
        return True

    @property
    def responses(self):
        """The history's prompt -> responses lookup (what a hybrid step sends its workers); None without
        HistoSpec."""
        return self.history.responses if self.history is not None else None

    def state_dict(self) -> dict:
        state = {"history": self.history.state_dict()} if self.history is not None else {}
        if self.histopipe is not None:
            state["histopipe"] = self.histopipe.state_dict()
        return state

    def load_state_dict(self, state: dict) -> bool:
        """Restore `state_dict()`'s output ({}: nothing); whether HistoSpec's history was restored."""
        if self.histopipe is not None and "histopipe" in state:
            self.histopipe.load_state_dict(state["histopipe"])
        if self.history is not None and "history" in state:
            self.history.load_state_dict(state["history"])
            return True
        return False
