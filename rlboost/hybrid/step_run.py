"""One step's rollout on Ray: the runtime's shell around the step's `StepState`.

Contract: `StepRun` turns what happens on Ray into StepState events (reports into chunks and decode
observations, abort answers into exact partial outputs, deaths from streams, liveness and pulls into
`dead`, inbox messages into joins, notices and releases) and carries out the commands that come back:
`Submit` and `Abort` become non-blocking actor calls, `Retire` ends a given-back instance,
`ReleaseReserved` lets the trainer start, `GroupDone` hands the group to `groups()`. Every decision
(seeding hand-off, fallback, dispatch, balancing, which samples move, waste, group completion) is the
StepState's, the same code the simulator plays.

Its loop runs in a thread of its own, owns the worker table until the step ends and listens to it
(`rlboost.hybrid.worker_table.Membership`): joins, verified pulls, notices, releases and deaths become
StepState events. A failure stops the loop and is re-raised by `groups()`. Once the trainer is done,
`finish(end)` returns the step as a value, a frozen `StepReport`: what the rest of the run reads.

With bounded staleness (`max_staleness` k > 0, docs/staleness.md) a run may be started `ahead` of its
trainer, on the instances alone, while the trainer still trains the step before; `call(fn)` runs the
driver's calls between steps (a publish) in its loop, which owns the workers meanwhile; `adopt` brings
the reserved workers when its trainer comes (`StepState.seed`). `on_done` is called from the loop
thread once the rollout is over and the workers are released: where the next run ahead starts.
"""

from __future__ import annotations

import dataclasses
import queue
import threading
import time
from collections.abc import Callable, Iterator

from rlboost.engine.sampling_params import SamplingParams
from rlboost.hybrid.config import HybridConfig
from rlboost.hybrid.handles import RESERVED, WorkerHandle, WorkerState
from rlboost.hybrid.liveness import Liveness
from rlboost.hybrid.pulls import PullTracker
from rlboost.hybrid.sibling_relay import SiblingRelay
from rlboost.hybrid.step_commands import StepCommands
from rlboost.hybrid.step_report import StepReport
from rlboost.hybrid.step_succession import StepSuccession
from rlboost.hybrid.report_relay import RelayedReports
from rlboost.hybrid.streams import TurnPacer
from rlboost.hybrid.token_ledger import ledger_path, read_ledger
from rlboost.hybrid.wire import WorkerReport
from rlboost.hybrid.worker_table import WorkerTable, describe
from rlboost.policies import Balancer, JSQDispatcher
from rlboost.policies.handoff import StepOutlook
from rlboost.rollout.sample import Group, RolloutProgress
from rlboost.rollout.step_state import StepConfig, StepState, StepStats
from rlboost.run_log import event

POLL_S = 0.02
"""Longest wait for a report when nothing is ready: the loop's other checks run at least this often."""
SHARE_GRACE_S = 1.0
"""A pulling worker keeps its share of the dispatch for at least this long (StepConfig.share_grace_s)."""
HOUSEKEEPING_S = 0.1
"""Period of the per-worker checks: heartbeats and pings, abort and pull timeouts, finished pulls. Each
costs O(workers); the timeouts they enforce are seconds, and 100 ms delays a verdict, or a new worker's
first dispatch, by about one report interval. Inbox messages are applied on every turn."""


@dataclasses.dataclass(frozen=True)
class StepPolicies:
    """What decides the step: the run's dispatch policies and this step's inputs to them."""

    dispatcher: JSQDispatcher
    balancer: Balancer
    order: list[str] | None = None
    """Every uid once, in dispatch order (HistoPipe's); None: the groups' order."""
    overruns: Callable[[dict[str, int]], list[str]] | None = None
    """uid -> tokens so far => the uids far past their history (HistoPipe's), moved first."""
    outlook: StepOutlook | None = None
    """The offload controller's, for the no-regret hand-off (None: at the window's end)."""
    expected: Callable[[str], float | None] | None = None
    """uid -> the response length its prompt's history expects (HistoPipe's): what a notice leaves running."""


class StepRun(StepCommands, StepSuccession):
    """One step's rollout, driven by a thread; `groups()` yields finished groups to the trainer. The
    commands and the answers to its calls are `StepCommands`'s, the next batch run in its tail
    `StepSuccession`'s."""

    def __init__(self, table: WorkerTable, reader: RelayedReports, pulls: PullTracker, policies: StepPolicies,
                 cfg: HybridConfig, groups: list[Group], params: SamplingParams, version: int,
                 seed_window_s: float | None, history: Callable[[list[int]], list[list[int]]] | None = None,
                 sibling_tokens_per_step: int = 0, max_staleness: int = 0, ahead: bool = False,
                 on_done: Callable[[], None] | None = None, make_successor: Callable[[], StepRun] | None = None):
        """The step, not started: building it changes nothing of the table's. `start()` hands it the
        workers. `sibling_tokens_per_step` > 0: forward each worker the tokens of its groups' samples
        running elsewhere, up to that many per worker (`rlboost.hybrid.sibling_relay`)."""
        self.table, self.pulls, self.cfg = table, pulls, cfg
        self.params, self.version, self.history = params, version, history
        self.groups_by_index = {g.index: g for g in groups}
        samples = [s for g in groups for s in g.samples]
        self.prompt_tokens = sum(len(s.prompt_ids) for s in samples) / max(1, len(samples))
        """Mean prompt length of the step's samples (what a sample's KV starts at)."""
        self.t0 = time.monotonic()
        self.state = StepState(
            [(s.uid, g.index, s) for g in groups for s in g.samples], version=version,
            seed_window_s=seed_window_s, now=self.t0, dispatcher=policies.dispatcher, balancer=policies.balancer,
            config=StepConfig(share_with_pulling=cfg.share_with_pulling, share_grace_s=SHARE_GRACE_S,
                              notice_keep=cfg.notice_keep, notice_margin_s=cfg.notice_margin_s,
                              max_staleness=max_staleness),
            order=policies.order, overruns=policies.overruns, progress=self._progress,
            longest_pull_s=pulls.longest_s, outlook=policies.outlook, expected=policies.expected, ahead=ahead)
        self.groups_list = groups
        self.on_done = on_done
        self.make_successor = make_successor
        """Builds the next training step's run (not started) once this step's tail opens (max_staleness
        > 0, start_ahead=tail; `rlboost.hybrid.step_succession`); None: not in this step."""
        self.successor: StepRun | None = None
        """That run, driven by this loop until this step's rollout is over."""
        self.peer: StepRun | None = None
        """The run driving this one (this is its successor), until the hand-over."""
        self._calls: list[tuple[Callable[[], None], threading.Event, list]] = []
        self._calls_lock = threading.Lock()
        self._closed = False  # the loop ran its last calls: later ones run in their caller
        self.training_may_start = threading.Event()
        self.released_at: float | None = None
        """When the reserved resources became the trainer's (monotonic)."""
        self.trainer_wait_s = 0.0
        self.loop_cpu_s = 0.0
        """CPU seconds the loop thread used for the step: the manager's own overhead."""
        self.relay_cpu_s = 0.0
        """CPU seconds of the report relay's process in the step (`rlboost.hybrid.report_relay`)."""
        self.reports = 0
        """Worker reports the loop handled in the step."""
        self._out: queue.SimpleQueue = queue.SimpleQueue()
        self._submits: dict[object, WorkerHandle] = {}
        self._aborts: dict[object, tuple[int, WorkerHandle, float]] = {}
        self._history_sent: set[tuple[str, int]] = set()  # (worker, group index)
        self.siblings = SiblingRelay(sibling_tokens_per_step, groups) if sibling_tokens_per_step > 0 else None
        """Sibling progress across instances (HistoSpec); None: off."""
        self._reader = reader
        self._pacer = TurnPacer(self.cfg.manager_cpu_share)
        self._liveness = Liveness(self.cfg.heartbeat_interval_s, self.cfg.heartbeat_timeout_s)
        self._next_housekeeping = 0.0
        self._cancelled = threading.Event()
        self._window_ended = threading.Event()
        self._owning = threading.Event()
        self.thread = threading.Thread(target=self._run, name="rollout-manager", daemon=True)

    def start(self) -> None:
        """Start the loop thread and return once it owns the workers (`table.owner`, taken when the
        driver's calls between steps are done). From then on the loop alone holds `owner`, and releases it
        exactly once, when the step ends however it ends (done, failed or cancelled): an interruption of
        the caller (a stop signal) cannot release it under the loop, nor leave it held."""
        self.thread.start()
        self._owning.wait()

    def _take_over(self) -> None:
        """The loop thread, holding `owner`: what changed between steps, then every live worker joins the
        step and the table tells the step of every change from now on."""
        table = self.table
        table.apply_inbox(time.monotonic())
        self._liveness.watch_from(table.alive(), self.t0)
        for h in table.alive():
            self.joined(h, self.t0)
        self.state.replacing(table.replacing)  # booting since the step before
        table.listen(self)

    # ---- the trainer's side --------------------------------------------------------------------------

    @property
    def stats(self) -> StepStats:
        return self.state.stats

    @property
    def tracked(self):
        return self.state.tracked

    def finish(self, end: float) -> StepReport:
        """The step as a value, its training having ended at `end` (monotonic): waits for the loop
        thread (the trainer may stop reading right after the last group), then takes what the pulls and
        the deaths between steps (since the last report) add."""
        self.thread.join()
        state = self.state
        remote_s, wait_remote_s = state.remote_timings(end=end)
        return StepReport(
            stats=state.stats, samples=len(state.tracked),
            response_tokens=sum(track.tokens for track in state.tracked.values()),
            t0=self.t0, released_s=(self.released_at or end) - self.t0, trainer_wait_s=self.trainer_wait_s,
            remote_s=remote_s, wait_remote_s=wait_remote_s, loop_cpu_s=self.loop_cpu_s,
            relay_cpu_s=self.relay_cpu_s, reports=self.reports,
            pulls=self.pulls.take_stats(), deaths_between_steps=tuple(self.table.between_steps.take()))

    def tokens(self) -> int:
        """Response tokens generated so far in the step, by every worker (never decreases); from any thread."""
        return sum(list(self.state.stats.tokens_by_kind.values()))

    def live(self, training: bool, instances: tuple[int, int, int]) -> RolloutProgress:
        """The step now, read from another thread (counters and snapshots only). `instances`: (serving,
        pulling, booting)."""
        state = self.state
        phase = "done" if state.done else "generating" if not training else \
            "seeding" if state.seeding else "offloaded"
        return RolloutProgress(phase, state.num_finished, len(state.tracked), self.tokens(),
                               time.monotonic() - self.t0, state.stats.wasted_tokens, instances)

    def groups(self) -> Iterator[Group]:
        """Finished groups in completion order, released once the reserved resources are free to
        train; re-raises whatever stopped the loop. Time spent waiting after that is the trainer's idle
        time (`trainer_wait_s`)."""
        self.training_may_start.wait()
        for _ in range(len(self.groups_by_index)):
            t0 = time.monotonic()
            item = self._out.get()
            self.trainer_wait_s += time.monotonic() - t0
            if isinstance(item, BaseException):
                raise item
            yield item
        self.thread.join()

    def wait(self, timeout: float | None = None) -> None:
        """Until the loop thread has ended (the trainer may stop reading after the last group)."""
        self.thread.join(timeout)

    def call(self, fn: Callable[[], None]) -> bool:
        """Run `fn` in the loop thread at its next turn, holding the workers, and wait for it (any
        thread; `fn`'s error is raised here). False: the loop has ended, `fn` did not run (the caller may
        take the table's `owner` itself)."""
        with self._calls_lock:
            if not self._taking_calls():
                return False
            done, box = threading.Event(), []
            self._calls.append((fn, done, box))
        done.wait()
        if box:
            raise box[0]
        return True

    def chain(self, on_done: Callable[[], None], make_successor: Callable[[], StepRun] | None = None) -> bool:
        """Set `on_done` (and `make_successor`) while the loop runs (any thread). False: the loop has
        ended; if its rollout finished, the caller runs `on_done` itself."""
        with self._calls_lock:
            if not self._taking_calls():
                return False
            self.on_done, self.make_successor = on_done, make_successor
            return True

    def _taking_calls(self) -> bool:
        """The loop runs, or will run, what is handed to it (the caller holds `_calls_lock`): not ended,
        and started (a stop landing in start_step can leave a run that never did)."""
        return not self._closed and self.thread.is_alive()

    def adopt(self, seed_window_s: float, outlook: StepOutlook | None) -> None:
        """The trainer comes to a run started ahead: from now the step is its (its timings count from
        here), and the reserved workers seed what is left (`StepState.seed`), or, with nothing left,
        the trainer starts at once."""
        def seed() -> None:
            now = time.monotonic()
            self.t0, self.released_at = now, None
            self.training_may_start.clear()
            self.state.seed(now, seed_window_s, outlook)
            for h in self.table.alive():
                self.joined(h, now)  # the reserved workers, now that they are the step's
            if self.state.released:
                self._release_reserved()

        if not self.call(seed):  # the rollout ended before its trainer came: nothing to seed
            self.t0 = self.released_at = time.monotonic()
            self.training_may_start.set()

    def end_seed_window(self) -> None:
        """End the seeding window at the loop's next turn, whatever its length (any thread): the hand-off
        placed at an event of the step (a token count, a worker's state) rather than at a time."""
        self._window_ended.set()

    def cancel(self) -> None:
        """Stop the loop (the consumer gave up, e.g. on a reward-function error) and wait for it."""
        self._cancelled.set()
        if self.thread.is_alive():
            self.thread.join()

    # ---- the worker table's events (Membership) ------------------------------------------------------

    def joined(self, h: WorkerHandle, now: float) -> None:
        """`h` takes part in the step: serving its version, pulling it, or draining."""
        state = self.state
        if self.successor is not None:
            self.successor.joined(h, now)
        if h.name in state.workers or not h.alive or (state.ahead and h.kind == RESERVED):
            return  # a run ahead of its trainer gets the reserved workers when it is adopted
        serving = state.admits(h.version) and h.state is not WorkerState.JOINING
        standing = h.state if h.draining else WorkerState.SERVING if serving else WorkerState.PULLING
        state.join(h.name, h.kind, h.max_running, h.profile, state=standing,
                   pulling_since=None if serving else self.pulls.pulling_since(h, self.version),
                   version=h.version if standing is WorkerState.SERVING else None)

    def ready(self, h: WorkerHandle, pull_s: float, now: float) -> None:
        """`h` verified the current version."""
        if self.successor is not None:
            self.successor.ready(h, pull_s, now)
        if h.name not in self.state.workers:
            self.joined(h, now)
        elif self.state.admits(h.version):
            self.state.ready(h.name, now, pull_s, version=h.version)

    def noticed(self, h: WorkerHandle, now: float, deadline: float | None) -> None:
        self.state.notice(h.name, now, deadline)
        if self.successor is not None:
            self.successor.noticed(h, now, deadline)

    def retiring(self, h: WorkerHandle, now: float) -> None:
        self.state.retire(h.name, now)  # the step gives it back once it holds nothing
        if self.successor is not None:
            self.successor.retiring(h, now)

    def dying(self, h: WorkerHandle, now: float) -> None:
        """Apply the reports of `h` not handled yet: its death is about to be declared (by its stream's
        end, or by other means while reports wait), and the tokens that reached the manager before it
        are not lost (after it, it is fenced). A turn may be up to MAX_TURN_S away, and the worker may
        run max_unacked_reports reports ahead of it."""
        for _, report, _ in self._reader.drain(h):
            if report is not None:  # a failure: the stream is closed; the death is being declared anyway
                self.reports += 1
                self._on_report(h, report, now)

    def replacing(self, count: int, failed: str | None, now: float) -> None:
        self.state.replacing(count, failed)

    def died(self, h: WorkerHandle, reason: str, cause: str, now: float, counted: bool = True) -> None:
        """`counted=False`: the run driving this one (`peer`) counts the preemption."""
        state = self.state
        worker = state.workers.get(h.name)
        held, wasted = (len(worker.assigned) if worker is not None else 0), state.stats.wasted_tokens
        state.dead(h.name, reason, now, h.released, counted)
        if not h.released:  # the batch started in the step's tail says its own, as the next batch's
            event("%s %s %s: %d samples%s migrated, %d tokens lost", describe(h), h.name, cause, held,
                  "" if counted else " of the next batch", state.stats.wasted_tokens - wasted)
        if self.successor is not None:
            self.successor.died(h, reason, cause, now, counted=False)

    # ---- the loop ------------------------------------------------------------------------------------

    def _run(self) -> None:
        cpu0 = time.thread_time()
        state = self.state
        with self.table.owner:  # the step's, from its first turn to its end: released here and nowhere else
            try:
                self._take_over()
                self._owning.set()
                self._reader.run()
                while True:
                    if self._cancelled.is_set():
                        raise RuntimeError("rollout cancelled")
                    turn_cpu = time.thread_time()
                    now = time.monotonic()
                    self.table.apply_inbox(now)
                    if now >= self._next_housekeeping:
                        self._next_housekeeping = now + HOUSEKEEPING_S
                        self._housekeeping(now)
                    if self._window_ended.is_set():
                        state.end_window(now)
                    self._run_calls()
                    self._execute(state.decide(now))
                    if state.done:
                        break
                    self._drive_successor(now)
                    self._receive()
                    self._collect_answers()
                    if self.siblings is not None:
                        self.siblings.relay(state.tracked, self.table.get)
                    self._execute(state.take_commands())  # finished groups go to the trainer at once
                    self._successor_turn()
                    self._reader.turn_s = self._pacer.gap(time.thread_time() - turn_cpu)
            except BaseException as e:  # noqa: BLE001 - handed to the consumer, never swallowed
                self._out.put(e)
            finally:
                self._owning.set()  # also when taking over failed: start() returns, groups() raises
                with self._calls_lock:
                    self._closed = True
                self._run_calls()  # those that came before the close; later ones run in their callers
                self.relay_cpu_s = self._reader.pause()
                self._release_reserved()
                self.table.listen(None)
        self.loop_cpu_s = time.thread_time() - cpu0
        if self.on_done is not None and state.done and not self._cancelled.is_set():
            self.on_done()

    def _run_calls(self) -> None:
        with self._calls_lock:
            calls, self._calls = self._calls, []
        for fn, done, box in calls:
            try:
                fn()
            except BaseException as e:  # noqa: BLE001 - raised in the caller
                box.append(e)
            done.set()

    def _housekeeping(self, now: float) -> None:
        table = self.table
        for h, reason in self._liveness.check(table.alive(), now):
            table.declare_dead(h, reason, now)
        self.pulls.settle(table, now)
        self._successor_timeouts(now)
        for ref, (_, h, sent) in list(self._aborts.items()):
            if now - sent > self.cfg.call_timeout_s:
                table.declare_dead(h, f"no answer to an abort in {self.cfg.call_timeout_s}s (rollout.hybrid.call_timeout_s)",
                               now)

    def _receive(self) -> None:
        for h, report, failure in self._reader.receive(POLL_S):
            now = time.monotonic()
            if failure is not None:
                self.table.declare_dead(h, failure, now)
            else:
                self.reports += 1
                self._on_report(h, report, now)

    def _on_report(self, h: WorkerHandle, report: WorkerReport, now: float) -> None:
        state = self.state
        if h.alive:
            h.last_report = now
            h.generated = report.generated
            if report.batch_size and report.step_s > 0:
                state.observe(h.name, report.batch_size, report.batch_size / report.step_s)
        mine, theirs = self._split(report.chunks)
        state.chunks(h.name, mine, now)  # a fenced worker's are counted and dropped by the state
        if theirs is not None:
            self.successor.state.chunks(h.name, theirs, now)
        if self.siblings is not None:
            for request_id in report.chunks.request_ids:
                if track := state.tracked.get(request_id.rpartition("#")[0]):
                    self.siblings.tokens_of(track.group)

    def _progress(self, name: str) -> dict[str, int]:
        """The StepState's `progress`: the tokens each of the worker's requests had generated, as its last
        report said; for a worker declared dead, exactly from its ledger where it keeps one
        (`ledger_dir`): the report misses what it generated after, up to (max_unacked_reports + 1) x
        stream_interval per request. A live worker's ledger is never read: the decisions it feeds
        (which samples a rebalance moves) stay the same with a ledger or without."""
        h = self.table.get(name)
        if h is None:
            return {}
        if not h.alive and self.cfg.ledger_dir:
            path = ledger_path(self.cfg.ledger_dir, name)
            if path.exists():
                return read_ledger(path).generated
        return h.generated


__all__ = ["HOUSEKEEPING_S", "POLL_S", "SHARE_GRACE_S", "StepPolicies", "StepRun"]
