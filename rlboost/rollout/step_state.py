"""One rollout step's decisions as a pure state machine (docs/hybrid.md, "The step"). The runtime's manager
(`rlboost.hybrid.step_run.StepRun`, over Ray) and the simulator (`rlboost.sim.cluster.ClusterRun`, over
an event heap) are two shells around it, so the simulator plays exactly the code the runtime runs. Its
types (config, records, statistics, commands) are `rlboost.rollout.step_data`'s, re-exported here.

Contract:
- Built from the step's samples (uid, group index, and in the runtime the `Sample` that stores the
  tokens; the simulator keeps counts only), the weight version, the seeding window, the dispatch
  order and the policies (`JSQDispatcher`, `Balancer`, HistoPipe's overrun check).
- Events in, each with the shell's `now` (monotonic seconds in the runtime, simulated seconds in the
  simulator); nothing inside reads a clock, starts a thread or touches Ray or torch:
  `join` / `pulling` / `ready` / `notice` / `retire` / `dead` / `replacing` for workers, `chunk` for
  streamed tokens (`chunks`: a report's at once; both `rlboost.rollout.step_tokens`'), `aborted` for
  the exact partial outputs an abort returned, `observe` for a decode throughput observation,
  `end_window` for a seeding window ended by an event rather than its time; with
  `StepConfig.max_staleness` k > 0, `advance` for a version the trainer published while the step runs
  and `seed` for the window of a step started ahead of its trainer (`rlboost.rollout.step_seeding`).
- Commands out: `decide(now)` runs the step's decisions (end of the seeding window, capacity,
  dispatch, balancing) and returns every command issued since the last call, in order: `Submit`,
  `Abort`, `Retire`, `ReleaseReserved`, `GroupDone`. A shell executes them in order. An abort's answer
  comes back through `aborted` (at once in the simulator, later in the runtime); until then its
  samples stay where they are and may still stream or finish.
- `progress(worker)`, given by the shell: tokens each request running on a worker has generated in
  its current attempt, streamed or not, as far as the shell knows. It picks the samples a rebalance
  moves and counts the tokens a death wastes.

Invariants enforced here (docs/hybrid.md, "Invariants and the tests that check them"), each raising
`StepError` when input breaks it:
1-3. on-policy (or at most k versions stale), exactly once, exact continuation: every token that comes
   in passes the checks of the step's `SampleLedger` (rlboost.rollout.sample_ledger);
4. waste: what a dead worker generated beyond what it streamed is counted (`StepStats.wasted_tokens`);
6. fencing: a worker declared dead never contributes again (its chunks are counted and dropped);
7. liveness: with samples left, no worker able to take them and no reserved replacement on its way,
   the step fails naming every death.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence

from rlboost.policies.balance import Balancer
from rlboost.policies.dispatch import JSQDispatcher
from rlboost.policies.handoff import StepOutlook
from rlboost.policies.profile import ThroughputProfile
from rlboost.rollout.step_data import (MIGRATIONS, PREEMPTIBLE, RESERVED, Abort, Command, GroupDone, Partial,
                                       PendingAbort, ReleaseReserved, Request, Retire, SampleState, StepConfig,
                                       StepError, StepStats, Submit, Tracked, Worker, WorkerState)
from rlboost.rollout.sample_ledger import SampleLedger
from rlboost.rollout.step_gates import DecisionGates
from rlboost.rollout.step_placement import StepPlacement
from rlboost.rollout.step_seeding import StepSeeding
from rlboost.rollout.step_tokens import StepTokens


class StepState(StepSeeding, StepPlacement, StepTokens):
    """See the module docstring; the seeding window and its hand-off are `StepSeeding`'s, the placement
    decisions (dispatch, the colocated fallback, rebalancing) `StepPlacement`'s, the tokens (chunks,
    aborts' outputs, finishes) `StepTokens`'."""

    def __init__(self, samples: Iterable[tuple[str, int, object | None]], *, version: int,
                 seed_window_s: float | None, now: float, dispatcher: JSQDispatcher, balancer: Balancer,
                 config: StepConfig | None = None, order: Sequence[str] | None = None,
                 overruns: Callable[[dict[str, int]], list[str]] | None = None,
                 progress: Callable[[str], Mapping[str, int]] | None = None, longest_pull_s: float = 0.0,
                 outlook: StepOutlook | None = None, expected: Callable[[str], float | None] | None = None,
                 ahead: bool = False):
        """`samples`: (uid, group index, token store or None) of every sample of the step.
        `seed_window_s`: the seeding window T_seed; None: no window (an evaluation, or a layout whose
        reserved workers never train), every worker generates to the end. `order`: every uid once, in
        the order to dispatch them (HistoPipe). `overruns`: uid -> tokens so far => the uids running far
        past their history, moved first by executing rebalances. `longest_pull_s`: the longest weight
        pull seen before the step (the share's grace). `outlook`: what earlier steps measured (the
        offload controller's); with it the hand-off waits until the instances would end the step
        sooner than staying colocated (`rlboost.policies.handoff`); None: it happens at the window's
        end whatever they can do (the paper's controller). `ahead`: started ahead of its trainer
        (max_staleness > 0): the reserved resources are the trainer's until `seed` brings the reserved
        workers, so with no worker yet the step waits for one instead of failing. `expected`: uid -> the
        response length its prompt's history expects (HistoPipe's; None: no history), for what a notice
        may leave running."""
        self.config = config or StepConfig()
        self.config.validate()
        self.dispatcher, self.balancer = dispatcher, balancer
        self.overruns, self.progress, self.expected = overruns, progress, expected
        self.ledger = SampleLedger(samples, version, order, self.config.max_staleness)
        self.tracked: dict[str, Tracked] = self.ledger.tracked
        self.workers: dict[str, Worker] = {}
        self.stats = StepStats()
        self.t0 = self.now = now
        self.seeding = seed_window_s is not None
        self._seed_from = now
        """When the seeding window opened (the step's start, or its trainer's with `seed`)."""
        self.outlook = outlook
        self._handoff_check_at = now + (seed_window_s or 0.0)
        """When the hand-off is weighed next (the window's end, then every handoff_check_s)."""
        self.longest_pull_s = longest_pull_s
        self.done = not self.tracked
        self._released = self._ahead = ahead
        self._share_due = False
        self._commands: list[Command] = []
        self._aborts: dict[int, PendingAbort] = {}
        self._handoffs: set[int] = set()
        self._abort_ids = itertools.count(1)
        self._handed_off = False
        self._reserved_coming = 0
        self._gates = DecisionGates()
        self._changed = self._gates.changed

    # ---- events: workers -----------------------------------------------------------------------------

    def join(self, name: str, kind: str, max_running: int, profile: ThroughputProfile | None = None, *,
             state: WorkerState = WorkerState.SERVING, pulling_since: float | None = None,
             version: int | None = None) -> None:
        """A worker takes part: at the step's start, or joining mid-step, in `state`: SERVING (it holds
        `version`, by default the step's; with max_staleness k any of the k before it), JOINING or
        PULLING (it may be owed a share while `pulling_since` is recent), NOTICED or RETIRING (it gets
        no work; a retiring one is given back at once)."""
        if name in self.workers:
            raise ValueError(f"worker {name!r} joined the step twice")
        if kind not in (RESERVED, PREEMPTIBLE):
            raise ValueError(f"worker {name!r}: kind must be {RESERVED} or {PREEMPTIBLE}, got {kind!r}")
        if not state.alive:
            raise ValueError(f"worker {name!r} cannot join the step dead")
        state = WorkerState.PULLING if state is WorkerState.JOINING else state
        version = self.version if version is None and state is WorkerState.SERVING else version
        if state is WorkerState.SERVING and not self.ledger.admits(version):
            raise ValueError(f"worker {name!r} cannot serve a step at version {self.version} with version {version} "
                             f"(max_staleness={self.config.max_staleness})")
        self.workers[name] = w = Worker(name, kind, max_running, profile or ThroughputProfile(), state,
                                        pull_since=pulling_since if state is WorkerState.PULLING else None,
                                        version=version)
        w.accepting = not (kind == RESERVED and self._handed_off)  # a late replacement: the trainer's turn
        self._changed(members=True)
        self._retire_if_empty(w)
        self._sleep_if_late(w)

    def pulling(self, name: str, since: float) -> None:
        """The worker started pulling the step's version at `since`."""
        w = self.workers[name]
        if w.status is WorkerState.PULLING:
            w.pull_since = since
            self._changed(members=True)  # who is owed a share

    def ready(self, name: str, now: float, pull_s: float | None = None, version: int | None = None) -> None:
        """The worker now holds `version`, by default the step's (`pull_s`: how long its pull took). A
        worker serving an older version (max_staleness k > 0) swaps it in between tokens: what it holds
        is taken back (`Abort.then_load`) and continues on it with the new weights."""
        self.now = now
        if pull_s is not None:
            self.longest_pull_s = max(self.longest_pull_s, pull_s)
        w = self.workers[name]
        version = self.version if version is None else version
        if w.status is WorkerState.PULLING and self.ledger.admits(version):
            w.status, w.pull_since, w.version = WorkerState.SERVING, None, version
            self._changed(members=True)
            self._sleep_if_late(w)
        elif w.status is WorkerState.SERVING and version > w.version and w.swapping is None:
            if not w.assigned:
                w.version = version
                return
            w.swapping = version
            self._changed(members=True)
            self._take_back(w, sorted(w.assigned), "refreshed", target=w.name, load=version)

    def advance(self, version: int, now: float) -> None:
        """The trainer published `version`: the step's newest from now on. A worker left more than
        max_staleness versions behind is fenced from the step until it pulls a newer one (back to
        PULLING); what it holds is taken back. With max_staleness 0 a step has one version: no shell
        advances it."""
        self.now = now
        self.ledger.advance(version)
        for w in self.workers.values():
            if w.status is WorkerState.SERVING and not self.ledger.admits(w.version):
                w.status, w.pull_since = WorkerState.PULLING, None
                self._changed(members=True)
                if w.assigned:
                    self._take_back(w, sorted(w.assigned), "fenced")

    def replacing(self, count: int, failed: str | None = None) -> None:
        """`count` replacements of dead reserved workers boot (each `join`s when admitted): with none
        serving, the step waits for them instead of failing. `failed`: why one did not start."""
        self._reserved_coming = count
        self._changed(members=True)
        if failed is not None:
            self.stats.deaths.append((self.now - self.t0, "a reserved worker's replacement", failed))

    def notice(self, name: str, now: float, deadline: float | None = None) -> None:
        """A preemption notice: no more work, and what it holds is taken back before the kill at
        `deadline` (None: unknown). With `config.notice_keep`, a deadline and a history, the samples
        expected to finish `notice_margin_s` before it stay (`rlboost.policies.notice`), and what is left
        of them then is taken back at that time (`decide`); otherwise all are taken back now."""
        self.now = now
        w = self.workers.get(name)
        if w is None or not w.alive or w.status.draining:
            return
        w.status = WorkerState.NOTICED
        self._changed(members=True)
        if not w.assigned:
            return
        back = self._noticed_take_back(w, now, deadline)
        if back:
            self._take_back(w, back, "noticed")

    def retire(self, name: str, now: float) -> None:
        """The worker is being given back (an instance beyond the cap): like a notice, then `Retire`
        once it holds nothing, so the end loses no token."""
        self.now = now
        w = self.workers.get(name)
        if w is None or not w.alive or w.status is WorkerState.RETIRING:
            return
        was_draining, w.status = w.status.draining, WorkerState.RETIRING
        if not was_draining:
            self._changed(members=True)
            if w.assigned:
                self._take_back(w, sorted(w.assigned), "released")
        self._retire_if_empty(w)

    def dead(self, name: str, reason: str, now: float, released: bool = False, counted: bool = True) -> None:
        """The worker is gone (killed, vanished, silent, or given back when `released`). Its samples go
        back to pending from their last received token; anything it sends from now on is dropped.
        `counted=False`: the step running beside this one (a batch started in its tail) counts the
        preemption; this one still counts its samples in flight and what they lost."""
        self.now = now
        w = self.workers.get(name)
        if w is None or not w.alive:
            return
        stats = self.stats
        w.status = WorkerState.DEAD
        self._changed(members=True)
        stats.deaths.append((now - self.t0, name, reason))
        if w.kind == PREEMPTIBLE and not released:
            stats.preemptions += counted
            stats.in_flight_at_preemption += len(w.assigned)
        progress = self.progress(name) if self.progress is not None and w.assigned else {}
        wasted, forgotten = self.ledger.requeue_dead(sorted(w.assigned), progress, self.config.migration == "recompute")
        stats.wasted_tokens += wasted
        stats.recomputed_tokens += forgotten
        stats.migrated["preempted"] += len(w.assigned)
        w.assigned.clear()
        w.holding_changed(self.now)
        for aid in [aid for aid, pa in self._aborts.items() if pa.worker == name]:
            del self._aborts[aid]  # its samples are back already; the answer no longer matters
            self._handoffs.discard(aid)

    def observe(self, name: str, batch_size: int, tokens_per_s: float) -> None:
        """A decode throughput observation of the worker (its plateau B is the balancer's input)."""
        w = self.workers.get(name)
        if w is not None:
            w.profile.observe(batch_size, tokens_per_s)

    # ---- decisions -----------------------------------------------------------------------------------

    def decide(self, now: float) -> list[Command]:
        """Run the step's decisions at `now` and return every command issued since the last call."""
        self.now = now
        if not self.done:
            self._take_back_before_kills(now)
            self._seeding_decisions(now)
            self._dispatch()
            self._rebalance()
        self._release_if_free()
        return self.take_commands()

    def take_commands(self) -> list[Command]:
        """The commands issued by events since the last call, without deciding anything."""
        commands, self._commands = self._commands, []
        return commands

    def remote_timings(self, end: float) -> tuple[float, float]:
        """The offload controller's (t_remote, t_wait_remote) for this step, its training having
        ended at `end` (the paper's artifact measures them so): how long the instances generated, from
        the first work one got to the step's last response, and how long the step went on after that
        response. t_wait_remote is 0 when no instance generated: then nobody waited on them."""
        if not self.done:
            raise StepError("remote_timings: the step's rollout has not finished")
        return self.stats.remote_timings(self.t0, end)

    def next_deadline(self) -> float | None:
        """When a decision is due without any event (the end of the seeding window, or what a noticed
        worker kept taken back before its kill); None: none."""
        if self.done:
            return None
        due = self._kept_due()
        if self.seeding:
            due.append(self._handoff_check_at)
        return min(due, default=None)

    @property
    def pending(self) -> deque[str]:
        """Uids of the samples waiting for a worker, in dispatch order."""
        return self.ledger.pending

    @property
    def num_finished(self) -> int:
        return self.ledger.num_finished

    @property
    def mean_response(self) -> float | None:
        """Mean response tokens of the samples finished so far; None: none has."""
        ledger = self.ledger
        return ledger.finished_tokens / ledger.num_finished if ledger.num_finished else None

    @property
    def released(self) -> bool:
        """The reserved resources are the trainer's."""
        return self._released

    def holding(self, name: str) -> int:
        """Samples the worker runs or queues."""
        w = self.workers.get(name)
        return len(w.assigned) if w is not None else 0

    def eligible(self) -> list[Worker]:
        """The workers that may take work now, in the order they joined."""
        return self._gates.per_membership(
            "eligible", lambda: [w for w in self.workers.values() if self._eligible(w)])

    # ---- internals -----------------------------------------------------------------------------------

    @property
    def version(self) -> int:
        """The step's newest weight version (`advance` moves it)."""
        return self.ledger.version

    def admits(self, version: int | None) -> bool:
        """Whether tokens of `version` may join the step now (within max_staleness of its newest)."""
        return self.ledger.admits(version)

    @staticmethod
    def _eligible(w: Worker) -> bool:
        return w.status is WorkerState.SERVING and w.accepting and w.swapping is None

    def _release_if_free(self) -> None:
        if not self._released and not self.seeding and not self._handoffs:
            self._released = True
            self._commands.append(ReleaseReserved())

    def _submit(self, w: Worker, uids: list[str]) -> None:
        if w.kind == PREEMPTIBLE and self.stats.remote_start_s is None:
            self.stats.remote_start_s = self.now - self.t0
        requests = [self.ledger.start(uid, w.name) for uid in uids]
        w.assigned.update(uids)
        w.holding_changed(self.now)
        w.last_finish = None
        self._changed()
        self._commands.append(Submit(w.name, requests))

    def _take_back(self, w: Worker, uids: list[str], reason: str, then_sleep: bool = False,
                   target: str | None = None, load: int | None = None) -> int:
        aid = next(self._abort_ids)
        requests = {self.tracked[uid].request_id: uid for uid in uids}
        self._aborts[aid] = PendingAbort(w.name, requests, reason, target, self.now, load)
        self._commands.append(Abort(aid, w.name, list(requests), reason, then_sleep, load))
        return aid

    def _sleep_if_late(self, w: Worker) -> None:  # a reserved worker serving after the hand-off frees its memory
        if w.kind == RESERVED and not w.accepting and w.status is WorkerState.SERVING:
            self._take_back(w, [], "seed_handoff", then_sleep=True)

    def _retire_if_empty(self, w: Worker) -> None:
        if (w.status is WorkerState.RETIRING and not w.retired and not w.assigned
                and not any(pa.worker == w.name for pa in self._aborts.values())):
            w.retired = True
            self._commands.append(Retire(w.name))


__all__ = ["MIGRATIONS", "PREEMPTIBLE", "RESERVED", "Abort", "Command", "GroupDone", "Partial", "ReleaseReserved",
           "Request", "Retire", "SampleState", "StepConfig", "StepError", "StepState", "StepStats", "Submit",
           "Tracked", "Worker", "WorkerState"]
