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

This module owns the events and their order; the books it keeps are its helpers': the engines and
their traffic with the step (`rlboost.sim.engine_pool`, which also says how the simulator sees
streaming), the rented instances (`rlboost.sim.spot_instances`), the trainer of a step
(`rlboost.sim.step_trainer`) and a step's totals, which become its `StepRecord`
(`rlboost.sim.step_totals`).

With `max_staleness` k > 0 (bounded staleness, docs/staleness.md) the instances never wait for the
trainer: once a step's rollout is over they start the next batch ahead of its trainer, on the weights
they hold (`StepState(ahead=True)` at the version that will train it, so it admits only the k before
that), pull each version the trainer publishes and swap it in between tokens (`StepState.ready`);
when its trainer starts, the reserved engines seed what is left
(`StepState.seed`) and the trainer takes the groups that finished meanwhile at once. One batch runs
ahead at a time, so a token trained at version t comes from version t - 1 or t.

Two layouts share the loop:
- `colocated=True` (RLBoost): the reserved GPUs run rollout engines for the seeding window, hand
  their partial samples to the instances, then train on finished groups as they stream in.
- `colocated=False` (Disagg, StreamRL-style): some reserved GPUs only generate, the others only
  train, both for the whole step; no instances (the step has no seeding window).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from rlboost.policies.balance import Balancer
from rlboost.policies.dispatch import JSQDispatcher
from rlboost.policies.histopipe import HistoPipe, HistoPipeConfig, SampleInfo
from rlboost.policies.offload import OffloadController
from rlboost.policies.offload_loop import OffloadLoop
from rlboost.policies.tail_share import ahead_slots, tail_contexts
from rlboost.rollout.scheduling import expected_of, overruns_of
from rlboost.rollout.step_state import (RESERVED, Abort, GroupDone, ReleaseReserved, Retire, StepConfig, StepState,
                                        Submit)
from rlboost.sim.engine_pool import EnginePool
from rlboost.sim.instance_events import InstanceEvents
from rlboost.sim.profile import EngineProfile, TrainProfile
from rlboost.sim.pulls import PullTimes
from rlboost.sim.records import StepRecord
from rlboost.sim.spot_instances import SpotInstances
from rlboost.sim.step_totals import StepTotals
from rlboost.sim.step_trainer import StepTrainer
from rlboost.sim.workload import Workload
from rlboost.spot.cost import CostMeter
from rlboost.spot.trace import SpotTrace, TraceReplay

if TYPE_CHECKING:
    from rlboost.sim.simulator import SimConfig

# Event kinds; at equal times events run in the order they were scheduled.
_ENGINE, _BOOTED, _PULLED, _TRACE, _WINDOW, _TRAINED, _START = range(7)


class ClusterRun(InstanceEvents):
    """One simulated run of the hybrid (colocated=True) or disaggregated (colocated=False) layout; the
    instances' events are `InstanceEvents`'."""

    BOOTED, PULLED, WINDOW = _BOOTED, _PULLED, _WINDOW

    def __init__(self, cfg: SimConfig, *, engine: EngineProfile, train: TrainProfile, workload: Workload,
                 rollout_gpus: int, train_gpus: int, colocated: bool, trace: SpotTrace | None,
                 controller: OffloadController | None, seed_s: float, meter: CostMeter,
                 max_steps: int | None = None):
        self.cfg = cfg
        self.train, self.work = train, workload
        self.prompt_len = workload.cfg.prompt_len
        self.colocated = colocated
        self.train_gpus = train_gpus
        self.loop = OffloadLoop(controller) if controller is not None else None
        self.fixed_seed_s = seed_s
        self.meter = meter
        self.max_steps = max_steps
        self.max_running = engine.cfg.max_num_seqs
        self.kv_tokens = int(engine.kv_capacity_tokens)
        self.dispatcher = JSQDispatcher(cfg.max_pending)
        self.balancer = Balancer()
        self.step_config = StepConfig(share_with_pulling=cfg.share_with_pulling, migration=cfg.migration,
                                      notice_keep=cfg.notice_keep, max_staleness=cfg.max_staleness)
        self.histopipe = HistoPipe(HistoPipeConfig(enabled=cfg.histopipe))
        # the reserved engines always hold the version before the one published: their syncs are patches
        self.sync_s = train.weight_sync_s(engine.cfg.reserved_gbps, cfg.wire_dtype) * cfg.patch_share
        self.engines_per_instance = cfg.gpus_per_instance // engine.tp
        # An instance too small for one engine of the model cannot serve it: none is rented.
        replay = (TraceReplay(trace, cfg.seed, cfg.notice_s, cfg.trace.max_instances)
                  if trace is not None and self.engines_per_instance > 0 else None)
        self.spot = SpotInstances(replay, PullTimes(train.weight_sync_s(cfg.link_gbps, cfg.wire_dtype),
                                                    cfg.patch_share, cfg.from_base_share))

        self.now = 0.0
        self._heap: list[tuple[float, int, int, object, object]] = []
        self._seq = 0
        self.pool = EnginePool(engine, self.prompt_len, cfg.stream_interval,
                               lambda t, name, gen: self._push(t, _ENGINE, name, gen))
        self.reserved = [self.pool.add(f"r{j}", None, self.now) for j in range(rollout_gpus // engine.tp)]
        self.published = 0  # the newest weight version; step k runs version k
        self.cap: int | None = None
        self.records: list[StepRecord] = []
        self.done = False

        self.k = -1
        self.step: StepState | None = None
        self.totals: StepTotals | None = None  # the running step's counters
        self.trainer: StepTrainer | None = None  # and its trainer
        self.active = False  # the step's rollout is under way
        self.ahead: _Ahead | None = None  # the next batch, generated ahead of its trainer (max_staleness > 0)

        for t in replay.decision_times() if replay is not None else ():
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
            self.pool.woke(a, b, self.now)
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
        """After every instant with events: the decisions of the batches the engines serve and their
        commands, until none is left, then the trainer takes the next group."""
        if self.step is not None:
            self._decide()
            if self._tail_open():
                self._start_ahead()  # the next batch fills the slots the step's tail leaves free
                self._decide()
            if self.active and self.step.done:
                self._rollout_done()  # which may start the next batch ahead: its first decisions now
                self._decide()
        self._train_next()

    def _decide(self) -> None:
        """The step's decisions first, then the batch ahead's in the slots the step leaves free."""
        while True:
            issued = False
            for step, _ in self._served():
                self.pool.report_finished(self._served(), self.now)
                commands = step.decide(self.now)
                issued = issued or bool(commands)
                self._execute(commands, step)
                self._limit_ahead()
            if not issued:
                break

    def _served(self) -> list[tuple[StepState, dict[str, int]]]:
        """The batches the engines serve, each with its response length by uid: the step's rollout (while
        it lasts), and the batch ahead of its trainer (with max_staleness)."""
        served = [(self.step, self.lengths)] if self.active else []
        return served + [(self.ahead.state, self.ahead.lengths)] if self.ahead is not None else served

    def _tail_open(self) -> bool:
        """Whether the next batch starts ahead now: with max_staleness and start_ahead=tail, once the step's
        rollout has nothing left to place (its tail) and its trainer holds the reserved GPUs."""
        step = self.step
        return (self.cfg.start_ahead == "tail" and bool(self.step_config.max_staleness) and self.colocated
                and self.ahead is None and self.active and step.released and not step.seeding and not step.pending
                and not step.done)

    def _limit_ahead(self) -> None:
        """In the step's tail, the batch ahead uses on each engine what the step leaves free there, in
        sequences and KV tokens (`ahead_slots`, `StepState.limit`); after it, all of it."""
        if self.ahead is None or not (self.active or self.ahead.limited):
            return  # nothing to limit: no batch ahead, or its limits were lifted at the rollout's end
        ahead, step = self.ahead.state, self.step if self.active else None
        self.ahead.limited = step is not None
        if step is not None:
            contexts = tail_contexts(self.prompt_len, self.prompt_len, self.work.cfg.max_response, step.mean_response)
        for name, w in ahead.workers.items():
            if w.alive:
                ahead.limit(name, None if step is None else ahead_slots(
                    self.max_running, step.holding(name), self.kv_tokens, *contexts))

    def _lengths(self, step: StepState) -> dict[str, int]:
        return self.ahead.lengths if self.ahead is not None and step is self.ahead.state else self.lengths

    def _execute(self, commands, step: StepState) -> None:
        """Carry out `step`'s commands (the step's or the batch ahead's)."""
        ahead = self.ahead if self.ahead is not None and step is self.ahead.state else None
        for command in commands:
            if isinstance(command, Submit):
                self.pool.submit(command, self._lengths(step), self.now)
            elif isinstance(command, Abort):
                self.pool.abort(command, step, self.now)
            elif isinstance(command, GroupDone):
                (ahead.groups_done if ahead is not None else self.trainer.ready).append(command.group)
            elif isinstance(command, ReleaseReserved):
                self.trainer.release(self.now)  # (never from a batch ahead: its trainer holds the GPUs)
            elif isinstance(command, Retire):
                pass  # the instance's end is carried out where it was decided (_end_instance)

    # ---- the step ----------------------------------------------------------------------------------

    def _start(self, k: int) -> None:
        if k > 0:
            self._close_step()
            if self.now >= self.cfg.duration_s or (self.max_steps is not None and k >= self.max_steps):
                self._finish_run()
                return
        self.k = k
        self.totals = totals = StepTotals(k, self.now, self.pool.tokens_generated, self.spot.held.seconds(self.now))
        self._replay_step()  # before counting the instances: kills and launches at the start are the step's
        totals.instances_start = len(self.spot.instances)
        self.active = True
        plan = self.loop.begin(totals.instances_start) if self.loop is not None else None
        seed_s = plan.seed_window_s if plan is not None else self.fixed_seed_s
        totals.seed_s = seed_s if self.colocated else 0.0
        outlook = plan.outlook if plan is not None and self.colocated else None
        ahead, self.ahead = self.ahead, None
        if ahead is None:
            self.step, self.lengths, self.group_lengths = self._batch(
                k, seed_s if self.colocated else None, outlook)
        else:  # generated ahead of this trainer: the reserved engines seed what is left
            self.step, self.lengths, self.group_lengths = ahead.state, ahead.lengths, ahead.group_lengths
            self.step.seed(self.now, seed_s, outlook)
        step = self.step
        self.trainer = StepTrainer(totals, len(self.group_lengths))
        for e in self.reserved:
            step.join(e.name, RESERVED, self.max_running, e.profile, version=self.published)
        if ahead is None:
            for inst in self.spot.instances.values():
                if inst.booted:
                    self._join(inst, step)
        else:
            self.trainer.ready.extend(ahead.groups_done)
            if step.released:  # not seeded (nothing waits for a worker): the trainer starts at once
                self.trainer.release(self.now)
        deadline = step.next_deadline()
        if deadline is not None and deadline > self.now:
            self._push(deadline, _WINDOW, k, None)

    def _batch(self, k: int, seed_s: float | None, outlook, ahead: bool = False
               ) -> tuple[StepState, dict[str, int], list[list[int]]]:
        """The StepState of the workload's step `k`, its response lengths by uid and by group. Its
        version is the one its trainer will train from: the newest, or for a batch started `ahead`
        the next (so it admits only tokens within max_staleness of that)."""
        ids = self.work.prompt_ids(k)
        group_lengths = self.work.step(k)
        n = self.work.cfg.samples_per_prompt
        # uids sort as the sample indices do (a step has fewer than a million samples), and name their step:
        # in a step's tail an engine serves two
        uids = [[f"{k}:{g * n + j:06d}" for j in range(len(group))] for g, group in enumerate(group_lengths)]
        lengths = {uid: length for g, group in enumerate(group_lengths) for uid, length in zip(uids[g], group)}
        keys = {uid: str(ids[g]) for g, row in enumerate(uids) for uid in row}
        infos = [SampleInfo(uid, keys[uid], g) for g, row in enumerate(uids) for uid in row]
        histopipe = self.histopipe
        overruns = overruns_of(histopipe, keys) if histopipe.cfg.enabled else None
        expected = expected_of(histopipe, keys) if histopipe.cfg.enabled else None
        step = StepState(
            [(uid, g, None) for g, row in enumerate(uids) for uid in row], version=self.published + ahead,
            seed_window_s=seed_s, now=self.now, dispatcher=self.dispatcher, balancer=self.balancer,
            config=self.step_config, order=histopipe.order(k, infos), overruns=overruns,
            progress=lambda name: self.pool.progress(name, self.now), longest_pull_s=self.spot.longest_pull_s,
            outlook=outlook, expected=expected, ahead=ahead)
        return step, lengths, group_lengths

    def _rollout_done(self) -> None:
        self.totals.rollout_end_s = self.now
        self.active = False
        if not self.trainer.released:
            self.trainer.release(self.now)
        if self.ahead is not None:
            self._limit_ahead()  # started in the tail: every slot is the batch ahead's now
        elif self.step_config.max_staleness and self.colocated:
            self._start_ahead()

    def _start_ahead(self) -> None:
        """The instances go on with the next batch while the trainer trains this one: from the step's
        tail, in the slots it leaves free, or from its end."""
        state, lengths, group_lengths = self._batch(self.k + 1, None, None, ahead=True)
        self.ahead = _Ahead(state, lengths, group_lengths)
        for inst in self.spot.instances.values():
            if inst.booted:
                self._join(inst, state)
        self._limit_ahead()

    def _close_step(self) -> None:
        stats, totals = self.step.stats, self.totals
        if stats.stale_chunks:
            raise RuntimeError(f"step {self.k}: {stats.stale_chunks} chunks of attempts already taken back: the "
                               "simulator's engines and the step disagree")
        inst_s = totals.instance_s(self.spot.held.seconds(self.now))
        tokens = sum(self.lengths.values())
        usd = self.meter.charge_step(self.now - totals.start_s, inst_s, tokens)["cost/usd"]
        self.records.append(totals.record(self.now, stats, colocated=self.colocated,
                                          tokens_made=self.pool.tokens_generated, tokens_trained=tokens,
                                          instance_s=inst_s, usd=usd, cap=self.cap))

    def _finish_run(self) -> None:
        for name in list(self.spot.instances):
            self._end_instance(name, preempted=False)
        self.done = True

    # ---- the trainer -------------------------------------------------------------------------------

    def _train_next(self) -> None:
        if not self.trainer.can_train():
            return
        step = self.step
        if step.stats.fallback and any(step.holding(e.name) for e in self.reserved):
            return  # the reserved GPUs are generating again
        g, seconds = self.trainer.start(self.now, self._train_s)
        self._push(self.now + seconds, _TRAINED, g, None)

    def _train_s(self, g: int) -> float:
        """Trainer seconds of the step's group `g` (its prompts and responses)."""
        return self.train.sequences_s([self.prompt_len + length for length in self.group_lengths[g]], self.train_gpus)

    def _trained(self, g: int) -> None:
        if not self.trainer.finish(self.now):
            return
        totals = self.totals
        totals.remote_s, totals.wait_remote_s = self.step.remote_timings(self.now)
        totals.instances_end = len(self.spot.instances)
        if self.loop is not None:
            self.cap = self.loop.end(totals.outcome(
                self.now, held_s=self.spot.held.seconds(self.now), samples=len(self.lengths),
                response_tokens=sum(self.lengths.values()), measured=self.step.stats.offload_measurements()))
        ids = self.work.prompt_ids(self.k)
        self.histopipe.observe_step({str(ids[g]): lengths for g, lengths in enumerate(self.group_lengths)})
        # Publish version k+1: the reserved engines load it, the instances pull it (with staleness they
        # serve the version they hold meanwhile, and the batch ahead moves its window).
        self.published = self.k + 1
        if self.ahead is not None:
            self.ahead.state.advance(self.published, self.now)
            self._execute(self.ahead.state.take_commands(), self.ahead.state)
        for inst in self.spot.instances.values():
            if inst.version is not None:
                if not self.step_config.max_staleness:
                    inst.version = None
                self._pull(inst)
        self._push(self.now + self.sync_s, _START, self.k + 1, None)

@dataclass
class _Ahead:
    """A batch the instances generate ahead of its trainer (max_staleness > 0)."""

    state: StepState
    lengths: dict[str, int]
    group_lengths: list[list[int]]
    groups_done: list[int] = field(default_factory=list)
    """Its groups finished so far, in order: its trainer takes them first."""
    limited: bool = False
    """Its workers' slots are limited (started in the step's tail, until the step's rollout ends)."""


__all__ = ["ClusterRun"]
