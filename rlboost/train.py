"""`rlboost train`: GRPO from config to run folder, report included.

`rlboost.assembly.setup` checks every input and builds the run's parts before the first step; this
module is the loop over them. Each step: take a batch of prompts; start generating `rollout.n`
responses each; train on the groups as they complete, scoring each on arrival; publish the new
weights to the rollout workers; evaluate and checkpoint on schedule; log.
`rollout.mode` picks the backend: `colocated` generates the whole step before training starts,
`hybrid` streams groups from reserved and preemptible workers while the trainer consumes them.

Weight versions: the weights after k optimizer updates of the run are version k, so step k (1-based)
generates with version k - 1 and leaves the workers at version k. With `algorithm.max_staleness` m > 0
(hybrid) the step hands the rollout its successor's batch, which the instances start once this step's
rollout is over: step k then also trains on tokens of versions k - 1 - m .. k - 2 (docs/staleness.md).
"""

from __future__ import annotations

import dataclasses
import logging
import sys
import threading
import time
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path

import numpy as np
from rich.console import Console

from rlboost.assembly import RunParts, setup, trainer_weights
from rlboost.checkpoint import save_checkpoint
from rlboost.checks import validate
from rlboost.config import RLBoostConfig
from rlboost.engine import SamplingParams
from rlboost.rewards import RewardScorer, ScoreRequest
from rlboost.rollout import Group, new_groups
from rlboost.run_dir import run_folder
from rlboost.run_log import run_log
from rlboost.spot import CostMeter
from rlboost.stopping import StopOnSignal, end_now
from rlboost.tracking import MetricsTracker

RUN_LOG = "run.log"


def train(cfg: RLBoostConfig, config_path: str | Path | None = None, console: Console | None = None,
          resume_hint: Callable[[], str] | None = None) -> Path:
    """Run GRPO as configured; returns the run folder. Its log (`run.log`) gets every message, Ray's
    included; `console` gets one line per event (an instance preempted, joined) and the progress.
    Inside the main thread the first SIGINT / SIGTERM stops the run at a safe point: StopRequested
    is raised once the rollout is aborted and Ray is shut down; the checkpoints on disk are whole.
    If the run's Ray head dies under it, the run ends at once with status 2 and one error line naming
    the cause (`resume_hint()` appended: how to resume), every process it started ended."""
    run_dir = run_folder(cfg.run, config_path)

    def head_lost(cause: str) -> None:  # from the cluster's watch thread: no Ray call can be trusted now
        hint = f"; {resume_hint()}" if resume_hint is not None else ""
        logging.getLogger("rlboost").error("error: the run's Ray head was lost: %s; every process of the run "
                                           "was ended%s", cause, hint)
        sys.stdout.flush()
        end_now(2)

    validate(cfg)  # before the run folder and its log exist: a bad input leaves nothing behind
    with run_log(run_dir / RUN_LOG, console), StopOnSignal() as stop:
        # the run's Ray keeps these signal handlers (`rlboost.cluster.ray_cluster.signals_kept`)
        run = Run(**vars(setup(cfg, config_path, run_dir, on_head_lost=head_lost, checked=True)))
        try:
            train_loop(cfg, run, stop)
        finally:
            run.close()
    return run.dir  # the tracker wrote the report (tracking.report) when it closed


def train_loop(cfg: RLBoostConfig, run: Run, stop: StopOnSignal | None = None) -> None:
    stop = stop or StopOnSignal()  # not entered: no handlers, its held() sections are plain blocks
    with MetricsTracker(run.dir, cfg.tracking, total_steps=cfg.run.total_steps, start_step=run.start_step,
                        run_name=run.dir.name) as tracker, showing_status(run, tracker):
        if run.start_step == 0 and cfg.run.val_before_train and run.val_set.rows:
            tracker.log(0, run.evaluate())
        for step in range(run.start_step + 1, cfg.run.total_steps + 1):
            t0 = time.perf_counter()
            metrics = run.rl_step(step)
            if run.val_set.rows and due(step, cfg.run.test_freq, cfg.run.total_steps):
                with timed(metrics, "testing"):
                    metrics |= run.evaluate()
            metrics["timing_s/step"] = time.perf_counter() - t0
            metrics["perf/throughput"] = metrics["perf/total_num_tokens"] / metrics["timing_s/step"]
            metrics |= cost_metrics(run.cost, metrics)
            with stop.held():  # a step's metrics and its checkpoint are written whole or not at all
                tracker.log(step, metrics)
                if due(step, cfg.run.save_freq, cfg.run.total_steps):
                    run.phase = "saving a checkpoint"
                    run.save(step)


@dataclasses.dataclass
class Run(RunParts):
    """A run's parts (`rlboost.assembly.RunParts`) and what the loop does with them."""

    step: int = 0
    """The step under way (0: the evaluation before the first)."""
    phase: str = "starting"
    """What the loop is doing: rollout, training, publishing weights, testing, saving a checkpoint."""
    ess_collapsed: bool = False
    """Whether the console was told the behaviour weights' effective sample size collapsed (once a run)."""
    prefetched: tuple[int, list[Group], dict] | None = None
    """(step, its groups, the prompt loader's state before they were taken) of a batch the rollout
    started ahead of its trainer (algorithm.max_staleness > 0); a checkpoint keeps the state before."""

    def status(self) -> str:
        """One line on what the step under way is doing now, for the console (any thread)."""
        live = self.rollout.live()
        rollout = live.describe() if live is not None and live.phase != "done" else ""
        # while the rollout streams, its own phase says what the trainer does (seeding: waits; offloaded:
        # trains on the groups as they come)
        phase = "" if rollout and self.phase in ("rollout", "training") else self.phase
        return f"step {self.step}: " + " · ".join(part for part in (phase, rollout) if part)

    def rl_step(self, step: int) -> dict[str, float]:
        """One RL step; returns its metrics (veRL's names, plus spot/* and migration/* in hybrid mode)."""
        cfg = self.cfg
        self.step, self.phase = step, "rollout"
        metrics: dict[str, float] = {"timing_s/reward": 0.0}
        groups = self.batch(step)
        finished: list[Group] = []

        def scored(stream):
            for group in stream:
                with timed(metrics, "reward"):
                    score([group], self.scorer, self.tokenizer)
                check_on_policy([group], version=step - 1, max_staleness=cfg.algorithm.max_staleness)
                finished.append(group)
                yield group

        ahead = self.prefetcher(step + 1) if self.may_run_ahead(step) else None
        stream = self.rollout.generate(groups, self.sampling(cfg.rollout.temperature), step - 1, training=True,
                                       next_batch=ahead)
        t1 = time.perf_counter()
        self.phase = "training"
        metrics |= self.trainer.train_step(scored(stream), len(groups), step=step)
        # the backend knows what of this was generation and what training (hybrid: the seeding window,
        # waits for groups)
        metrics |= self.rollout.finish_step(time.perf_counter() - t1 - metrics["timing_s/reward"])
        self.phase = "publishing weights"
        with timed(metrics, "update_weights"):
            self.rollout.publish(trainer_weights(self.trainer, self.cfg, step), version=step)
        self.version = step
        metrics |= rollout_metrics(finished, version=step - 1)
        self.watch_ess(step, metrics.get("actor/ess", 1.0))
        metrics |= self.scorer.pop_metrics()
        metrics["training/global_step"] = float(step)
        metrics["training/epoch"] = float(self.loader_state()["epoch"])
        return metrics

    def batch(self, step: int) -> list[Group]:
        """The step's groups: taken ahead by the rollout, or now from the prompt loader."""
        if self.prefetched is not None and self.prefetched[0] == step:
            groups, self.prefetched = self.prefetched[1], None
            return groups
        return self._take(step)

    def may_run_ahead(self, step: int) -> bool:
        """Whether the rollout may start step + 1's batch during this step (algorithm.max_staleness > 0):
        not past the last step, and not before an evaluation, which needs every worker."""
        run = self.cfg.run
        return (self.cfg.algorithm.max_staleness > 0 and step < run.total_steps
                and not (self.val_set.rows and due(step, run.test_freq, run.total_steps)))

    def prefetcher(self, step: int):
        """What hands the rollout `step`'s batch, when it asks (from its own thread)."""
        def take() -> list[Group]:
            state = self.loader.state_dict()
            groups = self._take(step)
            self.prefetched = (step, groups, state)
            return groups

        return take

    def _take(self, step: int) -> list[Group]:
        """`step`'s groups from the prompt loader's next batch."""
        rows = [(i, self.train_set.ids[i], row) for i, row in self.loader.next_batch()]
        return new_groups(step, rows, self.cfg.rollout.n, self.cfg.run.seed)

    def loader_state(self) -> dict:
        """The prompt loader's state as of the steps trained: a batch taken ahead is not among them."""
        return self.prefetched[2] if self.prefetched is not None else self.loader.state_dict()

    def watch_ess(self, step: int, ess: float) -> None:
        """One console line the first time the step's effective sample size falls under ESS_COLLAPSE."""
        if ess < ESS_COLLAPSE and not self.ess_collapsed:
            self.ess_collapsed = True
            logging.getLogger(__name__).warning(
                "step %d: the effective sample size of the behaviour weights collapsed to %.2f (under %.2f): the "
                "policy trained has moved far from the one that sampled its tokens; runs that go on so tend to "
                "diverge (actor/ess, actor/behav_weight_max)", step, ess, ESS_COLLAPSE)

    def evaluate(self) -> dict[str, float]:
        """Mean score of `rollout.val_n` responses per held-out prompt (veRL's `val/score/mean`)."""
        self.phase = "testing"
        prompts = [(i, ids, row) for i, (ids, row) in enumerate(zip(self.val_set.ids, self.val_set.rows))]
        groups = new_groups(-1, prompts, self.cfg.rollout.val_n, self.cfg.run.seed)
        params = self.sampling(self.cfg.rollout.val_temperature)
        done = list(self.rollout.generate(groups, params, self.version, training=False))
        score(done, self.scorer, self.tokenizer)  # all at once: the reward workers share them out
        by_source: dict[str, list[float]] = {}
        for group in done:
            by_source.setdefault(group.data_source, []).extend(s.reward for s in group.samples)
        samples = [s for g in done for s in g.samples]
        metrics = {"val/score/mean": float(np.mean([s.reward for s in samples])),
                   "val/response_length/mean": float(np.mean([len(s.response_ids) for s in samples]))}
        if len(by_source) > 1:
            metrics |= {f"val/{src}/score/mean": float(np.mean(r)) for src, r in by_source.items()}
        return metrics

    def save(self, step: int) -> None:
        save_checkpoint(self.dir, step, self.trainer, self.tokenizer,
                        {"data": self.loader_state(), "cost": self.cost.state_dict()},
                        rollout_state=self.rollout.state_dict())

    def sampling(self, temperature: float) -> SamplingParams:
        r = self.cfg.rollout
        return SamplingParams(temperature=temperature, top_p=r.top_p, top_k=r.top_k,
                              max_tokens=self.cfg.data.max_response_length)


def check_on_policy(groups: list[Group], version: int, max_staleness: int = 0) -> None:
    """Invariant 1: every token trained on at step k came from the weights of version k - 1 (`version`),
    or with `max_staleness` m from one of versions k - 1 - m .. k - 1. A violation is a bug upstream,
    never something to train through."""
    for g in groups:
        for s in g.samples:
            stale = sorted(v for v in set(s.versions) if not version - max_staleness <= v <= version)
            if stale or len(s.versions) != len(s.response_ids):
                bound = f" (algorithm.max_staleness={max_staleness})" if max_staleness else ""
                raise RuntimeError(f"sample {s.uid} carries tokens of weight versions {stale or s.versions} "
                                   f"but this step's weights are version {version}{bound}")


def score(groups: list[Group], scorer: RewardScorer, tokenizer) -> None:
    """Set every sample's reward, scored in the reward workers (`rlboost.rewards`)."""
    samples = [(g, s) for g in groups for s in g.samples]
    rewards = scorer.score([
        ScoreRequest(f"sample {s.uid} (step:prompt:sample, training row {g.row_index})", g.data_source,
                     tokenizer.decode(s.response_ids, skip_special_tokens=True), g.ground_truth, g.extra_info)
        for g, s in samples])
    for (_, s), reward in zip(samples, rewards):
        s.reward = reward


ESS_COLLAPSE = 0.3
"""`actor/ess` under this is a collapse worth a console line: a third of the tokens carry the step's
gradient (VCPO, arXiv 2602.17616, reads a collapsing ESS as the sign of a diverging off-policy run)."""


def rollout_metrics(groups: list[Group], version: int) -> dict[str, float]:
    """The step's rollout, as veRL names it, and how stale its tokens are: `staleness/*` counts, per
    token, the versions between the one that made it and `version`, the one the step trains from."""
    samples = [s for g in groups for s in g.samples]
    staleness = np.array([version - v for s in samples for v in s.versions], dtype=float)
    scores = np.array([s.reward for s in samples], dtype=float)
    lengths = np.array([len(s.response_ids) for s in samples], dtype=float)
    prompt_lengths = np.array([len(s.prompt_ids) for s in samples], dtype=float)
    return {
        "critic/score/mean": scores.mean(), "critic/score/max": scores.max(), "critic/score/min": scores.min(),
        "critic/rewards/mean": scores.mean(),
        "response_length/mean": lengths.mean(), "response_length/max": lengths.max(),
        "response_length/min": lengths.min(),
        "response_length/clip_ratio": float(np.mean([s.finish_reason == "length" for s in samples])),
        "prompt_length/mean": prompt_lengths.mean(),
        "perf/total_num_tokens": float(lengths.sum() + prompt_lengths.sum()),
        "perf/response_tokens": float(lengths.sum()),
        "staleness/mean": staleness.mean() if staleness.size else 0.0,
        "staleness/max": staleness.max() if staleness.size else 0.0,
    }


def cost_metrics(meter: CostMeter, metrics: dict[str, float]) -> dict[str, float]:
    """cost/* of a step, per generated token: the reserved nodes for its wall time plus the instances
    it held. In hybrid mode also an estimate of what colocated rollout would have paid per token: the
    reserved workers generating every token at their best measured decode speed (no prefill, so the
    estimate flatters colocated), plus the same training time."""
    tokens = int(metrics["perf/response_tokens"])  # what rollout produced: the product being paid for
    out = meter.charge_step(metrics["timing_s/step"], metrics.get("spot/instance_s", 0.0), tokens)
    reserved_rate = metrics.get("rollout/reserved_tokens_per_s", 0.0)
    if reserved_rate > 0:
        colocated_s = tokens / reserved_rate + metrics["timing_s/update_actor"]
        out["cost/colocated_est_tokens_per_usd"] = tokens / meter.reserved_only_usd(colocated_s)
    return out


@contextmanager
def showing_status(run: Run, tracker: MetricsTracker, every_s: float = 0.5):
    """Keep the console's status line up to date from a thread of its own while the block runs."""
    stop = threading.Event()

    def refresh():
        while not stop.wait(every_s):
            try:
                tracker.status(run.status())
            except Exception:  # noqa: BLE001 - a status line is not worth a failed run
                logging.getLogger(__name__).debug("status line failed", exc_info=True)

    thread = threading.Thread(target=refresh, name="rlboost-status", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
        tracker.status("")


def due(step: int, freq: int, total: int) -> bool:
    return freq > 0 and (step % freq == 0 or step == total)


@contextmanager
def timed(metrics: dict[str, float], name: str):
    t0 = time.perf_counter()
    try:
        yield
    finally:
        key = f"timing_s/{name}"
        metrics[key] = metrics.get(key, 0.0) + time.perf_counter() - t0
