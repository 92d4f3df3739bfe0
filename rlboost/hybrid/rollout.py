"""Rollout backend of `rollout.mode=hybrid`: reserved and preemptible workers on Ray, one manager.

The trainer consumes groups while rollout goes on: `generate` returns the manager's stream of
finished groups, released once the seeding window has handed the step to the preemptible workers.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import numpy as np
import ray

from rlboost.engine import SamplingParams
from rlboost.hybrid.config import HybridConfig
from rlboost.hybrid.fleet import Fleet, Preempter
from rlboost.hybrid.manager import PREEMPTIBLE, RESERVED, RolloutManager, StepRun
from rlboost.hybrid.worker import WorkerSpec
from rlboost.rollout.sample import Group


class HybridRollout:
    def __init__(self, cfg: HybridConfig, spec: WorkerSpec, weights, version: int, seed: int):
        self.cfg = cfg
        self.manager = RolloutManager(cfg)
        self.fleet = Fleet(cfg, spec, self.manager)
        try:
            ref = ray.put(cpu(weights))
            self.fleet.start(RESERVED, cfg.num_reserved, ref, version)
            self.fleet.start(PREEMPTIBLE, cfg.num_preemptible, ref, version)
        except BaseException:
            self.fleet.shutdown()
            raise
        self.preempter = Preempter(self.fleet, cfg.preempt_every_s, seed).start()
        self.run: StepRun | None = None
        self.instances_at_start = 0
        self.joins = 0

    def generate(self, groups: list[Group], params: SamplingParams, version: int, training: bool) -> Iterator[Group]:
        """`training`: run the seeding window (a training step); otherwise every worker generates to
        the end (evaluation)."""
        self.instances_at_start = len(self.manager.alive(PREEMPTIBLE))
        self.run = self.manager.start_step(groups, params, version, self.cfg.seed_window_s if training else None)
        return self.run.groups()

    def publish(self, weights, version: int) -> None:
        """Every live worker loads the new version; killed instances are replaced by new ones at it
        (`rollout.hybrid.respawn`)."""
        ref = ray.put(cpu(weights))
        self.manager.load_weights(ref, version)
        self.joins = self.fleet.replenish(ref, version) if self.cfg.respawn else 0

    def step_metrics(self) -> dict[str, float]:
        """spot/*, migration/* and the timings the offload controller reads, for the last step."""
        stats, now = self.run.stats, time.monotonic()
        kinds_total = sum(stats.tokens_by_kind.values()) or 1
        return {
            "spot/instances": float(self.instances_at_start),
            "spot/preemptions": float(stats.preemptions),
            "spot/joins": float(self.joins),  # instances that joined before this step
            "migration/samples": float(sum(stats.migrated.values())),
            "migration/preempted": float(stats.migrated["preempted"]),
            "migration/rebalanced": float(stats.migrated["rebalanced"]),
            "migration/seed_handoff": float(stats.migrated["seed_handoff"]),
            "migration/wasted_tokens": float(stats.wasted_tokens),
            "migration/in_flight_at_preemption": float(stats.in_flight_at_preemption),
            "migration/fenced_tokens_dropped": float(stats.fenced_tokens_dropped),
            "rollout/preemptible_token_share": stats.tokens_by_kind[PREEMPTIBLE] / kinds_total,
            "timing_s/gen": stats.rollout_s,
            "timing_s/seed": stats.seed_s,
            "timing_s/wait_train": self.run.trainer_wait_s,
            "timing_s/wait_remote": float(np.mean([now - t for t in stats.last_finish.values()]))
            if stats.last_finish else 0.0,
        }

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass

    def close(self) -> None:
        self.preempter.stop()
        if self.run is not None:
            self.run.cancel()
        self.fleet.shutdown()


def cpu(weights: dict) -> dict:
    return {name: t.detach().cpu() for name, t in weights.items()}
