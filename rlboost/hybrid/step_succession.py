"""The next batch in a step's tail (bounded staleness, `algorithm.start_ahead=tail`, docs/staleness.md):
part of `StepRun` (rlboost.hybrid.step_run), split where its jobs divide.

Once a step has nothing left to place and its trainer holds the reserved GPUs (its tail: the last,
longest samples run on a few instances), the next training step's run is built (`make_successor`,
not started) and its loop's work is done by this step's loop, turn by turn, after this step's:
- the successor's decisions, in the slots this step leaves free on each worker
  (`StepState.limit`, `rlboost.policies.tail_share.ahead_slots`: a worker's `max_running` less this
  step's samples there, and of a KV cache that binds first what they can never need); this step always
  decides first, and a sample of this step that comes back (a preemption) takes a slot the successor
  yields at once;
- every worker report split between the two by the request id's sample (uids name their step);
- the worker table's events (joins, verified pulls, notices, releases, deaths) told to both;
- the successor's control calls' answers, and their timeouts.

When this step's rollout is over its loop ends as always, and `on_done` (the rollout backend's) gives
the successor every slot (`succeed`) and starts its own loop from where it stands, its requests
running: no abort, no re-prefill. A worker given back ends once neither step holds anything there.

`StepSuccession` is a base of `StepRun` and works on its attributes: `table`, `state`, `cfg`,
`successor`, `make_successor`, `peer`, `params`, `prompt_tokens`; the successor is a `StepRun` too.
"""

from __future__ import annotations

from rlboost.policies.tail_share import ahead_slots, tail_contexts
from rlboost.rollout.step_state import WorkerState


class StepSuccession:
    """The successor side of `StepRun` (see the module docstring)."""

    def _drive_successor(self, now: float) -> None:
        """This loop's turn for the successor: start it once the tail opens, then its decisions."""
        succ = self.successor
        if succ is None:
            if self.make_successor is None or not self._tail_open():
                return
            succ = self.successor = self.make_successor()
            succ.peer = self
            for h in self.table.alive():
                succ.joined(h, now)
        self._limit_successor()
        succ._execute(succ.state.decide(now))

    def _tail_open(self) -> bool:
        """Nothing of this step waits for a worker, and its trainer has the reserved GPUs."""
        state = self.state
        return state.released and not state.seeding and not state.pending and not state.done

    def _limit_successor(self) -> None:
        """Each of the successor's workers: what this step leaves free there, in sequences and, where
        the engine's KV cache binds first, in its tokens (`ahead_slots`): this step's samples counted at
        their longest, the successor's at this step's mean response so far."""
        succ, state = self.successor, self.state
        contexts = tail_contexts(self.prompt_tokens, succ.prompt_tokens, self.params.max_tokens, state.mean_response)
        for name, w in succ.state.workers.items():
            h = self.table.get(name)
            if w.alive and h is not None:
                succ.state.limit(name, ahead_slots(h.max_running, state.holding(name), h.kv_tokens, *contexts))

    def _successor_turn(self) -> None:
        """The answers to the successor's control calls, and its commands issued since."""
        succ = self.successor
        if succ is not None:
            succ._collect_answers()
            succ._execute(succ.state.take_commands())

    def _successor_timeouts(self, now: float) -> None:
        succ = self.successor
        if succ is None:
            return
        for _, h, sent in list(succ._aborts.values()):
            if now - sent > self.cfg.call_timeout_s:
                self.table.declare_dead(
                    h, f"no answer to an abort in {self.cfg.call_timeout_s}s (rollout.hybrid.call_timeout_s)", now)

    def _split(self, chunks):
        """(this step's chunks, the successor's) of a report."""
        succ = self.successor
        if succ is None or not len(chunks):
            return chunks, None
        tracked = succ.state.tracked
        theirs, mine = chunks.split(lambda request_id: request_id.rpartition("#")[0] in tracked)
        return mine, theirs if len(theirs) else None

    def _peer_holds(self, name: str) -> bool:
        """The other step of the pair still holds samples on worker `name`, or will say when it is empty
        (it is giving it back): this step's `Retire` of it waits for the other's."""
        other = self.peer if self.peer is not None else self.successor
        w = other.state.workers.get(name) if other is not None else None
        return (w is not None and w.alive and not w.retired
                and (bool(w.assigned) or w.status is WorkerState.RETIRING))

    def succeed(self) -> None:
        """The step before this one (its successor) has ended its rollout: every slot is this run's from
        now, and `start` gives it its own loop, its requests running as they are."""
        self.peer = None
        for name in list(self.state.workers):
            self.state.limit(name, None)


__all__ = ["StepSuccession"]
