"""The event-driven cluster of a simulated RL run (docs/simulator.md, "Simulation model"): reserved rollout
engines, the trainer, preemptible instances from a trace, and the rollout manager's decisions.

Contract: `ClusterRun(...).run()` plays whole training steps, one after the other, until a step
would start at or after `duration_s`, and returns one `StepRecord` per step. Every decision of a
step is taken by the runtime's own `StepState` (rlboost.rollout.step_state): the seeding hand-off,
the colocated fallback, dispatch (`JSQDispatcher`), balancing (`Balancer` with one `ThroughputProfile`
per engine), which samples move, migration and waste, group completion. This module is its shell,
as the Ray manager is the runtime's: it turns engine completions, trace events and weight pulls (a
patch, from the base or whole: `rlboost.sim.pulls`) into StepState events at their simulated times,
and carries out the commands that come back (a submit or an abort acts on the engine's `EngineState`,
rlboost.sim.batching, at once). Around the step it plays the policies that act between steps: the
runtime's own `OffloadLoop` (T_seed, memory M[n], the instance cap), `HistoPipe` (dispatch order,
overruns), `TraceReplay` (which instances start, get warned, killed, released) and `CostMeter`
(dollars). Time is continuous and jumps from event to event; nothing is simulated token by token.
Pure: no clock, no Ray, no torch; the only randomness is the trace replay's seeded choice of victims.

Streaming, as the simulator sees it: nothing depends on the chunks in between, so a sample's tokens
are reported when it finishes, or when its engine is hard-killed: then the complete chunks of
`stream_interval` of its attempt, and the rest dies with the instance (the waste).

Two layouts share the loop:
- `colocated=True` (RLBoost): the reserved GPUs run rollout engines for the seeding window, hand
  their partial samples to the instances, then train on finished groups as they stream in.
- `colocated=False` (Disagg, StreamRL-style): some reserved GPUs only generate, the others only
  train, both for the whole step; no instances (the step has no seeding window).
Modelling assumptions: docs/simulator.md, "Simulation model".
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from rlboost.policies.balance import Balancer
from rlboost.policies.dispatch import JSQDispatcher
from rlboost.policies.histopipe import HistoPipe, HistoPipeConfig, SampleInfo
from rlboost.policies.offload import OffloadController
from rlboost.policies.offload_loop import OffloadLoop, StepOutcome
from rlboost.policies.profile import ThroughputProfile
from rlboost.rollout.scheduling import overruns_of
from rlboost.rollout.step_state import (PREEMPTIBLE, RESERVED, Abort, GroupDone, Partial, ReleaseReserved, Retire,
                                        StepConfig, StepState, Submit, WorkerState)
from rlboost.sim.batching import EngineState
from rlboost.sim.members import SimEngine, SimInstance
from rlboost.sim.profile import EngineProfile, TrainProfile
from rlboost.sim.pulls import PullTimes
from rlboost.sim.records import InstanceMeter, StepRecord
from rlboost.sim.workload import Workload
from rlboost.spot.cost import CostMeter
from rlboost.spot.trace import SpotTrace, TraceReplay

if TYPE_CHECKING:
    from rlboost.sim.simulator import SimConfig

# Event kinds; at equal times events run in the order they were scheduled.
_ENGINE, _BOOTED, _PULLED, _TRACE, _WINDOW, _TRAINED, _START = range(7)


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
        self.loop = OffloadLoop(controller) if controller is not None else None
        self.fixed_seed_s = seed_s
        self.meter = meter
        self.max_steps = max_steps
        self.max_running = engine.cfg.max_num_seqs
        self.dispatcher = JSQDispatcher(cfg.max_pending)
        self.balancer = Balancer()
        self.step_config = StepConfig(share_with_pulling=cfg.share_with_pulling, migration=cfg.migration)
        self.histopipe = HistoPipe(HistoPipeConfig(enabled=cfg.histopipe))
        self.pulls = PullTimes(train.weight_sync_s(cfg.link_gbps, cfg.wire_dtype), cfg.patch_share, cfg.from_base_share)
        # the reserved engines always hold the version before the one published: their syncs are patches
        self.sync_s = train.weight_sync_s(engine.cfg.reserved_gbps, cfg.wire_dtype) * cfg.patch_share
        self.longest_pull_s = self.pulls.longest_planned_s  # and any longer pull seen (the share's grace)
        self.engines_per_instance = cfg.gpus_per_instance // engine.tp
        # An instance too small for one engine of the model cannot serve it: none is rented.
        self.replay = (TraceReplay(trace, cfg.seed, cfg.notice_s, cfg.trace.max_instances)
                       if trace is not None and self.engines_per_instance > 0 else None)

        self.now = 0.0
        self._heap: list[tuple[float, int, int, object, object]] = []
        self._seq = 0
        self.engines: dict[str, SimEngine] = {}
        self.reserved = [self._new_engine(f"r{j}", None) for j in range(rollout_gpus // engine.tp)]
        self.instances: dict[str, SimInstance] = {}
        self._launched = 0
        self.published = 0  # the newest weight version; step k runs version k
        self.cap: int | None = None
        self._due: list[tuple[SimEngine, str]] = []
        """(engine, request id) of samples an engine finished, not yet reported to the step."""

        # run totals
        self.tokens_generated = 0
        self.caps: list[tuple[float, int | None]] = []
        self.records: list[StepRecord] = []
        self.total_preemptions = 0
        self.instances_held = InstanceMeter()
        self.done = False

        self.k = -1
        self.step: StepState | None = None
        self.active = False  # the step's rollout is under way

        for t in self.replay.decision_times() if self.replay is not None else ():
            self._push(t, _TRACE, None, None)
        self._push(0.0, _START, 0, None)

    # ---- the loop ----------------------------------------------------------------------------------

    def run(self) -> list[StepRecord]:
        heap = self._heap
        while not self.done:
            if not heap:
                raise RuntimeError(f"simulation stalled at t={self.now:.3f}s in step {self.k}: no event left")
            self.now = t = heap[0][0]
            # Everything that happens at this instant first, then the step's decisions: e.g. all
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
                self._sync(e)
                self._reschedule(e)
        elif kind == _TRACE:
            self._replay_step()
        elif kind == _BOOTED:
            self._booted(a)
        elif kind == _PULLED:
            self._pulled(a, b)
        elif kind == _WINDOW:
            pass  # _settle asks the step, whose window may be over
        elif kind == _TRAINED:
            self._trained(a)
        elif kind == _START:
            self._start(a)

    def _settle(self) -> None:
        """After every instant with events: the step's decisions and their commands, until none is
        left, then the trainer takes the next group."""
        step = self.step
        if step is not None:
            while True:
                self._report_finished()
                commands = step.decide(self.now)
                if not commands:
                    break
                self._execute(commands)
            if self.active and step.done:
                self._rollout_done()
        self._train_next()

    def _execute(self, commands) -> None:
        for command in commands:
            if isinstance(command, Submit):
                self._submit(self.engines[command.worker], command)
            elif isinstance(command, Abort):
                self._abort(self.engines[command.worker], command)
            elif isinstance(command, GroupDone):
                self.ready.append(command.group)
            elif isinstance(command, ReleaseReserved):
                self._release_trainer()
            elif isinstance(command, Retire):
                pass  # the instance's end is carried out where it was decided (_end_instance)

    # ---- engines -----------------------------------------------------------------------------------

    def _new_engine(self, name: str, instance: str | None) -> SimEngine:
        state = EngineState(self.profile, self.prompt_len, start_s=self.now)
        e = SimEngine(name, instance, state, ThroughputProfile())
        state.on_decode = self._decode_observer(e)
        self.engines[name] = e
        return e

    def _decode_observer(self, e: SimEngine) -> Callable[[int, int, float], None]:
        observe = e.profile.observe

        def on_decode(batch: int, steps: int, seconds: float) -> None:
            self.tokens_generated += batch * steps
            observe(batch, batch * steps / seconds)

        return on_decode

    def _reschedule(self, e: SimEngine) -> None:
        e.gen += 1
        t = e.state.next_event_s()
        if t < math.inf:
            self._push(t, _ENGINE, e.name, e.gen)

    def _sync(self, e: SimEngine) -> None:
        """Bring an engine to now; what it finished is reported to the step by `_report_finished`."""
        for request_id in e.state.advance_to(self.now):
            self._due.append((e, request_id))

    def _report_finished(self) -> None:
        due, self._due = self._due, []
        step = self.step
        for e, request_id in due:
            held = e.held.pop(request_id)
            uid = request_id.rpartition("#")[0]
            step.chunk(e.name, request_id, 0, self.lengths[uid] - held, self.k, True, self.now, "stop")

    def _progress(self, name: str) -> Mapping[str, int]:
        """The step's `progress`: tokens each request on engine `name` made in its current attempt."""
        e = self.engines.get(name)
        if e is None:
            return {}
        self._sync(e)
        held = e.held
        return {rid: made - held[rid] for rid, made in e.state.progress().items()}

    def _submit(self, e: SimEngine, command: Submit) -> None:
        self._sync(e)
        items = []
        for r in command.requests:
            e.held[r.request_id] = r.held
            items.append((r.request_id, self.lengths[r.uid], r.held))
        e.state.submit(items, self.now)
        self._reschedule(e)

    def _abort(self, e: SimEngine, command: Abort) -> None:
        """An abort answers at once with the exact tokens of the complete decode steps."""
        self._sync(e)
        made = e.state.abort(command.request_ids, self.now)
        partials = {rid: Partial(n - e.held.pop(rid), self.k) for rid, n in made.items()}
        self._reschedule(e)
        self.step.aborted(command.id, partials, self.now)

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
        self.step_inst_s0 = self.instances_held.seconds(self.now)
        self.st_preemptions, self.step_provision = 0, []  # the instances' launch-to-serving times
        self._replay_step()
        self.instances_start = len(self.instances)
        ids = self.work.prompt_ids(k)
        self.group_lengths = self.work.step(k)
        n = self.work.cfg.samples_per_prompt
        # uids sort as the sample indices do (a step has fewer than a million samples)
        uids = [[f"{g * n + j:06d}" for j in range(len(group))] for g, group in enumerate(self.group_lengths)]
        self.lengths = {uid: length for g, group in enumerate(self.group_lengths)
                        for uid, length in zip(uids[g], group)}
        self.ready: deque[int] = deque()
        self.trained_groups = 0
        self.training: int | None = None
        self.train_compute = 0.0
        self.wait_train = 0.0
        self.idle_since: float | None = None
        self.released = False
        self.rollout_end: float | None = None
        self.active = True
        plan = self.loop.begin(self.instances_start) if self.loop is not None else None
        self.seed_s = plan.seed_window_s if plan is not None else self.fixed_seed_s
        keys = {uid: str(ids[g]) for g, row in enumerate(uids) for uid in row}
        infos = [SampleInfo(uid, keys[uid], g) for g, row in enumerate(uids) for uid in row]
        histopipe = self.histopipe
        overruns = overruns_of(histopipe, keys) if histopipe.cfg.enabled else None
        self.step = step = StepState(
            [(uid, g, None) for g, row in enumerate(uids) for uid in row], version=k,
            seed_window_s=self.seed_s if self.colocated else None, now=self.now, dispatcher=self.dispatcher,
            balancer=self.balancer, config=self.step_config, order=histopipe.order(k, infos), overruns=overruns,
            progress=self._progress, longest_pull_s=self.longest_pull_s,
            outlook=plan.outlook if plan is not None and self.colocated else None)
        for e in self.reserved:
            step.join(e.name, RESERVED, self.max_running, e.profile)
        for inst in self.instances.values():
            if inst.booted:
                self._join(inst)
        deadline = step.next_deadline()
        if deadline is not None and deadline > self.now:
            self._push(deadline, _WINDOW, k, None)

    def _join(self, inst: SimInstance) -> None:
        """The instance's engines take part in the step: serving it, or pulling its weights."""
        step = self.step
        state = (WorkerState.NOTICED if inst.doomed else WorkerState.SERVING if inst.version == self.k
                 else WorkerState.PULLING)
        pulling = inst.version is None and self.published == self.k
        for e in inst.engines:
            step.join(e.name, PREEMPTIBLE, self.max_running, e.profile, state=state,
                      pulling_since=inst.pull_started if pulling else None)

    def _rollout_done(self) -> None:
        self.rollout_end = self.now
        self.active = False
        if not self.released:
            self._release_trainer()

    # ---- the trainer -------------------------------------------------------------------------------

    def _release_trainer(self) -> None:
        self.released = True
        self.idle_since = self.now

    def _train_next(self) -> None:
        if not self.released or self.training is not None or not self.ready:
            return
        step = self.step
        if step.stats.fallback and any(step.holding(e.name) for e in self.reserved):
            return  # the reserved GPUs are generating again
        g = self.ready.popleft()
        if self.idle_since is not None:
            self.wait_train += self.now - self.idle_since
            self.idle_since = None
        seconds = self.train.sequences_s([self.prompt_len + length for length in self.group_lengths[g]],
                                         self.train_gpus)
        self.train_compute += seconds
        self.training = g
        self._push(self.now + seconds, _TRAINED, g, None)

    def _trained(self, g: int) -> None:
        self.training = None
        self.trained_groups += 1
        if self.trained_groups < len(self.group_lengths):
            self.idle_since = self.now
            return
        self.remote_s, self.wait_remote = self.step.remote_timings(self.now)
        self.instances_end = len(self.instances)
        if self.loop is not None:
            self.cap = self.loop.end(StepOutcome(
                instances_start=self.instances_start, instances_end=self.instances_end,
                preemptions=self.st_preemptions, wall_s=self.now - self.step_start, train_s=self.train_compute,
                wait_train_s=self.wait_train, remote_s=self.remote_s, wait_remote_s=self.wait_remote,
                samples=len(self.lengths), response_tokens=sum(self.lengths.values()),
                instance_s=self.instances_held.seconds(self.now) - self.step_inst_s0, provision_s=self.step_provision,
                measured=self.step.stats.offload_measurements()))
        ids = self.work.prompt_ids(self.k)
        self.histopipe.observe_step({str(ids[g]): lengths for g, lengths in enumerate(self.group_lengths)})
        # Publish version k+1: the reserved engines load it, the instances pull it.
        self.published = self.k + 1
        for inst in self.instances.values():
            if inst.version is not None:
                inst.version = None
                self._pull(inst)
        self._push(self.now + self.sync_s, _START, self.k + 1, None)

    def _close_step(self) -> None:
        step = self.step
        stats = step.stats
        if stats.stale_chunks:
            raise RuntimeError(f"step {self.k}: {stats.stale_chunks} chunks of attempts already taken back: the "
                               "simulator's engines and the step disagree")
        wall = self.now - self.step_start
        inst_s = self.instances_held.seconds(self.now) - self.step_inst_s0
        tokens = sum(self.lengths.values())
        usd = self.meter.charge_step(wall, inst_s, tokens)["cost/usd"]
        rollout_s = self.rollout_end - self.step_start
        if not self.colocated or stats.fallback:
            reserved_rollout_s = rollout_s  # the reserved engines generated to the end
        else:
            reserved_rollout_s = stats.seed_s
        self.records.append(StepRecord(
            step=self.k, start_s=self.step_start, end_s=self.now, rollout_s=rollout_s,
            train_s=self.train_compute, seed_s=self.seed_s if self.colocated else 0.0,
            reserved_rollout_s=reserved_rollout_s, tokens_generated=self.tokens_generated - self.step_tokens0,
            tokens_trained=tokens, instances_start=self.instances_start, instances_end=self.instances_end,
            preemptions=self.st_preemptions, migrations=sum(stats.migrated.values()),
            wasted_tokens=stats.wasted_tokens, recomputed_tokens=stats.recomputed_tokens,
            wait_train_s=self.wait_train, wait_remote_s=self.wait_remote, usd=usd, cap=self.cap, instance_s=inst_s,
            migrated=dict(stats.migrated), in_flight_at_preemption=stats.in_flight_at_preemption,
            remote_s=self.remote_s))

    def _finish_run(self) -> None:
        for name in list(self.instances):
            self._end_instance(name, preempted=False)
        self.done = True

    # ---- instances ---------------------------------------------------------------------------------

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
            self.instances[name] = SimInstance(name, self.now)
            self.instances_held.count(+1, self.now)
            self._push(self.now + self.cfg.instance_startup_s, _BOOTED, name, None)

    def _in_step(self) -> bool:
        return self.step is not None and self.active

    def _booted(self, name: str) -> None:
        """The instance's engines are up: they pull the newest weights, then serve."""
        inst = self.instances.get(name)
        if inst is None:
            return
        inst.booted = True
        inst.engines = [self._new_engine(f"{name}/e{j}", name) for j in range(self.engines_per_instance)]
        self._pull(inst)
        if self._in_step():
            self._join(inst)

    def _pull(self, inst: SimInstance) -> None:
        """Start pulling the newest version: a patch, from the base or whole, by what `inst` holds."""
        inst.pull_started = self.now
        inst.pull_s = self.pulls.seconds(inst.holds, self.published)
        self._push(self.now + inst.pull_s, _PULLED, inst.name, self.published)

    def _pulled(self, name: str, version: int) -> None:
        inst = self.instances.get(name)
        if inst is None:
            return
        inst.holds = version
        self.longest_pull_s = max(self.longest_pull_s, inst.pull_s)
        if version != self.published:  # a newer version came out during the pull: pull that one
            self._pull(inst)
            return
        inst.version = version
        if not inst.served:
            inst.served = True
            self.step_provision.append(self.now - inst.launched)
        if self._in_step() and version == self.k:
            for e in inst.engines:
                self.step.ready(e.name, self.now, inst.pull_s)

    def _doom(self, name: str) -> None:
        """A preemption notice: the instance gets no more work, and its samples are taken back now
        (exact partial outputs), so the kill that follows wastes nothing."""
        inst = self.instances[name]
        inst.doomed = True
        if self._in_step():
            for e in inst.engines:
                self.step.notice(e.name, self.now)

    def _end_instance(self, name: str, preempted: bool) -> None:
        """A hard kill (preempted) or a graceful end (a release beyond the cap, the end of the run)."""
        inst = self.instances.pop(name)
        self.instances_held.count(-1, self.now)
        if preempted:
            self.total_preemptions += 1
            self.st_preemptions += 1
        step = self.step
        for e in inst.engines:
            if step is not None and e.name in step.workers:
                self._sync(e)
                self._report_finished()
                if preempted:
                    self._kill(e)
                else:
                    # given back: its samples come back exactly (an abort), then it ends
                    step.retire(e.name, self.now)
                    self._execute(step.take_commands())
                    self._execute(step.take_commands())
                    step.dead(e.name, "released", self.now, released=True)
            e.gen += 1  # its scheduled events are void
            del self.engines[e.name]

    def _kill(self, e: SimEngine) -> None:
        """A hard kill: the complete chunks of each attempt reached the manager; the rest is lost."""
        step, interval = self.step, self.cfg.stream_interval
        for request_id, made in e.state.progress().items():
            attempt = made - e.held[request_id]
            streamed = attempt - attempt % interval
            if streamed:
                step.chunk(e.name, request_id, 0, streamed, self.k, False, self.now)
        step.dead(e.name, "preempted by the trace", self.now)


__all__ = ["ClusterRun"]
