"""Rollout backend of `rollout.mode=hybrid`: reserved and preemptible workers on Ray, one manager.

The trainer consumes groups while rollout goes on: `generate` returns the manager's stream of
finished groups, released once the seeding window has handed the step to the preemptible workers.
Each training step starts and ends in the offload loop (`rlboost.policies.offload_loop`, the code the
simulator runs too): T_seed before it; after it, from the step's `StepReport`, the controller's update
and the cap on instances the provider may hold.

With `max_staleness` k > 0 (docs/staleness.md) a training step given `next_batch` starts that batch on
the instances in its tail (`algorithm.start_ahead=tail`, the default: what its last samples leave free,
`rlboost.hybrid.step_succession`) or the moment its own rollout is over (`rollout_end`), and it goes on
while the trainer still trains: a run ahead of its trainer at the version that will train it
(`StepRun(ahead=True)`). The next `generate` adopts it: the reserved workers seed what is left, and the
groups that finished meanwhile go to the trainer first. One batch runs ahead at a time, as in the
simulator (`rlboost.sim.cluster`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

import ray

from rlboost.cluster.ray_cluster import Cluster
from rlboost.engine import SamplingParams
from rlboost.histospec import HistoryStore
from rlboost.histospec.drafter import SUFFIX_DRAFTERS
from rlboost.histospec.metrics import merged, spec_metrics
from rlboost.hybrid.config import HybridConfig
from rlboost.hybrid.fleet import Fleet
from rlboost.hybrid.handles import PREEMPTIBLE, RESERVED, WorkerState
from rlboost.hybrid.manager import RolloutManager
from rlboost.hybrid.providers import make_provider
from rlboost.hybrid.pulls import PullStats
from rlboost.hybrid.step_report import step_metrics
from rlboost.hybrid.step_run import StepRun
from rlboost.hybrid.worker import WorkerSpec
from rlboost.policies.histopipe import HistoPipe
from rlboost.policies.offload import OffloadController
from rlboost.policies.offload_loop import OffloadLoop, StepOutcome
from rlboost.rollout.sample import Group, RolloutProgress
from rlboost.rollout.step_memory import StepMemory
from rlboost.spot import ProgressClock


class HybridRollout:
    def __init__(self, cfg: HybridConfig, cluster: Cluster, spec: WorkerSpec, weights, version: int, seed: int,
                 histopipe: HistoPipe | None = None, reserved_usd_per_s: float = 0.0, instance_usd_per_s: float = 0.0,
                 max_staleness: int = 0, start_ahead: str = "tail"):
        """`cluster`: the run's Ray, which outlives this backend (`close` ends the workers, not Ray).
        `reserved_usd_per_s`, `instance_usd_per_s`: the prices the offload objective weighs
        instances with (`cost.*`; 0: no price, no cap from it). `max_staleness` k: how many versions
        behind the trainer a token may be (0: the synchronous step; the module docstring)."""
        self.cfg = cfg
        self.max_staleness = max_staleness
        self.start_ahead = start_ahead
        """When the next batch starts ahead of its trainer (k > 0): "rollout_end" or "tail" (the module docstring)."""
        self.ahead: StepRun | None = None
        """The next training step's run, started ahead of its trainer (k > 0), until `generate` adopts it."""
        self._ahead_error: BaseException | None = None
        self._memory_lock = threading.Lock()  # the run ahead plans from the memory while the driver absorbs
        # HistoSpec: the run's history lives here; each worker gets a prompt's share with its requests
        self.memory = StepMemory(HistoryStore(spec.histospec.history_max_tokens) if spec.histospec is not None
                                 else None, histopipe)
        """HistoPipe's lengths and HistoSpec's history, from one training step to the next."""
        self.manager = RolloutManager(cfg, cluster.cfg.weights, max_staleness)
        self.fleet = Fleet(cfg, spec, self.manager, cluster)
        try:
            self.fleet.publish(weights, version)
            # a known pool (the fixed provider's) is ready for the first step, booting beside the reserved workers
            pool = {RESERVED: cfg.num_reserved, PREEMPTIBLE: cfg.num_preemptible if cfg.provider == "fixed" else 0}
            self.fleet.start_pool(pool)
            self.fleet.wait_ready()
        except BaseException:
            self.fleet.shutdown()
            raise
        self.loop = OffloadLoop(OffloadController(cfg.offload, cfg.seed_window_s, cfg.num_reserved,
                                                  reserved_usd_per_s=reserved_usd_per_s,
                                                  instance_usd_per_s=instance_usd_per_s))
        # the run's progress, as the trace replay's clock (trace.tokens_per_s) or the chaos's (preempt_every_tokens)
        self.progress = (ProgressClock(cfg.trace.tokens_per_s if cfg.trace.tokens_per_s > 0 else 1.0)
                         if cfg.trace.tokens_per_s > 0 or cfg.preempt_every_tokens > 0 else None)
        self.provider = make_provider(cfg, self.fleet, seed, self.progress).start()
        self.run: StepRun | None = None
        self.last_pulls = PullStats()
        """What the weight pulls did during the last finished step (provisioning times, failures, refusals)."""
        self.training = False  # whether the step under way trains (an evaluation does not)
        self.instances_at_start = 0
        self.step_started = time.monotonic()
        self.billed_at_start = 0.0
        """The fleet's instance-seconds when the step started: the step is billed the rest."""
        self.seed_window_s = cfg.seed_window_s

    def generate(self, groups: list[Group], params: SamplingParams, version: int, training: bool,
                 next_batch: Callable[[], list[Group]] | None = None) -> Iterator[Group]:
        """`training`: run the seeding window (a training step); otherwise every worker generates to
        the end (evaluation). `next_batch` (a training step, max_staleness > 0): the next step's groups,
        asked for once this step's rollout is over and started then, ahead of their trainer."""
        if self._ahead_error is not None:
            error, self._ahead_error = self._ahead_error, None
            raise RuntimeError(f"the next batch could not start ahead of its trainer: {error}") from error
        ahead, self.ahead = self.ahead, None
        if ahead is not None and (not training or ahead.groups_list is not groups):
            raise RuntimeError("a step's rollout started ahead of its trainer, then another was asked for: "
                               "the run ahead is the next training step's")
        self.instances_at_start = self._instances()
        self.step_started = time.monotonic()
        self.billed_at_start = self.fleet.billed_seconds()
        self.training = training
        self.fleet.reap()
        order = overruns = expected = plan = None
        if training:
            plan = self.loop.begin(self.instances_at_start)
            self.seed_window_s = plan.seed_window_s
        if ahead is not None:
            with self._memory_lock:  # its step's now: its responses are absorbed at this step's publish
                self.memory.remember(groups)
            ahead.adopt(plan.seed_window_s, plan.outlook)
            self.run = ahead
            start_next, make_next = self._ahead_starter(next_batch, params, version) if next_batch else (None, None)
            if start_next is not None and not ahead.chain(start_next, make_next):
                start_next()  # its rollout was over before its trainer came: the next batch starts now
        else:
            if training:
                with self._memory_lock:
                    order, overruns, expected = self.memory.plan(groups, version)
                    self.memory.remember(groups)
            on_done, make_next = (self._ahead_starter(next_batch, params, version) if training and next_batch
                                  else (None, None))
            # an evaluation has no seeding window: every worker generates to the end
            self.run = self.manager.start_step(groups, params, version, plan and plan.seed_window_s, order, overruns,
                                               self.memory.responses, plan and plan.outlook, self._siblings(),
                                               expected, on_done=on_done, exact=not training, make_successor=make_next)
        if self.progress is not None and ahead is None:  # a run started ahead is on the clock since it started
            self.progress.begin(self.run.tokens)
        return self._released(self.run)

    def _siblings(self) -> int:
        spec = self.fleet.spec.histospec
        # only the suffix drafter drafts from siblings
        return spec.sibling_tokens_per_step if spec is not None and spec.drafter in SUFFIX_DRAFTERS else 0

    def _ahead_starter(self, next_batch: Callable[[], list[Group]], params: SamplingParams, version: int
                       ) -> tuple[Callable[[], None] | None, Callable[[], StepRun] | None]:
        """(what starts the next batch ahead of its trainer, what builds it in this step's tail), both
        called from the loop thread of this step's run: the first once its rollout is over (the run's
        `on_done`), the second (start_ahead=tail) once its tail opens (`rlboost.hybrid.step_succession`),
        and then the first starts the run the second built. At version + 1, the one its trainer will
        train from, so it admits only the tokens within k of that. (None, None) with k = 0."""
        if not self.max_staleness:
            return None, None
        built: list[StepRun] = []

        def build() -> StepRun:
            groups = next_batch()
            with self._memory_lock:  # remembered once adopted: this step's batch is yet to be absorbed
                order, overruns, expected = self.memory.plan(groups, version + 1)
            built.append(self.manager.make_step(groups, params, version + 1, None, order, overruns,
                                                self.memory.responses, None, self._siblings(), expected, ahead=True))
            return built[-1]

        def start() -> None:
            try:
                run = built[0] if built else build()
                run.succeed()
                self.ahead = self.manager.begin(run)
                if self.progress is not None:
                    # the run's progress goes on while the trainer trains: the trace's events and the
                    # chaos's kills land in the batch ahead too, not all at once when its trainer comes.
                    # This step's rollout is over, so its count is final.
                    self.progress.begin(self.ahead.tokens)
            except BaseException as e:  # noqa: BLE001 - raised by the next generate, in the driver
                self._ahead_error = e

        return start, (build if self.start_ahead == "tail" else None)

    @staticmethod
    def _released(run: StepRun) -> Iterator[Group]:
        """The run's groups, once the trainer has the reserved resources (the seeding window is not
        training time)."""
        run.training_may_start.wait()
        yield from run.groups()

    def publish(self, weights, version: int) -> None:
        """Put the new version in the weight store; reserved workers load it now, the others pull it."""
        self.fleet.publish(weights, version)
        # between steps, off the rollout's critical path: this step's responses are the next epoch's history
        with self._memory_lock:
            self.memory.absorb()

    def finish_step(self, train_s: float) -> dict[str, float]:
        """Close the training step: its report, the offload loop's update (T_seed, the cap the provider
        may hold from now) and the step's metrics. `train_s`: the trainer's time from the return of
        `generate` to its last update, the seeding window and waits for groups included (both are taken
        out of the controller's t_train)."""
        now = time.monotonic()
        report = self.run.finish(end=now)
        self.last_pulls = report.pulls
        outcome = StepOutcome(
            instances_start=self.instances_at_start, instances_end=self._instances(),
            preemptions=report.preemptions, wall_s=now - self.step_started,
            train_s=max(0.0, train_s - report.released_s - report.trainer_wait_s),
            wait_train_s=report.trainer_wait_s, remote_s=report.remote_s, wait_remote_s=report.wait_remote_s,
            samples=report.samples, response_tokens=report.response_tokens,
            instance_s=self.fleet.billed_seconds() - self.billed_at_start, provision_s=report.pulls.provision_s,
            measured=report.stats.offload_measurements())
        cap = self.loop.end(outcome)
        self.provider.set_cap(cap)
        advised = None if self.cfg.offload.enforce_cap else self.loop.advised
        metrics = step_metrics(report, outcome, seed_window_s=self.seed_window_s, cap=cap, advised_cap=advised,
                               preemption_rate=self.loop.controller.preemption_rate(),
                               weight_bytes=self.fleet.manifest.nbytes,
                               reserved_tokens_per_s=self._reserved_decode_rate())
        if self.memory.histopipe is not None:
            metrics |= {"histopipe/overruns_moved": float(report.stats.overruns_moved),
                        "histopipe/history_prompts": float(len(self.memory.histopipe.history))}
        if self.memory.history is not None:
            metrics |= spec_metrics(self._spec_stats(), len(self.memory.history))
        return metrics

    def live(self) -> RolloutProgress | None:
        """The step's rollout now, read from another thread: counters and snapshots only."""
        run = self.run
        if run is None:
            return None
        states = [h.state for h in self.manager.table.alive(PREEMPTIBLE)]
        serving = sum(st is WorkerState.SERVING for st in states)
        pulling = sum(st in (WorkerState.JOINING, WorkerState.PULLING) for st in states)
        return run.live(self.training, (serving, pulling, self.fleet.starting))

    def _instances(self) -> int:
        """n of the controller: instances admitted or booting, the units of the cap the provider
        enforces (a step that starts while its instances boot must not read as n = 0)."""
        return len(self.manager.table.alive(PREEMPTIBLE)) + self.fleet.starting

    def _spec_stats(self):
        """The live workers' speculation counters since the last step; a worker that does not answer
        in time (dying, or stuck) is left out rather than waited for."""
        refs = [h.actor.spec_stats.remote() for h in self.manager.table.alive()]
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=self.cfg.call_timeout_s)
        stats = []
        for ref in ready:
            try:
                stats.append(ray.get(ref))
            except Exception:  # noqa: BLE001 - a worker that died since: its counters are gone with it
                pass
        return merged(stats)

    def _reserved_decode_rate(self) -> float:
        """Best decode tokens/s the reserved workers have shown (0 before they decoded): what colocated
        rollout could at most reach on them, prefill not counted."""
        return sum(h.profile.best() or 0.0 for h in self.manager.table.alive(RESERVED))

    def state_dict(self) -> dict:
        return {"offload": self.loop.controller.state_dict()} | self.memory.state_dict()

    def load_state_dict(self, state: dict) -> None:
        if "offload" in state:
            self.loop.controller.load_state_dict(state["offload"])
        self.memory.load_state_dict(state)

    def close(self) -> None:
        self.provider.stop()
        self.manager.cancel_step()  # the step under way, also one whose start a stop interrupted
        self.fleet.shutdown()
