"""Rollout backend of `rollout.mode=hybrid`: reserved and preemptible workers on Ray, one manager.

The trainer consumes groups while rollout goes on: `generate` returns the manager's stream of
finished groups, released once the seeding window has handed the step to the preemptible workers.
After each step the offload controller reads the step's timings and sets the next T_seed and the cap
on instances the provider may hold.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import numpy as np
import ray

from rlboost.cluster.ray_cluster import Cluster
from rlboost.engine import SamplingParams
from rlboost.histospec import HistoryStore
from rlboost.histospec.metrics import merged, spec_metrics
from rlboost.hybrid.config import HybridConfig
from rlboost.hybrid.fleet import Fleet
from rlboost.hybrid.handles import PREEMPTIBLE, RESERVED, Lifecycle
from rlboost.hybrid.manager import RolloutManager
from rlboost.hybrid.providers import make_provider
from rlboost.hybrid.pulls import PullStats
from rlboost.hybrid.step_run import StepRun
from rlboost.hybrid.worker import WorkerSpec
from rlboost.policies.histopipe import HistoPipe
from rlboost.policies.offload import OffloadController, StepTimings
from rlboost.rollout.sample import Group, RolloutProgress
from rlboost.rollout.scheduling import dispatch_order, overrun_check, record_lengths


class HybridRollout:
    def __init__(self, cfg: HybridConfig, cluster: Cluster, spec: WorkerSpec, weights, version: int, seed: int,
                 histopipe: HistoPipe | None = None, reserved_usd_per_s: float = 0.0, instance_usd_per_s: float = 0.0):
        """`cluster`: the run's Ray, which outlives this backend (`close` ends the workers, not Ray).
        `reserved_usd_per_s`, `instance_usd_per_s`: the prices the offload objective weighs
        instances with (`cost.*`; 0: no price, no cap from it)."""
        self.cfg = cfg
        self.histopipe = histopipe
        # HistoSpec: the run's history lives here; each worker gets a prompt's share with its requests
        self.history = HistoryStore(spec.histospec.history_max_tokens) if spec.histospec is not None else None
        self._to_remember: list[Group] = []
        self.manager = RolloutManager(cfg, cluster.cfg.weights)
        self.fleet = Fleet(cfg, spec, self.manager, cluster)
        try:
            self.fleet.publish(weights, version)
            self.fleet.start(RESERVED, cfg.num_reserved)
            if cfg.provider == "fixed":  # a known pool: have it ready for the first step
                self.fleet.start(PREEMPTIBLE, cfg.num_preemptible)
            self.fleet.wait_ready()
        except BaseException:
            self.fleet.shutdown()
            raise
        self.controller = OffloadController(cfg.offload, cfg.seed_window_s, cfg.num_reserved,
                                            reserved_usd_per_s=reserved_usd_per_s,
                                            instance_usd_per_s=instance_usd_per_s)
        self.provider = make_provider(cfg, self.fleet, seed).start()
        self.run: StepRun | None = None
        self.last_pulls = PullStats()
        """What the weight pulls did during the last step (provisioning times, failures, refusals)."""
        self.released_at: float | None = None  # when the last step's trainer got the reserved resources
        self.training = False  # whether the step under way trains (an evaluation does not)
        self.instances_at_start = 0
        self.step_started = time.monotonic()
        self.seed_window_s = cfg.seed_window_s

    def generate(self, groups: list[Group], params: SamplingParams, version: int, training: bool) -> Iterator[Group]:
        """`training`: run the seeding window (a training step); otherwise every worker generates to
        the end (evaluation)."""
        self.instances_at_start = self._instances()
        self.step_started = time.monotonic()
        self.training = training
        self.fleet.reap()
        order = overruns = None
        if training:
            self.seed_window_s = self.controller.seed_for(self.instances_at_start)
            if self.histopipe is not None:
                order = dispatch_order(self.histopipe, groups, version)
                overruns = overrun_check(self.histopipe, groups)
            self._to_remember = groups
        history = self.history.responses if self.history is not None else None
        self.run = self.manager.start_step(groups, params, version, self.seed_window_s if training else None,
                                           order, overruns, history,
                                           self.controller.outlook() if training else None)
        self.released_at = None
        return self._released(self.run)

    def _released(self, run: StepRun) -> Iterator[Group]:
        """The run's groups, noting when the trainer got the reserved resources (the seeding window
        is not training time)."""
        run.training_may_start.wait()
        self.released_at = time.monotonic()
        yield from run.groups()

    def publish(self, weights, version: int) -> None:
        """Put the new version in the weight store; reserved workers load it now, the others pull it."""
        self.fleet.publish(weights, version)
        # between steps, off the rollout's critical path: this step's responses are the next epoch's history
        if self.histopipe is not None:
            record_lengths(self.histopipe, self._to_remember)
        if self.history is not None:
            for group in self._to_remember:
                self.history.update(group.samples[0].prompt_ids, [s.response_ids for s in group.samples])
        self._to_remember = []

    def step_metrics(self, train_s: float) -> dict[str, float]:
        """spot/*, migration/*, weights/*, the controller's timings and decisions, for the last step.
        `train_s`: the trainer's time from the return of `generate` to its last update, the seeding
        window and waits for groups included (both are taken out of the controller's t_train)."""
        run = self.run
        run.wait()  # the trainer may have stopped reading right after the last group
        stats, now = run.stats, time.monotonic()
        self.last_pulls = pulls = self.manager.pulls.take_stats()
        between, self.manager.deaths_between_steps = self.manager.deaths_between_steps, []
        remote_s, wait_remote = run.state.remote_timings(end=now)
        instances_now = self._instances()
        window_s = (self.released_at or now) - self.step_started
        compute_s = max(0.0, train_s - window_s - run.trainer_wait_s)
        preemptions = stats.preemptions + sum(preempted for _, _, preempted in between)
        instance_s = self.fleet.instance_seconds(self.step_started, now)
        timings = StepTimings(
            instances=self.instances_at_start, stable=instances_now == self.instances_at_start and preemptions == 0,
            wait_train_s=run.trainer_wait_s, wait_remote_s=wait_remote, remote_s=remote_s, train_s=compute_s,
            tokens_per_s=sum(stats.tokens_by_kind.values()) / max(now - self.step_started, 1e-9),
            samples=len(run.state.tracked), preemptions=preemptions, instance_s=instance_s,
            provision_s=sum(pulls.provision_s) / len(pulls.provision_s) if pulls.provision_s else float("nan"),
            **stats.offload_measurements())
        self.controller.update(timings)
        cap = self.controller.instance_cap()
        self.provider.set_cap(cap)
        kinds_total = sum(stats.tokens_by_kind.values()) or 1
        pulled = [s for _, s, _ in pulls.pulls]
        decided = {"spot/cap": float(cap)} if cap is not None else {}
        return decided | {
            "spot/instances": float(self.instances_at_start),
            "spot/instances_end": float(instances_now),
            "spot/preemptions": float(preemptions),
            "spot/joins": float(len(pulls.provision_s)),
            "spot/instance_s": instance_s,
            "spot/handoff_deferred": float(stats.handoff_deferred),
            "spot/preemption_rate": self.controller.preemption_rate(),
            "spot/refused": float(len(pulls.refused)),
            "migration/samples": float(sum(stats.migrated.values())),
            "migration/preempted": float(stats.migrated["preempted"]),
            "migration/rebalanced": float(stats.migrated["rebalanced"]),
            "migration/seed_handoff": float(stats.migrated["seed_handoff"]),
            "migration/noticed": float(stats.migrated["noticed"]),
            "migration/released": float(stats.migrated["released"]),
            "migration/wasted_tokens": float(stats.wasted_tokens),
            "migration/in_flight_at_preemption": float(stats.in_flight_at_preemption),
            "migration/fenced_tokens_dropped": float(stats.fenced_tokens_dropped),
            "weights/pull_s": float(np.mean(pulled)) if pulled else 0.0,
            "weights/provision_s": float(np.mean(pulls.provision_s)) if pulls.provision_s else 0.0,
            "weights/bytes": float(self.fleet.manifest.nbytes),
            "weights/pull_failures": float(pulls.pull_failures),
            "rollout/preemptible_token_share": stats.tokens_by_kind[PREEMPTIBLE] / kinds_total,
            "rollout/seed_window_s": self.seed_window_s,
            "rollout/reserved_tokens_per_s": self._reserved_decode_rate(),
            "rollout/manager_cpu_s": run.loop_cpu_s,
            "timing_s/gen": stats.rollout_s,
            "timing_s/seed": stats.seed_s,
            "timing_s/wait_train": run.trainer_wait_s,
            "timing_s/wait_remote": wait_remote,
            "timing_s/update_actor": compute_s,
            "rollout/tail_s": stats.tail_s,
        } | ({"histopipe/overruns_moved": float(stats.overruns_moved),
              "histopipe/history_prompts": float(len(self.histopipe.history))} if self.histopipe is not None else {}) \
          | (spec_metrics(self._spec_stats(), len(self.history)) if self.history is not None else {})

    def live(self) -> RolloutProgress | None:
        """The step's rollout now, read from another thread: counters and snapshots only."""
        run = self.run
        if run is None:
            return None
        state = run.state
        lifecycles = [h.lifecycle for h in self.manager.alive(PREEMPTIBLE)]
        serving = sum(lc is Lifecycle.SERVING for lc in lifecycles)
        pulling = sum(lc in (Lifecycle.JOINING, Lifecycle.PULLING) for lc in lifecycles)
        phase = "done" if state.done else "generating" if not self.training else \
            "seeding" if state.seeding else "offloaded"
        return RolloutProgress(phase, state.num_finished, len(state.tracked),
                               sum(list(state.stats.tokens_by_kind.values())), time.monotonic() - run.t0,
                               state.stats.wasted_tokens, (serving, pulling, self.fleet.starting))

    def _instances(self) -> int:
        """n of the controller: instances admitted or booting, the units of the cap the provider
        enforces (a step that starts while its instances boot must not read as n = 0)."""
        return len(self.manager.alive(PREEMPTIBLE)) + self.fleet.starting

    def _spec_stats(self):
        """The live workers' speculation counters since the last step; a worker that does not answer
        in time (dying, or stuck) is left out rather than waited for."""
        refs = [h.actor.spec_stats.remote() for h in self.manager.alive()]
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
        return sum(h.profile.best() or 0.0 for h in self.manager.alive(RESERVED))

    def state_dict(self) -> dict:
        state = {"offload": self.controller.state_dict()}
        if self.history is not None:
            state["history"] = self.history.state_dict()
        if self.histopipe is not None:
            state["histopipe"] = self.histopipe.state_dict()
        return state

    def load_state_dict(self, state: dict) -> None:
        if "offload" in state:
            self.controller.load_state_dict(state["offload"])
        if self.histopipe is not None and "histopipe" in state:
            self.histopipe.load_state_dict(state["histopipe"])
        if self.history is not None and "history" in state:
            self.history.load_state_dict(state["history"])

    def close(self) -> None:
        self.provider.stop()
        if self.run is not None:
            self.run.cancel()
        self.fleet.shutdown()
