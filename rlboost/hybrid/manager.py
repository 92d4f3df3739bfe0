"""The rollout manager: owns every sample of a step and moves it between workers token by token.

Contract (DESIGN.md 2.3 and the invariants of section 3):
- Per sample it keeps the state (pending in the manager, running on a worker, finished), the tokens
  and log-probs received so far with the weight version of each, and how often it moved.
- Dispatch is per sample, by the JSQ policy, only to workers holding the step's weight version
  (invariant 1); a migrated sample is resubmitted as prompt + tokens so far with `max_tokens` reduced
  and its own seed, so it continues exactly (invariant 3).
- A worker is declared dead when its stream fails or ends, its Ray node leaves the cluster, it is
  silent for `heartbeat_timeout_s`, a control call to it fails, or someone calls `fence`. Its in-flight
  samples go back to pending from their last received token (invariants 2, 4), and from then on
  everything it sends is dropped (invariant 6): liveness never rests on a broken stream alone.
- Seeding window: reserved workers generate until `seed_window_s`, then hand their partial samples
  back and sleep, and `StepRun.training_may_start` is set. Without a live preemptible worker they do
  not hand off; if every preemptible worker dies later they wake and take the work back (invariant 7).
- Finished GRPO groups are handed out (`StepRun.groups()`) the moment their last sample finishes.
- Weights (invariant 5): `publish` makes a version current; reserved workers load it at once, the
  others pull it in the background, and a worker joins the dispatch only once it reports exactly that
  version with the store's checksum. Workers may join at any moment, mid-step included; one serving
  another architecture is refused. A failed pull is retried, then the worker is dropped.
- Preemption notice (`notice`): the worker gets no more work and its samples are taken back at once,
  so the kill that follows loses nothing.

The event loop runs in a thread of the driver, so the trainer can consume groups meanwhile.
"""

from __future__ import annotations

import dataclasses
import enum
import queue
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import ray

from rlboost.engine import SamplingParams
from rlboost.engine.sequence import PartialOutput, StreamChunk
from rlboost.hybrid.config import HybridConfig
from rlboost.hybrid.weights import WeightManifest
from rlboost.hybrid.worker import PullResult, WorkerReport
from rlboost.policies import Balancer, JSQDispatcher, ThroughputProfile, WorkerLoad
from rlboost.rollout.sample import Group, Sample

RESERVED, PREEMPTIBLE = "reserved", "preemptible"
POLL_S = 0.02
NODE_CHECK_S = 0.5
TURN_S = 0.02
"""Shortest time between two of the loop's turns while reports keep coming. Every turn pays a wait
on every worker's stream, O(workers), and a fetch: turning once per report made the loop's CPU grow
as workers × reports. The reports that arrive within a turn are handled together, at most 20 ms (the
loop's poll period, POLL_S) after they arrive: less than the stream_interval decode steps a report
covers (about 60 ms for 8 steps of the emulated Qwen3-8B on an H100). What the loop decides from a
report is unchanged, only when it does."""
SHARE_GRACE_S = 1.0
"""A pulling worker keeps its share of the dispatch for at least this long (see `_incoming`)."""
HOUSEKEEPING_S = 0.05
"""Period of the loop's per-worker checks: heartbeats and pings, abort and pull timeouts, finished
weight pulls. Each costs O(workers), and the loop turns up to 50 times a second, far more often
than they need: the timeouts they enforce are seconds (heartbeat_interval_s, call_timeout_s,
pull_timeout_s), and 50 ms delays a verdict, or a new worker's first dispatch, by less than one
report interval. Fence requests and notices are queues, still read on every turn."""


class State(enum.Enum):
    PENDING = "pending"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass
class WorkerHandle:
    """The manager's view of one worker."""

    name: str
    kind: str
    actor: object
    pid: int
    node_id: str
    max_running: int
    version: int = -1
    fingerprint: str = ""
    checksum: str = ""
    launched: float = 0.0
    """Monotonic time the instance was asked for: provisioning time runs from here to its first ready pull."""
    ready: float | None = None
    """When it first held the current weights."""
    pull: Call | None = None
    pull_failures: int = 0
    noticed: bool = False
    """A preemption notice came: no more work, its samples were taken back."""
    released: bool = False
    """Given back by us (beyond the instance cap): its end is not a preemption."""
    stream: object | None = None
    fenced: str | None = None
    """Why the worker was declared dead; None while alive."""
    accepting: bool = True
    assigned: set[str] = field(default_factory=set)
    """Sample uids running (or queued) on it."""
    generated: dict[str, int] = field(default_factory=dict)
    last_report: float = 0.0
    """Last sign of life: a report on its stream, or an answered ping."""
    ping: Call | None = None
    """A liveness probe in flight (sent when the stream has been quiet for a heartbeat interval)."""
    last_finish: float | None = None
    profile: ThroughputProfile = field(default_factory=ThroughputProfile)

    @property
    def alive(self) -> bool:
        return self.fenced is None


@dataclass
class Call:
    """A control call in flight: a weight pull (of `version`) or a liveness ping."""

    ref: object
    sent: float
    version: int = -1


@dataclass
class Tracked:
    sample: Sample
    group: Group
    state: State = State.PENDING
    worker: str | None = None
    attempt: int = 0
    base: int = 0
    """Response tokens the sample already had when this attempt was dispatched."""
    migrations: int = 0

    @property
    def request_id(self) -> str:
        return f"{self.sample.uid}#{self.attempt}"


@dataclass
class PendingAbort:
    """An abort sent to a worker whose answer (the partial outputs) has not arrived yet."""

    worker: WorkerHandle
    requests: dict[str, str]
    """Request id -> sample uid."""
    reason: str
    target: WorkerHandle | None
    """Where the taken-back samples go (rebalancing); None: back to the dispatcher."""
    sent: float


@dataclass
class StepStats:
    """What happened during one step's rollout (logged as spot/*, migration/*, timing_s/seed)."""

    preemptions: int = 0
    deaths: list[tuple[float, str, str]] = field(default_factory=list)
    """(seconds into the step, worker, reason) of every worker declared dead."""
    migrated: Counter = field(default_factory=Counter)
    """Samples moved, by reason: preempted, rebalanced, seed_handoff, noticed."""
    wasted_tokens: int = 0
    in_flight_at_preemption: int = 0
    fenced_tokens_dropped: int = 0
    stale_chunks: int = 0
    seed_s: float = 0.0
    """How long the reserved workers generated: the window, or the whole rollout if it ended first."""
    rollout_s: float = 0.0
    """From the start of the step to its last finished sample."""
    remote_start_s: float | None = None
    """From the start of the step to the first work a preemptible worker got; None: none got any."""
    received: Counter = field(default_factory=Counter)
    """Tokens the manager accepted per request id (sample uid # attempt)."""
    tokens_by_kind: Counter = field(default_factory=Counter)
    tokens_by_worker: Counter = field(default_factory=Counter)
    tail_s: float = 0.0
    """From the first to the last live worker that generated in the step running out of samples."""
    overruns_moved: int = 0
    """Executing samples moved first because they ran far past their prompt's history (HistoPipe)."""
    pulls: list[tuple[str, float, int]] = field(default_factory=list)
    """(worker, seconds, bytes) of every verified weight pull."""
    provision_s: list[float] = field(default_factory=list)
    """Launch to first verified weights, of every instance that became ready."""
    pull_failures: int = 0
    refused: list[tuple[str, str]] = field(default_factory=list)
    """(worker, why) of workers turned away: wrong model or a version that fails its checksum."""


class RolloutManager:
    def __init__(self, cfg: HybridConfig):
        self.cfg = cfg
        self.workers: dict[str, WorkerHandle] = {}
        self.dispatcher = JSQDispatcher(cfg.max_pending)
        self.balancer = Balancer()
        self._fence_requests: queue.SimpleQueue[tuple[str, str]] = queue.SimpleQueue()
        self._notices: queue.SimpleQueue[str] = queue.SimpleQueue()
        self._lock = threading.Lock()  # guards `workers` against add_worker from another thread
        self.between_steps = StepStats()
        """What happened between steps (a failed pull, a join); counted in the next step."""
        self.manifest: WeightManifest | None = None
        """The version workers must serve."""
        self.pull_timeout_s = 120.0
        self.pull_retries = 2
        self.longest_pull_s = 0.0
        """The longest verified weight pull so far: how long a pulling worker may keep its share."""
        self.changes = 0
        """Bumped (under the lock: other threads bump it too) whenever a worker joins, dies, starts or
        stops accepting work, or gets a new weight version: whenever the set of workers a step may
        use, or their streams, may have changed."""

    def _changed(self) -> None:
        with self._lock:
            self.changes += 1

    # ---- membership --------------------------------------------------------------------------------

    def add_worker(self, handle: WorkerHandle) -> bool:
        """Admit a started worker (from any thread, mid-step too). It pulls the current weights and
        becomes eligible once they verify. One serving another architecture is refused (False)."""
        why = self._refusal(handle)
        if why:
            self.between_steps.refused.append((handle.name, why))
            ray.kill(handle.actor, no_restart=True)
            return False
        handle.stream = handle.actor.stream.options(num_returns="streaming").remote()
        handle.last_report = time.monotonic()
        handle.profile = ThroughputProfile(tolerance=self.cfg.plateau_tolerance)
        if self.manifest is not None and handle.version != self.manifest.version:
            self._start_pull(handle)
        with self._lock:
            self.workers[handle.name] = handle
            self.changes += 1
        return True

    def _refusal(self, h: WorkerHandle) -> str:
        m = self.manifest
        if m is None:
            return ""
        if h.fingerprint != m.fingerprint:
            return f"serves model {h.fingerprint}, the run's is {m.fingerprint}"
        if h.version == m.version and h.checksum != m.checksum:
            return f"claims version {h.version} with checksum {h.checksum or '-'}, the store's is {m.checksum}"
        return ""

    def notice(self, name: str, seconds: float) -> None:
        """A preemption notice (from any thread): the instance goes away in about `seconds`. It gets
        no more work from now on and its samples are taken back before the kill."""
        h = self.workers.get(name)
        if h is not None and h.alive:
            h.accepting, h.noticed = False, True
            self._changed()
            self._notices.put(name)

    def fence(self, name: str, reason: str, released: bool = False) -> None:
        """Declare a worker dead from any thread; takes effect in the loop. `released`: we gave the
        instance back ourselves, so it does not count as a preemption."""
        h = self.workers.get(name)
        if h is not None and released:
            h.released = True
        self._fence_requests.put((name, reason))

    def alive(self, kind: str | None = None) -> list[WorkerHandle]:
        with self._lock:
            return [h for h in self.workers.values() if h.alive and kind in (None, h.kind)]

    def publish(self, manifest: WeightManifest) -> None:
        """Make `manifest` the version to serve. Reserved workers load it before this returns (the next
        step starts with them); the others pull in the background. Never waits on a preemptible one."""
        self.manifest = manifest
        for h in self.alive():
            self._start_pull(h)
        reserved = self.alive(RESERVED)
        deadline = time.monotonic() + self.pull_timeout_s
        while any(h.alive and h.version != manifest.version for h in reserved) and time.monotonic() < deadline:
            refs = [h.pull.ref for h in reserved if h.alive and h.pull is not None]
            if refs:
                ray.wait(refs, num_returns=len(refs), timeout=max(0.0, deadline - time.monotonic()))
            self.poll_pulls(self.between_steps, 0.0)

    def poll_pulls(self, stats: StepStats, t: float, dead=None) -> None:
        """Collect finished pulls, retry failed ones, drop workers that keep failing or hang, and start
        a pull for every live worker not at the current version. `dead(handle, reason)` declares a
        worker dead (a step passes its own, which also requeues the worker's samples)."""
        if self.manifest is None:
            return
        dead = dead or (lambda h, reason: self._declare_dead(h, reason, stats, t))
        now = time.monotonic()
        calls = {h.pull.ref: h for h in self.alive() if h.pull is not None}
        done = ray.wait(list(calls), num_returns=len(calls), timeout=0)[0] if calls else []
        for ref in done:
            h = calls[ref]
            h.pull = None
            try:
                result: PullResult = ray.get(ref)
            except ray.exceptions.RayActorError as e:
                dead(h, f"it died during a weight pull: {first_line(e)}")
                continue
            except ray.exceptions.RayError as e:
                stats.pull_failures += 1
                h.pull_failures += 1
                if h.pull_failures > self.pull_retries:
                    dead(h, f"weight pull failed {h.pull_failures} times: {first_line(e)}")
                continue
            if result.version == self.manifest.version and result.checksum != self.manifest.checksum:
                stats.refused.append((h.name, f"version {result.version} with checksum {result.checksum}, the "
                                              f"store's is {self.manifest.checksum}"))
                dead(h, "it serves weights that fail the store's checksum")
                continue
            h.version, h.checksum, h.pull_failures = result.version, result.checksum, 0
            self.longest_pull_s = max(self.longest_pull_s, result.seconds)
            self._changed()
            stats.pulls.append((h.name, result.seconds, result.nbytes))
            if h.ready is None and h.version == self.manifest.version:
                h.ready = now
                if h.kind == PREEMPTIBLE:
                    stats.provision_s.append(now - h.launched)
        for h in self.alive():
            if h.pull is not None and now - h.pull.sent > self.pull_timeout_s + self.cfg.call_timeout_s:
                dead(h, f"no answer to a weight pull in {now - h.pull.sent:.0f}s")
            elif h.pull is None and h.version != self.manifest.version:
                self._start_pull(h)

    def _start_pull(self, h: WorkerHandle) -> None:
        if h.pull is not None:
            return  # one pull at a time: poll_pulls starts the next once this one answered
        h.pull = Call(h.actor.pull.remote(self.manifest, self.pull_timeout_s), time.monotonic(),
                      self.manifest.version)

    def reap(self) -> list[WorkerHandle]:
        """Kill and forget workers declared dead (a fenced worker may still be running)."""
        with self._lock:
            dead = [h for h in self.workers.values() if not h.alive]
            for h in dead:
                del self.workers[h.name]
        for h in dead:
            ray.kill(h.actor, no_restart=True)
        return dead

    def shutdown(self) -> None:
        for h in list(self.workers.values()):
            ray.kill(h.actor, no_restart=True)
        self.workers.clear()

    # ---- a step ------------------------------------------------------------------------------------

    def start_step(self, groups: list[Group], params: SamplingParams, version: int,
                   seed_window_s: float | None, order: list[str] | None = None,
                   overruns: Callable[[dict[str, int]], list[str]] | None = None,
                   history: Callable[[list[int]], list[list[int]]] | None = None) -> StepRun:
        """Generate every sample of `groups` at weight `version`. `seed_window_s=None` uses every
        worker until the end (evaluation); a number runs the seeding window. `order`: the sample uids
        in the order to dispatch them (HistoPipe); `overruns`: given uid -> tokens so far, the samples
        running far past their history, moved first when the balancer moves executing samples;
        `history`: a prompt's responses in its latest rollout, sent to the workers it goes to (HistoSpec)."""
        run = StepRun(self, groups, params, version, seed_window_s, order, overruns, history)
        run.thread.start()
        return run

    # ---- used by StepRun's loop ----------------------------------------------------------------------

    def _declare_dead(self, h: WorkerHandle, reason: str, stats: StepStats, t: float,
                      tracked: dict[str, Tracked] | None = None, pending: deque | None = None) -> None:
        if not h.alive:
            return
        h.fenced, h.accepting = reason, False
        self._changed()
        stats.deaths.append((t, h.name, reason))
        if h.kind == PREEMPTIBLE and not h.released:
            stats.preemptions += 1
            stats.in_flight_at_preemption += len(h.assigned)
        for uid in sorted(h.assigned):
            track = tracked[uid]
            received = len(track.sample.response_ids) - track.base
            stats.wasted_tokens += max(0, h.generated.get(track.request_id, 0) - received)
            requeue(track, pending)
            stats.migrated["preempted"] += 1
        h.assigned.clear()


class StepRun:
    """One step's rollout, driven by a thread; `groups()` yields finished groups to the trainer."""

    def __init__(self, manager: RolloutManager, groups: list[Group], params: SamplingParams, version: int,
                 seed_window_s: float | None, order: list[str] | None = None,
                 overruns: Callable[[dict[str, int]], list[str]] | None = None,
                 history: Callable[[list[int]], list[list[int]]] | None = None):
        self.m, self.cfg = manager, manager.cfg
        self.history = history
        self._history_sent: set[tuple[str, int]] = set()  # (worker, group index)
        self.params, self.version = params, version
        self.tracked = {s.uid: Tracked(s, g) for g in groups for s in g.samples}
        self.remaining = {g.index: len(g.samples) for g in groups}
        if order is not None and sorted(order) != sorted(self.tracked):
            raise ValueError("a dispatch order must name every sample of the step exactly once")
        self.pending: deque[str] = deque(self.tracked if order is None else order)
        self.overruns = overruns
        self.num_finished = 0
        self.stats, manager.between_steps = manager.between_steps, StepStats()
        self.t0 = time.monotonic()
        self.seeding = seed_window_s is not None
        self.deadline = self.t0 + (seed_window_s or 0.0)
        self.training_may_start = threading.Event()
        self.trainer_wait_s = 0.0
        self.loop_cpu_s = 0.0
        """CPU seconds the loop thread used for the step: the manager's own overhead."""
        self._out: queue.SimpleQueue = queue.SimpleQueue()
        self._submits: dict[object, WorkerHandle] = {}
        self._aborts: dict[object, PendingAbort] = {}
        self._handoffs: set[object] = set()
        self._last_node_check = 0.0
        self._next_housekeeping = 0.0
        self._last_turn = 0.0
        self._changes = 0
        """Bumped by the loop whenever a worker's samples or plateau change: with the manager's
        `changes`, everything the dispatcher's and the balancer's inputs derive from."""
        self._eligible_cache: tuple[int, list[WorkerHandle]] | None = None
        self._streams_cache: tuple[int, dict[object, WorkerHandle]] | None = None
        self._dispatch_idle_at: tuple[int, int] | None = None
        """The changes at which JSQ placed nothing: until they move, every pending sample still fits nowhere."""
        self._balanced_at: tuple[int, int] | None = None
        """The changes at which the balancer found no move: until they move, it finds none."""
        self._cancelled = threading.Event()
        self.thread = threading.Thread(target=self._run, name="rollout-manager", daemon=True)
        for h in manager.alive():
            # nobody reads the streams between steps: silence is measured from the step's start
            h.last_report = max(h.last_report, self.t0)
            if h.kind == RESERVED:
                h.accepting = True  # a new step starts with everyone generating

    def groups(self) -> Iterator[Group]:
        """Finished groups in completion order, released once the reserved resources are free to
        train; re-raises whatever stopped the loop. Time spent waiting after that is the trainer's idle
        time (`trainer_wait_s`)."""
        self.training_may_start.wait()
        for _ in range(len(self.remaining)):
            t0 = time.monotonic()
            item = self._out.get()
            self.trainer_wait_s += time.monotonic() - t0
            if isinstance(item, BaseException):
                raise item
            yield item
        self.thread.join()

    def cancel(self) -> None:
        """Stop the loop (the consumer gave up, e.g. on a reward-function error) and wait for it."""
        self._cancelled.set()
        self.thread.join()

    # ---- the loop ----------------------------------------------------------------------------------

    def _run(self) -> None:
        cpu0 = time.thread_time()
        try:
            while self.num_finished < len(self.tracked):
                if self._cancelled.is_set():
                    raise RuntimeError("rollout cancelled")
                now = time.monotonic()
                self._apply_fences()
                if now >= self._next_housekeeping:
                    self._next_housekeeping = now + HOUSEKEEPING_S
                    self._check_liveness(now)
                    self.m.poll_pulls(self.stats, now - self.t0, self._dead)
                self._take_back_noticed()
                if self.seeding and now >= self.deadline:
                    self._end_seeding(now)
                self._dispatch()
                self._rebalance()
                self._receive(POLL_S)
                self._collect_answers()
            now = time.monotonic()
            self.stats.rollout_s = now - self.t0
            if self.seeding:
                self.stats.seed_s = self.stats.rollout_s
            # the tail: from the first to the last worker done (HistoPipe's measure), among the workers
            # that generated to the end: the instances, or the reserved ones when none was there
            finishers = self.m.alive(PREEMPTIBLE) or self.m.alive(RESERVED)
            done = [h.last_finish for h in finishers
                    if h.last_finish is not None and self.stats.tokens_by_worker[h.name] > 0]
            self.stats.tail_s = max(done) - min(done) if done else 0.0
        except BaseException as e:  # noqa: BLE001 - handed to the consumer, never swallowed
            self._out.put(e)
        finally:
            self.loop_cpu_s = time.thread_time() - cpu0
            self.training_may_start.set()

    def _changes_seen(self) -> tuple[int, int]:
        return self._changes, self.m.changes

    def _apply_fences(self) -> None:
        while not self.m._fence_requests.empty():
            name, reason = self.m._fence_requests.get()
            if name in self.m.workers:
                self._dead(self.m.workers[name], reason)

    def _check_liveness(self, now: float) -> None:
        workers = self.m.alive()
        pings = [h.ping.ref for h in workers if h.ping is not None]
        answered = set(ray.wait(pings, num_returns=len(pings), timeout=0)[0]) if pings else set()
        for h in workers:
            # A quiet stream may just be a long engine step (a big prefill on one CPU thread): a ping,
            # answered by another thread of the worker, tells that from a frozen or dead process.
            if h.ping is not None and h.ping.ref in answered:
                try:
                    ray.get(h.ping.ref)
                    h.last_report = max(h.last_report, h.ping.sent)
                except ray.exceptions.RayError as e:
                    self._dead(h, f"it died: {first_line(e)}")
                    continue
                h.ping = None
            if now - h.last_report > self.cfg.heartbeat_timeout_s:
                self._dead(h, f"no sign of life for {now - h.last_report:.1f}s (rollout.hybrid.heartbeat_timeout_s)")
            elif h.ping is None and now - h.last_report > self.cfg.heartbeat_interval_s:
                h.ping = Call(h.actor.ping.remote(), now)
        if now - self._last_node_check >= NODE_CHECK_S:
            self._last_node_check = now
            live_nodes = {n["NodeID"] for n in ray.nodes() if n["Alive"]}
            for h in self.m.alive():
                if h.node_id and h.node_id not in live_nodes:
                    self._dead(h, f"its Ray node {h.node_id[:12]} left the cluster")
        for ref, pa in list(self._aborts.items()):
            if now - pa.sent > self.cfg.call_timeout_s:
                self._dead(pa.worker, f"no answer to an abort in {self.cfg.call_timeout_s}s "
                                      "(rollout.hybrid.call_timeout_s)")

    def _take_back_noticed(self) -> None:
        while not self.m._notices.empty():
            h = self.m.workers.get(self.m._notices.get())
            if h is not None and h.alive and h.assigned:
                self._take_back(h, sorted(h.assigned), "noticed")

    def _collect_answers(self) -> None:
        """Results of control calls: a failed submit or abort means a dead worker; an abort's
        partial outputs put its samples back to pending (or straight onto a rebalancing target)."""
        calls = list(self._submits) + list(self._aborts)
        done = ray.wait(calls, num_returns=len(calls), timeout=0)[0] if calls else []
        self._collect_submits([ref for ref in done if ref in self._submits])  # they come first in `done` too
        for ref in done:
            if ref not in self._aborts:
                continue  # a submission, or an abort dropped with its worker's death just now
            try:
                self._aborted(ref, ray.get(ref))
            except ray.exceptions.RayError as e:
                self._dead(self._aborts[ref].worker, f"abort failed: {first_line(e)}")

    def _collect_submits(self, refs: list) -> None:
        """Acknowledged submissions, fetched in one call; one by one only when some failed, to tell which."""
        if not refs:
            return
        try:
            ray.get(refs)
        except Exception:  # noqa: BLE001 - sorted out, and re-raised where it must be, one by one below
            pass
        else:
            for ref in refs:
                del self._submits[ref]
            return
        for ref in refs:
            h = self._submits.pop(ref)
            try:
                ray.get(ref)
            except ray.exceptions.RayActorError as e:
                self._dead(h, f"it died: {first_line(e)}")
            except ray.exceptions.RayTaskError as e:  # the engine refused a request: a bug, not a death
                raise RuntimeError(f"rollout worker {h.name} rejected a submission: {e}") from e

    def _end_seeding(self, now: float) -> None:
        if not any(self._eligible(h) for h in self.m.alive(PREEMPTIBLE)):
            return  # nobody to hand off to: the reserved workers keep going
        for h in self.m.alive(RESERVED):
            h.accepting = False
            self._handoffs.add(self._take_back(h, sorted(h.assigned), "seed_handoff", then_sleep=True))
        self.m._changed()
        self.seeding = False
        self.stats.seed_s = now - self.t0
        self._release_trainer()

    def _release_trainer(self) -> None:
        """The reserved resources are the trainer's once every reserved worker has stopped and slept."""
        if not self.seeding and not self._handoffs:
            self.training_may_start.set()

    def _ensure_capacity(self) -> None:
        if not self.pending or self._eligible_workers():
            return
        reserved = [h for h in self.m.alive(RESERVED) if h.version == self.version]
        if not reserved:
            raise RuntimeError(f"no rollout worker left at weight version {self.version}: "
                               + "; ".join(f"{name}: {why}" for _, name, why in self.stats.deaths))
        for h in reserved:  # every preemptible worker is gone: the reserved ones take the work back
            h.accepting = True
        self.m._changed()

    def _eligible(self, h: WorkerHandle) -> bool:
        return h.alive and h.accepting and h.version == self.version

    def _eligible_workers(self) -> list[WorkerHandle]:
        """The live workers that may take work now, in the manager's order. Who they are changes only
        with the manager's `changes`: the list is rebuilt then, not on every turn that needs it."""
        changes = self.m.changes  # read first: a change while the list is built rebuilds it next time
        if self._eligible_cache is None or self._eligible_cache[0] != changes:
            self._eligible_cache = (changes, [h for h in self.m.alive() if self._eligible(h)])
        return self._eligible_cache[1]

    def _loads(self, workers: list[WorkerHandle]) -> list[WorkerLoad]:
        loads = []
        for h in workers:
            running = min(len(h.assigned), h.max_running)
            loads.append(WorkerLoad(h.name, running, len(h.assigned) - running, h.max_running))
        return loads

    def _dispatch(self) -> None:
        if not self.pending:
            return
        # Pure JSQ returns nothing exactly when no worker is open, whatever samples wait: until a
        # worker's samples or eligibility change, asking again (O(pending + workers)) is wasted.
        incoming = self._incoming(time.monotonic())  # who is owed a share changes with time too
        seen = (self._changes_seen(), tuple(load.name for load in incoming))
        if seen == self._dispatch_idle_at:
            return
        self._ensure_capacity()  # its answer too rests only on eligibility and the pending queue being non-empty
        seen = (self._changes_seen(), seen[1])
        decisions = self.m.dispatcher.assign(list(self.pending), self._loads(self._eligible_workers()), incoming)
        if not decisions:
            self._dispatch_idle_at = seen
            return
        self.pending = deque(uid for uid in self.pending if uid not in decisions)
        by_worker: dict[str, list[str]] = {}
        for uid, name in decisions.items():
            by_worker.setdefault(name, []).append(uid)
        for name, uids in by_worker.items():
            self._submit(self.m.workers[name], uids)

    def _incoming(self, now: float) -> list[WorkerLoad]:
        """Preemptible workers pulling the step's weights, no notice, and not for longer than a pull
        takes (twice the longest seen, at least SHARE_GRACE_S): their share waits for them. A pull
        that hangs (a frozen or cut-off worker) gives its share back to the others."""
        if not self.cfg.share_with_pulling:
            return []
        grace = max(SHARE_GRACE_S, 2 * self.m.longest_pull_s)
        return [WorkerLoad(h.name, 0, 0, h.max_running) for h in self.m.alive(PREEMPTIBLE)
                if h.version != self.version and h.pull is not None and h.pull.version == self.version
                and not h.noticed and now - h.pull.sent <= grace]

    def _submit(self, h: WorkerHandle, uids: list[str]) -> None:
        if h.kind == PREEMPTIBLE and self.stats.remote_start_s is None:
            self.stats.remote_start_s = time.monotonic() - self.t0
        requests = []
        for uid in uids:
            track = self.tracked[uid]
            track.state, track.worker, track.attempt = State.RUNNING, h.name, track.attempt + 1
            track.base = len(track.sample.response_ids)
            params = dataclasses.replace(self.params, seed=track.sample.seed,
                                         max_tokens=self.params.max_tokens - track.base)
            requests.append((track.request_id, track.sample.prompt_ids + track.sample.response_ids, params,
                             len(track.sample.prompt_ids)))
            h.assigned.add(uid)
        h.last_finish = None
        self._changes += 1
        self._submits[h.actor.submit.remote(requests, self._histories_for(h, uids))] = h

    def _histories_for(self, h: WorkerHandle, uids: list[str]) -> list | None:
        """The drafting history of the prompts of `uids` that `h` has not been sent this step."""
        if self.history is None:
            return None
        out = []
        for uid in uids:
            group = self.tracked[uid].group
            if (h.name, group.index) not in self._history_sent:
                self._history_sent.add((h.name, group.index))
                responses = self.history(group.samples[0].prompt_ids)
                if responses:
                    out.append((group.samples[0].prompt_ids, responses))
        return out or None

    def _rebalance(self) -> None:
        if self.pending or self._aborts:
            return  # dispatch first; and decide on loads that no abort in flight is about to change
        seen = self._changes_seen()
        if seen == self._balanced_at:
            return  # the balancer is pure: the loads and plateaus that gave no move still give none
        workers = self._eligible_workers()
        loads = self._loads(workers)
        plateaus = {h.name: h.profile.plateau() for h in workers}  # it reads only those of `loads`
        balancer = self.m.balancer
        moves = balancer.rebalance(loads, plateaus) if balancer.may_move(loads, plateaus) else []
        if not moves:
            self._balanced_at = seen
        for move in moves:
            source, target = self.m.workers[move.source], self.m.workers[move.target]
            # the cheapest to move are those with the fewest tokens (least prompt to re-prefill) ...
            by_progress = sorted(source.assigned, key=lambda u: (len(self.tracked[u].sample.response_ids), u))
            if move.executing and self.overruns is not None:
                # ... except samples far past their history: they would be the step's tail where they are
                flagged = self.overruns({u: len(self.tracked[u].sample.response_ids) for u in source.assigned})
                self.stats.overruns_moved += len(flagged[:move.count])
                first = set(flagged)
                by_progress = flagged + [u for u in by_progress if u not in first]
            self._take_back(source, by_progress[:move.count], "rebalanced", target=target)

    def _take_back(self, h: WorkerHandle, uids: list[str], reason: str, then_sleep: bool = False,
                   target: WorkerHandle | None = None):
        """Ask `h` to abort `uids`; `_aborted` handles the answer. Returns the call's ref."""
        requests = {self.tracked[uid].request_id: uid for uid in uids}
        ref = h.actor.abort.remote(list(requests), then_sleep)
        self._aborts[ref] = PendingAbort(h, requests, reason, target, time.monotonic())
        return ref

    def _aborted(self, ref, partials: dict[str, PartialOutput]) -> None:
        """Samples still running on the aborted attempt continue from their exact partial output;
        those absent finished meanwhile (their last chunk is on its way)."""
        pa = self._aborts.pop(ref)
        self._handoffs.discard(ref)
        self._changes += 1  # even with nothing moved: the balancer may now ask for the same moves again
        moved = []
        for request_id, partial in partials.items():
            uid = pa.requests[request_id]
            track = self.tracked[uid]
            if not pa.worker.alive or track.state is not State.RUNNING or track.request_id != request_id:
                continue
            self._absorb_partial(track, partial, pa.worker.kind, pa.worker.name)
            pa.worker.assigned.discard(uid)
            requeue(track, self.pending)
            self.stats.migrated[pa.reason] += 1
            moved.append(uid)
        if moved and pa.target is not None and self._eligible(pa.target):
            for uid in moved:
                self.pending.remove(uid)
            self._submit(pa.target, moved)
        self._release_trainer()

    def _absorb_partial(self, track: Tracked, partial: PartialOutput, kind: str, worker: str) -> None:
        sample = track.sample
        received = sample.response_ids[track.base:]
        if partial.token_ids[:len(received)] != received:
            raise RuntimeError(f"sample {sample.uid}: the aborted request's tokens do not extend the "
                               "tokens already streamed")
        self._check_version(sample, partial.weight_version)
        extra = len(partial.token_ids) - len(received)
        self.stats.received[partial.request_id] += extra
        self.stats.tokens_by_kind[kind] += extra
        self.stats.tokens_by_worker[worker] += extra
        sample.response_ids += partial.token_ids[len(received):]
        sample.logprobs += partial.logprobs[len(received):]
        sample.versions += [partial.weight_version] * extra

    def _streams(self) -> dict[object, WorkerHandle]:
        """Every open stream (a fenced worker's too: what it sends is counted, then dropped) and its worker."""
        changes = self.m.changes
        if self._streams_cache is None or self._streams_cache[0] != changes:
            self._streams_cache = (changes, {h.stream: h for h in list(self.m.workers.values())
                                             if h.stream is not None})
        return self._streams_cache[1]

    def _receive(self, timeout: float) -> None:
        streams = self._streams()
        if not streams:
            time.sleep(timeout)
            return
        waitable = list(streams)
        time.sleep(max(0.0, self._last_turn + TURN_S - time.monotonic()))
        self._last_turn = time.monotonic()
        # Whatever is there already, in one call; block (until the first report) only when nothing is.
        ready, _ = ray.wait(waitable, num_returns=len(waitable), timeout=0)
        if not ready:
            ready, _ = ray.wait(waitable, num_returns=1, timeout=timeout)
        # Drain what is ready, as the reports came, in rounds of one report per stream: a round costs
        # one wait and one fetch for all of them. Nothing may stay behind: a death declared by other
        # means (a failed call, a silent worker) drops whatever of its stream is still unread.
        handles = [streams[gen] for gen in ready]
        while handles:
            self._take_one_report_each(handles)
            handles = [h for h in handles if h.stream is not None]
            ready = ray.wait([h.stream for h in handles], num_returns=len(handles), timeout=0)[0] if handles else []
            handles = [streams[gen] for gen in ready]

    def _take_one_report_each(self, handles: list[WorkerHandle]) -> None:
        """The next report of each of `handles`, whose streams have one ready, fetched in one call."""
        taken = []
        for h in handles:
            try:
                taken.append((h, next(h.stream)))
            except StopIteration:
                self._stream_failed(h, "its stream ended")
            except ray.exceptions.RayError as e:
                self._stream_failed(h, f"it died: {first_line(e)}")
        if not taken:
            return
        try:
            reports = ray.get([ref for _, ref in taken])
        except ray.exceptions.RayError:
            reports = None  # a stream carries its worker's death: fetch one by one to tell whose
        for i, (h, ref) in enumerate(taken):
            if reports is not None:
                self._on_report(h, reports[i])
                continue
            try:
                report = ray.get(ref)
            except ray.exceptions.RayError as e:
                self._stream_failed(h, f"it died: {first_line(e)}")
            else:
                self._on_report(h, report)

    def _stream_failed(self, h: WorkerHandle, reason: str) -> None:
        h.stream = None
        self._streams_cache = None  # a worker already fenced ends its stream without a change to see
        self._dead(h, reason)

    def _on_report(self, h: WorkerHandle, report: WorkerReport) -> None:
        if not h.alive:  # fenced: whatever it says now is dropped
            self.stats.fenced_tokens_dropped += sum(len(c.token_ids) for c in report.chunks)
            return
        h.last_report = time.monotonic()
        h.generated = report.generated
        if report.batch_size and report.step_s > 0:
            plateau = h.profile.plateau()
            h.profile.observe(report.batch_size, report.batch_size / report.step_s)
            if h.profile.plateau() != plateau:
                self._changes += 1
        for chunk in report.chunks:
            self._on_chunk(h, chunk)

    def _on_chunk(self, h: WorkerHandle, chunk: StreamChunk) -> None:
        uid, _, attempt = chunk.request_id.rpartition("#")
        track = self.tracked.get(uid)
        if (track is None or track.state is not State.RUNNING or track.worker != h.name
                or str(track.attempt) != attempt):
            self.stats.stale_chunks += 1  # from an attempt already taken back; its tokens came with the abort
            return
        sample, stats, tokens = track.sample, self.stats, chunk.token_ids
        self._check_version(sample, chunk.weight_version)
        if track.base + chunk.offset != len(sample.response_ids):
            raise RuntimeError(f"sample {uid}: chunk at response offset {track.base + chunk.offset} but "
                               f"{len(sample.response_ids)} tokens received (a gap or a duplicate)")
        n = len(tokens)
        stats.received[chunk.request_id] += n
        sample.response_ids += tokens
        sample.logprobs += chunk.logprobs
        sample.versions += [chunk.weight_version] * n
        stats.tokens_by_kind[h.kind] += n
        stats.tokens_by_worker[h.name] += n
        if chunk.finished:
            sample.finish_reason = chunk.finish_reason
            track.state, track.worker = State.FINISHED, None
            h.assigned.discard(uid)
            self._changes += 1
            if not h.assigned:
                h.last_finish = time.monotonic()
            self.num_finished += 1
            self.remaining[track.group.index] -= 1
            if self.remaining[track.group.index] == 0:
                self._out.put(track.group)

    def _check_version(self, sample: Sample, version: int) -> None:
        if version != self.version:
            raise RuntimeError(f"sample {sample.uid}: tokens of weight version {version} in a step at "
                               f"version {self.version}")

    def _dead(self, h: WorkerHandle, reason: str) -> None:
        self.m._declare_dead(h, reason, self.stats, time.monotonic() - self.t0, self.tracked, self.pending)
        for ref in [ref for ref, pa in self._aborts.items() if pa.worker is h]:
            del self._aborts[ref]  # its samples are back to pending already; its answer no longer matters
            self._handoffs.discard(ref)
        self._release_trainer()


def requeue(track: Tracked, pending: deque) -> None:
    """Back to the manager, first in line: it already holds tokens and a group waits on it."""
    track.state, track.worker = State.PENDING, None
    track.migrations += 1
    pending.appendleft(track.sample.uid)


def first_line(e: BaseException) -> str:
    cause = getattr(e, "cause", None)  # a RayTaskError's first line is Ray's banner; the cause says what went wrong
    if isinstance(cause, BaseException):
        e = cause
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}"
