"""A finished hybrid step as a value: `StepReport`, and the metrics read from it.

`StepRun.finish()` builds the report once the trainer is done with the step; the offload loop
(`rlboost.policies.offload_loop`) and the run's metrics read only that. `step_metrics` is pure: the
spot/*, migration/*, weights/*, rollout/* and timing_s/* metrics of a step from its report, the
offload loop's view of it (`StepOutcome`) and what the loop decided.
"""

from __future__ import annotations

from dataclasses import dataclass

from rlboost.hybrid.pulls import PullStats
from rlboost.policies.offload_loop import StepOutcome
from rlboost.rollout.step_data import PREEMPTIBLE, StepStats


@dataclass(frozen=True)
class StepReport:
    stats: StepStats
    """What the step's StepState counted (migrations, waste, tokens by kind, its timings)."""
    samples: int
    response_tokens: int
    """Response tokens of the step's samples, each counted once."""
    t0: float
    """When the step started (monotonic seconds)."""
    released_s: float
    """From the start until the reserved resources were the trainer's: the seeding window as it ran."""
    trainer_wait_s: float
    """The trainer's idle time waiting for groups after it was given the reserved resources."""
    remote_s: float
    """t_remote: from the first work an instance got to the step's last response."""
    wait_remote_s: float
    """t_wait_remote: from the step's last response to the end of its training (0 without instances)."""
    loop_cpu_s: float
    """CPU seconds of the step's loop thread: the manager's own overhead."""
    relay_cpu_s: float
    """CPU seconds of the report relay's process in the step: reading the workers' streams for the manager."""
    reports: int
    """Worker reports the loop handled."""
    pulls: PullStats
    """What the weight pulls did since the last report (provisioning times, failures, refusals)."""
    deaths_between_steps: tuple[tuple[str, str, bool], ...]
    """(worker, reason, preempted) of the workers declared dead while no step ran, since the last report."""

    @property
    def preemptions(self) -> int:
        """Instances preempted during the step, and between steps since the last report."""
        return self.stats.preemptions + sum(preempted for _, _, preempted in self.deaths_between_steps)


def step_metrics(report: StepReport, outcome: StepOutcome, *, seed_window_s: float, cap: int | None,
                 preemption_rate: float, weight_bytes: int, reserved_tokens_per_s: float,
                 advised_cap: int | None = None) -> dict[str, float]:
    """A training step's metrics (veRL's timing_s/* names, plus spot/*, migration/*, weights/*, rollout/*).
    `cap`: the cap the provider holds to; `advised_cap`: the controller's when it is not enforced."""
    stats, pulls = report.stats, report.pulls
    tokens = sum(stats.tokens_by_kind.values()) or 1
    pulled = [seconds for _, seconds, _, _ in pulls.pulls]
    modes = [mode for *_, mode in pulls.pulls]
    caps = {"spot/cap": cap, "spot/cap_advised": advised_cap}
    return {name: float(value) for name, value in caps.items() if value is not None} | {
        "spot/instances": float(outcome.instances_start),
        "spot/instances_end": float(outcome.instances_end),
        "spot/preemptions": float(outcome.preemptions),
        "spot/joins": float(len(pulls.provision_s)),
        "spot/instance_s": outcome.instance_s,
        "spot/handoff_deferred": float(stats.handoff_deferred),
        "spot/preemption_rate": preemption_rate,
        "spot/refused": float(len(pulls.refused)),
        "migration/samples": float(sum(stats.migrated.values())),
        "migration/preempted": float(stats.migrated["preempted"]),
        "migration/rebalanced": float(stats.migrated["rebalanced"]),
        "migration/seed_handoff": float(stats.migrated["seed_handoff"]),
        "migration/noticed": float(stats.migrated["noticed"]),
        "migration/kept_through_notice": float(stats.kept_through_notice),
        "migration/released": float(stats.migrated["released"]),
        # bounded staleness: swaps of a new version between tokens, the reserved workers' share of a
        # batch started ahead, workers fenced for falling behind the bound, and the slots a batch started
        # ahead gave back to the step before it
        "migration/refreshed": float(stats.migrated["refreshed"]),
        "migration/seed_share": float(stats.migrated["seed_share"]),
        "migration/fenced": float(stats.migrated["fenced"]),
        "migration/yielded": float(stats.migrated["yielded"]),
        "migration/wasted_tokens": float(stats.wasted_tokens),
        "migration/in_flight_at_preemption": float(stats.in_flight_at_preemption),
        "migration/fenced_tokens_dropped": float(stats.fenced_tokens_dropped),
        "weights/pull_s": sum(pulled) / len(pulled) if pulled else 0.0,
        "weights/provision_s": sum(pulls.provision_s) / len(pulls.provision_s) if pulls.provision_s else 0.0,
        "weights/bytes": float(weight_bytes),
        "weights/pulled_bytes": float(sum(nbytes for _, _, nbytes, _ in pulls.pulls)),
        "weights/full_pulls": float(modes.count("full")),
        "weights/patch_pulls": float(modes.count("patch")),
        "weights/from_base_pulls": float(modes.count("from_base")),
        "weights/pull_failures": float(pulls.pull_failures),
        "rollout/preemptible_token_share": stats.tokens_by_kind[PREEMPTIBLE] / tokens,
        "rollout/seed_window_s": seed_window_s,
        "rollout/reserved_tokens_per_s": reserved_tokens_per_s,
        "rollout/manager_cpu_s": report.loop_cpu_s,
        "rollout/relay_cpu_s": report.relay_cpu_s,
        "rollout/tail_s": stats.tail_s,
        "timing_s/gen": stats.rollout_s,
        "timing_s/seed": stats.seed_s,
        "timing_s/wait_train": report.trainer_wait_s,
        "timing_s/wait_remote": report.wait_remote_s,
        "timing_s/update_actor": outcome.train_s,
    }


__all__ = ["StepReport", "step_metrics"]
