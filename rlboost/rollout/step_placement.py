"""Where a step's samples run: the dispatch of waiting samples (JSQ, with the shares owed to instances
still pulling the step's weights), the colocated fallback when no worker may take them, the
rebalancing between workers, and what an instance under a preemption notice keeps until its kill.
Part of `StepState` (rlboost.rollout.step_state), split where its jobs divide: the events, the seeding
window and the bookkeeping stay there, these decisions are here. Pure, like the state: no clock,
thread, Ray or torch.

`StepPlacement` is a base of `StepState` and works on its attributes: `workers`, `ledger`, `tracked`,
`stats`, `config`, `dispatcher`, `balancer`, `overruns`, `progress`, `expected`, `now`, `seeding`,
`version`, `longest_pull_s`, `_gates`, `_aborts`, `_reserved_coming`, `_ahead`; it issues work through the state's
`_submit` and `_take_back` and reads `eligible()` and `pending`.
"""

from __future__ import annotations

from collections import deque

from rlboost.policies.balance import samples_to_move
from rlboost.policies.dispatch import WorkerLoad
from rlboost.policies.notice import samples_to_take_back
from rlboost.rollout.step_data import RESERVED, StepError, Worker, WorkerState, pullers


class StepPlacement:
    """The placement decisions of `StepState` (see the module docstring)."""

    def _ensure_capacity(self) -> list[Worker]:
        """The eligible workers; when none is left with samples waiting, the reserved workers at the
        step's version take the work back (the colocated fallback), or the step fails."""
        eligible = self.eligible()
        if eligible or not self.pending:
            return eligible
        if any(w.swapping is not None and w.alive for w in self.workers.values()):
            return []  # a worker swapping in a newer version serves again once its abort is answered
        reserved = [w for w in self.workers.values() if w.kind == RESERVED and w.alive and not w.status.draining]
        if not any(w.status is WorkerState.SERVING for w in reserved):
            if self._reserved_coming or reserved or self._ahead:
                return []  # a reserved worker replacing a dead one boots or pulls; or the step waits for its own
            raise StepError(f"no rollout worker left at weight version {self.version}: "
                            + ("; ".join(f"{name}: {why}" for _, name, why in self.stats.deaths) or "none joined"))
        for w in reserved:
            w.accepting = True
        if not self.seeding:
            self.stats.fallback = True
        self._changed(members=True)
        return self.eligible()

    def _incoming(self) -> list[WorkerLoad]:
        """Preemptible workers pulling the step's weights, and not for longer than a pull takes: their
        share of the dispatch waits for them."""
        if not self.config.share_with_pulling:
            return []
        grace = max(self.config.share_grace_s, 2 * self.longest_pull_s)
        # the same pullers, as long as the earliest of them is within its grace
        return self._gates.per_membership("incoming", lambda: pullers(self.workers.values(), self.now, grace),
                                          keep=lambda found: self.now - found[0] <= grace)[1]

    def _dispatch(self) -> None:
        if not self.pending:
            return
        incoming = self._incoming()
        # JSQ places nothing exactly when no worker is open, whatever waits: until the workers, their
        # samples or who is owed a share change, asking again (O(pending + workers)) is wasted.
        names = tuple(load.name for load in incoming)
        if self._gates.idle("dispatch", names):
            return
        eligible = self._ensure_capacity()
        decisions = self.dispatcher.assign(list(self.pending), [w.load() for w in eligible], incoming)
        if not decisions:
            self._gates.found_nothing("dispatch", names)
            return
        self.ledger.pending = deque(uid for uid in self.pending if uid not in decisions)
        by_worker: dict[str, list[str]] = {}
        for uid, name in decisions.items():
            by_worker.setdefault(name, []).append(uid)
        for name, uids in by_worker.items():
            self._submit(self.workers[name], uids)

    def _rebalance(self) -> None:
        if self.pending or self._aborts:
            return  # dispatch first; and decide on loads that no abort in flight is about to change
        if self._gates.idle("unbalanceable"):
            return  # the same loads, on which no move was possible whatever the plateaus
        workers = self.eligible()
        balancer = self.balancer
        if len(workers) < 2 or not balancer.could_move(workers):
            self._gates.found_nothing("unbalanceable")
            return
        loads = [w.load() for w in workers]
        plateaus = {w.name: w.profile.plateau() for w in workers}
        seen = tuple(plateaus.values())
        if self._gates.idle("balance", seen):
            return  # the balancer is pure: the loads and plateaus that gave no move still give none
        moves = balancer.rebalance(loads, plateaus) if balancer.may_move(loads, plateaus) else []
        if not moves:
            self._gates.found_nothing("balance", seen)
            return
        for move in moves:
            source, target = self.workers[move.source], self.workers[move.target]
            so_far = self._tokens_so_far(source)
            flagged = self.overruns(dict(so_far)) if move.executing and self.overruns is not None else []
            self.stats.overruns_moved += len(flagged[:move.count])
            self._take_back(source, samples_to_move(so_far, flagged)[:move.count], "rebalanced", target=target.name)

    def _tokens_so_far(self, w: Worker) -> dict[str, int]:
        """uid -> response tokens of each sample `w` holds, as far as the shell knows."""
        progress = self.progress(w.name) if self.progress is not None else {}
        out = {}
        for uid in w.assigned:
            track = self.tracked[uid]
            out[uid] = track.base + max(progress.get(track.request_id, 0), track.tokens - track.base)
        return out

    # ---- a batch filling another's free slots --------------------------------------------------------

    def limit(self, name: str, slots: int | None) -> None:
        """The worker's slots this step may use (a batch started ahead, filling what the step before
        leaves free on it: its capacity less that step's samples there); None: all of them again. While
        limited it queues nothing, and what it holds beyond `slots` is taken back at once ("yielded"),
        the samples with the fewest response tokens first: the step before comes first, and the samples
        continue exactly elsewhere or later."""
        w = self.workers.get(name)
        if w is None or w.limit == slots:
            return
        w.limit = slots
        self._changed()
        if slots is None or not w.alive:
            return
        leaving = {uid for pa in self._aborts.values() if pa.worker == name for uid in pa.requests.values()}
        staying = [uid for uid in w.assigned if uid not in leaving]
        if len(staying) > slots:
            so_far = self._tokens_so_far(w)
            fewest = sorted(staying, key=lambda uid: (so_far[uid], uid))
            self._take_back(w, fewest[:len(staying) - slots], "yielded")

    # ---- preemption notices --------------------------------------------------------------------------

    def _noticed_take_back(self, w: Worker, now: float, deadline: float | None) -> list[str]:
        """The samples of `w`, just noticed, to take back now: all of them, unless `config.notice_keep`,
        a `deadline` and a history (`expected`) leave some expected to finish before it on `w`; then `w`
        keeps those until `notice_margin_s` before the deadline (`_take_back_before_kills`)."""
        if deadline is None or not self.config.notice_keep or self.expected is None:
            return sorted(w.assigned)
        batch = min(len(w.assigned), w.max_running)
        tokens_per_s = w.profile.throughput(batch)
        so_far = self._tokens_so_far(w)
        back = samples_to_take_back(so_far, {uid: self.expected(uid) for uid in so_far},
                                    tokens_per_s / batch if tokens_per_s else None, deadline - now,
                                    self.config.notice_margin_s)
        if len(back) < len(so_far):
            w.notice_deadline = deadline
            self.stats.kept_through_notice += len(so_far) - len(back)
        return back

    def _kept_due(self) -> list[float]:
        """When what noticed workers kept is due to be taken back."""
        return [w.notice_deadline - self.config.notice_margin_s for w in self.workers.values()
                if w.notice_deadline is not None]

    def _take_back_before_kills(self, now: float) -> None:
        """What noticed workers still hold `notice_margin_s` before their kills: taken back now."""
        for w in self.workers.values():
            if w.notice_deadline is not None and now >= w.notice_deadline - self.config.notice_margin_s:
                w.notice_deadline = None
                if w.alive and w.assigned:
                    self._take_back(w, sorted(w.assigned), "noticed")
