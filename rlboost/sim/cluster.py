"""The event-driven cluster of a simulated RL run (DESIGN.md 2.9): reserved rollout engines, the
trainer, preemptible instances from a trace, and the rollout manager's decisions.

Contract: `ClusterRun(...).run()` plays whole training steps, one after the other, until a step
would start at or after `duration_s`, and returns one `StepRecord` per step. Every decision is
taken by the project's real policy objects, never by a copy: `JSQDispatcher` (dispatch, cap Θ),
`Balancer` with one `ThroughputProfile` per engine (its plateau B), `OffloadController` (T_seed,
memory M[n], the instance cap), `HistoPipe` (dispatch order), `TraceReplay` (which instances start,
get warned, killed, released) and `CostMeter` (dollars). Time is continuous and jumps from event to
event; every engine's decode is `EngineState` (rlboost.sim.profile), the same code as the calibrated
`engine_rollout`, so nothing is simulated token by token. Pure: no clock, no Ray, no torch; the only
randomness is the trace replay's seeded choice of victims.

Two layouts share the loop:
- `colocated=True` (RLBoost): the reserved GPUs run rollout engines for the seeding window, hand
  their partial samples to the instances, then train on finished groups as they stream in.
- `colocated=False` (Disagg, StreamRL-style): some reserved GPUs only generate, the others only
  train, both for the whole step; no instances.
The modelling assumptions are listed in docs/simulator.md, "Simulation model".
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Callable
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from rlboost.policies.balance import Balancer
from rlboost.policies.dispatch import JSQDispatcher, WorkerLoad
from rlboost.policies.histopipe import HistoPipe, HistoPipeConfig, SampleInfo
from rlboost.policies.offload import OffloadController, StepTimings
from rlboost.policies.profile import ThroughputProfile
from rlboost.sim.profile import EngineProfile, EngineState, TrainProfile
from rlboost.sim.workload import Workload
from rlboost.spot.cost import CostMeter
from rlboost.spot.trace import SpotTrace, TraceReplay

if TYPE_CHECKING:
    from rlboost.sim.simulator import SimConfig

# Event kinds; at equal times events run in the order they were scheduled.
_ENGINE, _BOOTED, _PULLED, _TRACE, _WINDOW, _TRAINED, _START = range(7)


@dataclass
class StepRecord:
    """One training step of a simulated run. Steps tile the run: a step lasts from its start (the
    reserved engines hold its weights) to the next step's start (its own weights are on them)."""

    step: int
    """Step index (the workload's step)."""
    start_s: float
    """When the step's rollout started."""
    end_s: float
    """When the next step could start: training done and the new weights on the reserved engines."""
    rollout_s: float
    """From the start to the step's last finished sample."""
    train_s: float
    """Trainer compute time (waits excluded)."""
    seed_s: float
    """T_seed of the step: the seeding window the controller chose (0 for the baselines)."""
    reserved_rollout_s: float
    """How long the reserved engines generated: the window, or the whole rollout without a hand-off."""
    tokens_generated: int
    """Decode tokens made on every engine during the step: responses + wasted + recomputed."""
    tokens_trained: int
    """Response tokens of the step's samples, each counted once (what throughput counts)."""
    instances_start: int
    """Instances launched and not ended when the step started (booting ones included)."""
    instances_end: int
    """The same when the step's training ended."""
    preemptions: int
    """Instances hard-killed by the trace during the step."""
    migrations: int
    """Samples moved to another engine: preempted, seed hand-off, rebalanced, noticed, released."""
    wasted_tokens: int
    """Tokens generated on killed instances and never streamed back (<= stream_interval per sample)."""
    recomputed_tokens: int
    """Tokens thrown away by migration=recompute (streamed, then discarded at a preemption)."""
    wait_train_s: float
    """Trainer idle time waiting for groups after it was given the reserved GPUs."""
    wait_remote_s: float
    """t_wait_remote: from the step's last response to the end of its training (0 without instances)."""
    usd: float
    """What the step cost: reserved nodes for end_s - start_s, instances for their seconds in it."""
    cap: int | None = None
    """The instance cap the controller set after the step (None: no cap)."""
    instance_s: float = 0.0
    """Instance-seconds billed in the step."""
    migrated: dict[str, int] = field(default_factory=dict)
    """Migrations by reason: preempted, seed_handoff, rebalanced, noticed, released (as the runtime's
    migration/* metrics)."""
    in_flight_at_preemption: int = 0
    """Samples held by instances when they were hard-killed (the bound on waste is per such sample)."""
    remote_s: float = 0.0
    """t_remote: from the first work an instance got in the step to its last response (0 when no
    instance got any)."""


class _Sample:
    __slots__ = ("group", "length", "made", "made_at_submit", "engine", "done")

    def __init__(self, group: int, length: int):
        self.group, self.length = group, length
        self.made = 0  # tokens the manager holds
        self.made_at_submit = 0
        self.engine: str | None = None
        self.done = False


class _Engine:
    """One rollout engine = one worker of the dispatcher and the balancer."""

    __slots__ = ("name", "instance", "state", "profile", "assigned", "last_finish", "gen", "accepting",
                 "_plateau", "_dirty")

    def __init__(self, name: str, instance: str | None, state: EngineState, profile: ThroughputProfile):
        self.name, self.instance, self.state, self.profile = name, instance, state, profile
        self.assigned: set[int] = set()
        self.last_finish: float | None = None
        self.gen = 0  # bumped on every reschedule; older heap entries are stale
        self.accepting = False  # reserved engines only: in the dispatch right now
        self._plateau: int | None = None
        self._dirty = False

    def plateau(self) -> int | None:
        if self._dirty:
            self._plateau, self._dirty = self.profile.plateau(), False
        return self._plateau


class _Instance:
    __slots__ = ("name", "engines", "booted", "version", "doomed")

    def __init__(self, name: str):
        self.name = name
        self.engines: list[_Engine] = []
        self.booted = False
        self.version: int | None = None  # the weights it serves; None while booting or pulling
        self.doomed = False


class ClusterRun:
    """One simulated run of the hybrid (colocated=True) or disaggregated (colocated=False) layout."""

    def __init__(self, cfg: SimConfig, *, engine: EngineProfile, train: TrainProfile, workload: Workload,
                 rollout_gpus: int, train_gpus: int, colocated: bool, trace: SpotTrace | None,
                 controller: OffloadController | None, seed_s: float, meter: CostMeter,
                 max_steps: int | None = None):
        self.cfg = cfg
        self.profile, self.train, self.work = engine, train, workload
        self.prompt_len = workload.cfg.prompt_len
        self.colocated = colocated
        self.train_gpus = train_gpus
        self.controller = controller
        self.fixed_seed_s = seed_s
        self.meter = meter
        self.max_steps = max_steps
        self.max_running = engine.cfg.max_num_seqs
        self.dispatcher = JSQDispatcher(cfg.max_pending)
        self.balancer = Balancer()
        self.histopipe = HistoPipe(HistoPipeConfig(enabled=cfg.histopipe))
        self.pull_s = train.weight_sync_s(engine.cfg.spot_gbps)
        self.sync_s = train.weight_sync_s(engine.cfg.reserved_gbps)
        self.engines_per_instance = cfg.gpus_per_instance // engine.tp
        # An instance too small for one engine of the model cannot serve it: none is rented.
        self.replay = (TraceReplay(trace, cfg.seed, cfg.notice_s, cfg.trace.max_instances)
                       if trace is not None and self.engines_per_instance > 0 else None)

        self.now = 0.0
        self._heap: list[tuple[float, int, int, object, object]] = []
        self._seq = 0
        self.engines: dict[str, _Engine] = {}
        self.reserved: list[_Engine] = []
        for j in range(rollout_gpus // engine.tp):
            e = self._new_engine(f"r{j}", None)
            self.reserved.append(e)
        self.instances: dict[str, _Instance] = {}
        self._launched = 0
        self.published = 0  # the newest weight version; step k runs version k
        self.cap: int | None = None

        # run totals
        self.tokens_generated = 0
        self.timeline: list[tuple[float, int]] = [(0.0, 0)]
        self.caps: list[tuple[float, int | None]] = []
        self.records: list[StepRecord] = []
        self.total_preemptions = 0
        self._live = 0
        self._inst_s = 0.0
        self._inst_t = 0.0
        self.done = False

        # the current step (set by _start)
        self.k = -1
        self.active = False  # the step's rollout is under way
        self.seeding = False
        self.samples: list[_Sample] = []
        self.pending: deque[int] = deque()
        self.st_preemptions = self.st_wasted = self.st_recomputed = self.st_in_flight = 0
        self.st_migrated: Counter[str] = Counter()

        if self.replay is not None:
            # The replay looks ahead `notice_s` from each call, so it is asked at every change of the
            # trace and notice_s before it.
            times = set()
            for t in trace.times_s:
                for when in (t, t - cfg.notice_s):
                    if when > 0:
                        times.add(when)
            for t in sorted(times):
                self._push(t, _TRACE, None, None)
        self._push(0.0, _START, 0, None)

    # ---- the loop ----------------------------------------------------------------------------------

    def run(self) -> list[StepRecord]:
        heap = self._heap
        while not self.done:
            if not heap:
                raise RuntimeError(f"simulation stalled at t={self.now:.3f}s in step {self.k}: no event left")
            self.now = t = heap[0][0]
            # Everything that happens at this instant first, then the manager's decisions: e.g. all
            # instances whose pulls complete together join before the seeding hand-off is dealt out.
            while heap and heap[0][0] == t and not self.done:
                _, _, kind, a, b = heapq.heappop(heap)
                self._handle(kind, a, b)
            if not self.done:
                self._settle()
        return self.records

    def _push(self, t: float, kind: int, a: object, b: object) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (t, self._seq, kind, a, b))

    def _handle(self, kind: int, a, b) -> None:
        if kind == _ENGINE:
            e = self.engines.get(a)
            if e is not None and e.gen == b:
                self._finish(e, e.state.advance_to(self.now))
                self._reschedule(e)
        elif kind == _TRACE:
            self._replay_step()
        elif kind == _BOOTED:
            inst = self.instances.get(a)
            if inst is not None:
                inst.booted = True
                self._push(self.now + self.pull_s, _PULLED, a, self.published)
        elif kind == _PULLED:
            self._pulled(a, b)
        elif kind == _WINDOW:
            pass  # _settle hands off if the window of the current step is over
        elif kind == _TRAINED:
            self._trained(a)
        elif kind == _START:
            self._start(a)

    # ---- engines -----------------------------------------------------------------------------------

    def _new_engine(self, name: str, instance: str | None) -> _Engine:
        profile = ThroughputProfile()
        state = EngineState(self.profile, self.prompt_len, start_s=self.now)
        e = _Engine(name, instance, state, profile)
        state.on_decode = self._decode_observer(e)
        self.engines[name] = e
        return e

    def _decode_observer(self, e: _Engine) -> Callable[[int, int, float], None]:
        observe = e.profile.observe

        def on_decode(batch: int, steps: int, seconds: float) -> None:
            self.tokens_generated += batch * steps
            observe(batch, batch * steps / seconds)
            e._dirty = True

        return on_decode

    def _reschedule(self, e: _Engine) -> None:
        e.gen += 1
        t = e.state.next_event_s()
        if t < math.inf:
            self._push(t, _ENGINE, e.name, e.gen)

    def _sync(self, e: _Engine) -> None:
        """Bring an engine to now (completions due exactly now are handled)."""
        self._finish(e, e.state.advance_to(self.now))

    def _eligible(self) -> list[_Engine]:
        """The engines that may take work now: accepting reserved ones, and engines of instances
        that serve the step's weights and have no notice."""
        if not self.active:
            return []
        k = self.k
        out = [e for e in self.reserved if e.accepting]
        for inst in self.instances.values():
            if inst.version == k and not inst.doomed:
                out.extend(inst.engines)
        return out

    def _incoming(self) -> list[WorkerLoad]:
        """Engines seconds from serving the step: of booted instances pulling its weights, no notice."""
        if not self.cfg.share_with_pulling:
            return []
        m = self.max_running
        return [WorkerLoad(f"{inst.name}/e{j}", 0, 0, m) for inst in self.instances.values()
                if inst.booted and inst.version is None and not inst.doomed and self.published == self.k
                for j in range(self.engines_per_instance)]

    def _loads(self, engines: list[_Engine]) -> list[WorkerLoad]:
        m = self.max_running
        return [WorkerLoad(e.name, min(len(e.assigned), m), max(len(e.assigned) - m, 0), m) for e in engines]

    # ---- samples -----------------------------------------------------------------------------------

    def _submit(self, e: _Engine, idxs: list[int]) -> None:
        self._sync(e)
        items = []
        for i in idxs:
            s = self.samples[i]
            s.engine, s.made_at_submit = e.name, s.made
            e.assigned.add(i)
            items.append((i, s.length, s.made))
        e.last_finish = None
        if e.instance is not None and self.remote_start is None:
            self.remote_start = self.now
        e.state.submit(items, self.now)
        self._reschedule(e)

    def _take_back(self, e: _Engine, idxs: list[int], reason: str, target: _Engine | None = None) -> None:
        """Abort samples on a live engine: their exact partial output comes back (a seed hand-off, a
        rebalance, a notice, a release). They go to `target`, or to the front of the pending queue."""
        self._sync(e)
        idxs = [i for i in idxs if i in e.assigned]
        if not idxs:
            return
        made = e.state.abort(idxs, self.now)
        for i in idxs:
            s = self.samples[i]
            s.made, s.engine = made[i], None
            e.assigned.discard(i)
        self.st_migrated[reason] += len(idxs)
        self._reschedule(e)
        if target is not None:
            self._submit(target, idxs)
        else:
            for i in idxs:
                self.pending.appendleft(i)

    def _finish(self, e: _Engine, keys: list) -> None:
        for i in keys:
            s = self.samples[i]
            if s.done or s.engine != e.name:
                raise RuntimeError(f"step {self.k}: sample {i} finished twice or on an engine not holding it")
            s.done, s.made, s.engine = True, s.length, None
            e.assigned.discard(i)
            if not e.assigned:
                e.last_finish = self.now
            self.groups_left[s.group] -= 1
            if self.groups_left[s.group] == 0:
                self.ready.append(s.group)
            self.finished += 1
        if keys and self.finished == len(self.samples):
            self._rollout_done()

    # ---- the step ----------------------------------------------------------------------------------

    def _start(self, k: int) -> None:
        if k > 0:
            self._close_step()
            if self.now >= self.cfg.duration_s or (self.max_steps is not None and k >= self.max_steps):
                self._finish_run()
                return
        self.k = k
        self.step_start = self.now
        self.step_tokens0 = self.tokens_generated
        self.step_inst_s0 = self._instance_seconds()
        self.st_preemptions = self.st_wasted = self.st_recomputed = self.st_in_flight = 0
        self.st_migrated: Counter[str] = Counter()
        self._replay_step()
        self.instances_start = len(self.instances)
        ids = self.work.prompt_ids(k)
        lengths = self.work.step(k)
        n = self.work.cfg.samples_per_prompt
        self.samples = [_Sample(g, length) for g, group in enumerate(lengths) for length in group]
        self.groups_left = [n] * len(lengths)
        self.group_lengths = lengths
        self.ready: deque[int] = deque()
        self.finished = 0
        self.trained_groups = 0
        self.training: int | None = None
        self.train_compute = 0.0
        self.wait_train = 0.0
        self.idle_since: float | None = None
        self.released = False
        self.handoff_s: float | None = None  # when the seeding window handed off (None: no hand-off)
        self.remote_start: float | None = None  # when an instance first got work (None: none did)
        self.fallback = False
        self.rollout_end: float | None = None
        self.reserved_rollout_s = 0.0
        self.last_finishes: list[float] = []
        self.active = True
        if self.controller is not None:
            self.seed_s = self.controller.seed_for(self.instances_start)
        else:
            self.seed_s = self.fixed_seed_s
        for e in self.reserved:
            e.accepting = True
        if self.colocated:
            self.seeding = True
            self.deadline = self.now + self.seed_s
            if self.seed_s > 0:
                self._push(self.deadline, _WINDOW, k, None)
        else:  # disaggregated: the trainer has GPUs of its own from the start
            self.seeding = False
            self.deadline = self.now
            self._release_trainer()
        infos = [SampleInfo(str(i), str(ids[s.group]), s.group) for i, s in enumerate(self.samples)]
        order = self.histopipe.order(k, infos)
        self.pending: deque[int] = deque(int(uid) for uid in order)

    def _settle(self) -> None:
        """The manager's loop body, run after every instant with events: hand-off, capacity, dispatch,
        balancing, and the trainer taking the next group."""
        if self.active:
            if self.seeding and self.now >= self.deadline and any(
                    inst.version == self.k and not inst.doomed for inst in self.instances.values()):
                self._handoff()
            eligible = self._eligible()
            if self.pending and not eligible and not self.seeding:
                # Every instance is gone: the reserved engines take the work back (colocated fallback).
                self.fallback = True
                for e in self.reserved:
                    e.accepting = True
                eligible = self._eligible()
            if self.pending and eligible:
                self._dispatch(eligible)
            if not self.pending and len(eligible) > 1:
                self._rebalance(eligible)
        self._train_next()

    def _dispatch(self, eligible: list[_Engine]) -> None:
        uids = [str(i) for i in self.pending]
        decisions = self.dispatcher.assign(uids, self._loads(eligible), self._incoming())
        if not decisions:
            return
        by_engine: dict[str, list[int]] = {}
        for uid, name in decisions.items():
            by_engine.setdefault(name, []).append(int(uid))
        self.pending = deque(i for i in self.pending if str(i) not in decisions)
        for name, idxs in by_engine.items():
            self._submit(self.engines[name], idxs)

    def _rebalance(self, eligible: list[_Engine]) -> None:
        # The Balancer decides; this only skips calls that cannot produce a move (a pending move
        # needs a worker with pending samples, an executing move an idle worker and a donor beyond
        # its plateau), so that it is not asked after every completion of a long step.
        m = self.max_running
        idle = over = False
        for e in eligible:
            n = len(e.assigned)
            if n > m:
                over = True
                break
            idle = idle or n == 0
        if not over:
            if not idle:
                return
            if not any(e.assigned and (p := e.plateau()) is not None and min(len(e.assigned), m) > p
                       for e in eligible):
                return
        plateaus = {e.name: e.plateau() for e in eligible}
        for move in self.balancer.rebalance(self._loads(eligible), plateaus):
            source, target = self.engines[move.source], self.engines[move.target]
            self._sync(source)
            progress = source.state.progress()
            # the cheapest to move are those with the fewest tokens (least to re-prefill), as the runtime does
            chosen = sorted(source.assigned, key=lambda i: (progress.get(i, 0), i))[:move.count]
            self._take_back(source, chosen, "rebalanced", target=target)

    def _handoff(self) -> None:
        """End of the seeding window: the reserved engines' samples continue on the instances."""
        for e in self.reserved:
            if e.assigned:
                self._take_back(e, sorted(e.assigned), "seed_handoff")
            e.accepting = False
        self.seeding = False
        self.handoff_s = self.now
        self.reserved_rollout_s = self.now - self.step_start
        self._release_trainer()

    def _rollout_done(self) -> None:
        self.rollout_end = self.now
        self.active = False
        if self.seeding:  # no hand-off happened: the reserved engines generated it all
            self.seeding = False
            self.reserved_rollout_s = self.now - self.step_start
        elif self.fallback:
            self.reserved_rollout_s = self.now - self.step_start
        for e in self.reserved:
            e.accepting = False
        self.last_finishes = [e.last_finish if e.last_finish is not None else self.now
                              for inst in self.instances.values() if inst.booted for e in inst.engines]
        if not self.released:
            self._release_trainer()

    # ---- the trainer -------------------------------------------------------------------------------

    def _release_trainer(self) -> None:
        self.released = True
        self.idle_since = self.now

    def _train_next(self) -> None:
        if not self.released or self.training is not None or not self.ready:
            return
        if self.fallback and any(e.assigned for e in self.reserved):
            return  # the reserved GPUs are generating again
        g = self.ready.popleft()
        if self.idle_since is not None:
            self.wait_train += self.now - self.idle_since
            self.idle_since = None
        sequences = [self.prompt_len + length for length in self.group_lengths[g]]
        tokens = sum(sequences)
        context = sum(s * (s - 1) / 2.0 for s in sequences) / tokens
        seconds = self.train.train_s(tokens, self.train_gpus, context)
        self.train_compute += seconds
        self.training = g
        self._push(self.now + seconds, _TRAINED, g, None)

    def _trained(self, g: int) -> None:
        self.training = None
        self.trained_groups += 1
        if self.trained_groups < len(self.group_lengths):
            self.idle_since = self.now
            return
        self.train_end = self.now
        # The paper's timings, as its artifact measures them (docs/simulator.md, "The hybrid step"):
        # t_wait_remote is how long the step went on after its last response (the instances' idle
        # time until the step ends), and t_remote how long the instances generated: from the first
        # work one got (the step's start when they share its first dispatch) to the last response.
        wait_remote = self.now - self.rollout_end if self.last_finishes else 0.0
        remote_s = self.rollout_end - self.remote_start if self.remote_start is not None else 0.0
        self.wait_remote = wait_remote
        self.remote_s = remote_s
        self.instances_end = len(self.instances)
        if self.controller is not None:
            stable = self.instances_end == self.instances_start and self.st_preemptions == 0
            self.controller.update(StepTimings(
                instances=self.instances_start, stable=stable, wait_train_s=self.wait_train,
                wait_remote_s=wait_remote, remote_s=remote_s, train_s=self.train_compute,
                tokens_per_s=sum(s.length for s in self.samples) / (self.now - self.step_start)))
            self.cap = self.controller.instance_cap()
        ids = self.work.prompt_ids(self.k)
        self.histopipe.observe_step({str(ids[g]): lengths for g, lengths in enumerate(self.group_lengths)})
        # Publish version k+1: the reserved engines load it, the instances pull it.
        self.published = self.k + 1
        for inst in self.instances.values():
            if inst.version is not None:
                inst.version = None
                self._push(self.now + self.pull_s, _PULLED, inst.name, self.published)
        self._push(self.now + self.sync_s, _START, self.k + 1, None)

    def _close_step(self) -> None:
        wall = self.now - self.step_start
        inst_s = self._instance_seconds() - self.step_inst_s0
        tokens = sum(s.length for s in self.samples)
        usd = self.meter.charge_step(wall, inst_s, tokens)["cost/usd"]
        self.records.append(StepRecord(
            step=self.k, start_s=self.step_start, end_s=self.now, rollout_s=self.rollout_end - self.step_start,
            train_s=self.train_compute, seed_s=self.seed_s if self.colocated else 0.0,
            reserved_rollout_s=self.reserved_rollout_s if self.colocated else self.rollout_end - self.step_start,
            tokens_generated=self.tokens_generated - self.step_tokens0, tokens_trained=tokens,
            instances_start=self.instances_start, instances_end=self.instances_end,
            preemptions=self.st_preemptions, migrations=sum(self.st_migrated.values()), wasted_tokens=self.st_wasted,
            recomputed_tokens=self.st_recomputed, wait_train_s=self.wait_train, wait_remote_s=self.wait_remote,
            usd=usd, cap=self.cap, instance_s=inst_s, migrated=dict(self.st_migrated),
            in_flight_at_preemption=self.st_in_flight, remote_s=self.remote_s))

    def _finish_run(self) -> None:
        for name in list(self.instances):
            self._end_instance(name, preempted=False)
        self.done = True

    # ---- instances ---------------------------------------------------------------------------------

    def _instance_seconds(self) -> float:
        return self._inst_s + self._live * (self.now - self._inst_t)

    def _count_live(self, delta: int) -> None:
        self._inst_s = self._instance_seconds()
        self._inst_t = self.now
        self._live += delta
        if self.timeline[-1][0] == self.now:
            self.timeline[-1] = (self.now, self._live)
        else:
            self.timeline.append((self.now, self._live))

    def _replay_step(self) -> None:
        if self.replay is None or self.done:
            return
        if not self.caps or self.caps[-1][1] != self.cap:
            self.caps.append((self.now, self.cap))
        actions = self.replay.step(self.now, list(self.instances), 0, self.cap)
        for name in actions.kill:
            self._end_instance(name, preempted=True)
        for name, _ in actions.notify:
            self._doom(name)
        for name in actions.release:
            self._end_instance(name, preempted=False)
        for _ in range(actions.start):
            name = f"i{self._launched}"
            self._launched += 1
            self.instances[name] = _Instance(name)
            self._count_live(+1)
            self._push(self.now + self.cfg.instance_startup_s, _BOOTED, name, None)

    def _pulled(self, name: str, version: int) -> None:
        inst = self.instances.get(name)
        if inst is None:
            return
        if version != self.published:  # a newer version came out during the pull: pull that one
            self._push(self.now + self.pull_s, _PULLED, name, self.published)
            return
        inst.version = version
        if not inst.engines:
            inst.engines = [self._new_engine(f"{name}/e{j}", name) for j in range(self.engines_per_instance)]

    def _doom(self, name: str) -> None:
        """A preemption notice: stop sending it work and take its samples back now (exact partial
        outputs), so the kill that follows wastes nothing."""
        inst = self.instances[name]
        inst.doomed = True
        for e in inst.engines:
            if e.assigned:
                self._take_back(e, sorted(e.assigned), "noticed")

    def _end_instance(self, name: str, preempted: bool) -> None:
        """A hard kill (preempted) or a graceful end (a release, the end of the run)."""
        inst = self.instances.pop(name)
        self._count_live(-1)
        if preempted:
            self.total_preemptions += 1
            self.st_preemptions += 1
        for e in inst.engines:
            if e.assigned:
                if not preempted:
                    self._take_back(e, sorted(e.assigned), "released")
                else:
                    self._sync(e)
                    progress = e.state.progress()
                    for i in sorted(e.assigned):
                        s = self.samples[i]
                        made = progress[i]
                        # Tokens reach the manager in chunks of stream_interval; the last partial
                        # chunk of this attempt dies with the instance.
                        waste = (made - s.made_at_submit) % self.cfg.stream_interval
                        streamed = made - waste
                        self.st_wasted += waste
                        if self.cfg.migration == "recompute":
                            self.st_recomputed += streamed
                            s.made = 0
                        else:
                            s.made = streamed
                        s.engine = None
                        self.pending.appendleft(i)
                    self.st_migrated["preempted"] += len(e.assigned)
                    self.st_in_flight += len(e.assigned)
                    e.assigned.clear()
            e.gen += 1  # its scheduled events are void
            del self.engines[e.name]


__all__ = ["ClusterRun", "StepRecord"]
