"""`rlboost train`: GRPO from config to run folder, report included.

Everything that can be wrong with the input (config, data, reward function, model path, prompt
lengths) is checked in `setup`, before the first step. Each step then: take a batch of prompts;
start generating `rollout.n` responses each; train on the groups as they complete, scoring each on
arrival; publish the new weights to the rollout workers; evaluate and checkpoint on schedule; log.
`rollout.mode` picks the backend: `colocated` generates the whole step before training starts,
`hybrid` streams groups from reserved and preemptible workers while the trainer consumes them.

Weight versions: the weights after k optimizer updates of the run are version k, so step k (1-based)
generates with version k - 1 and leaves the workers at version k.
"""

from __future__ import annotations

import dataclasses
import logging
import random
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch
from omegaconf import OmegaConf
from rich.console import Console

from rlboost.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from rlboost.config import ConfigError, RLBoostConfig
from rlboost.data import PromptLoader, PromptRow, check_prompt_lengths, load_datasets
from rlboost.engine import SamplingParams
from rlboost.engine.factory import make_engine
from rlboost.histospec import Drafter, HistoryStore
from rlboost.policies.histopipe import HistoPipe
from rlboost.models import load_model
from rlboost.rewards import RewardScorer, load_reward_fn
from rlboost.rollout import ColocatedRollout, Group, RolloutBackend, new_groups
from rlboost.run_dir import run_folder
from rlboost.run_log import run_log
from rlboost.stopping import StopOnSignal
from rlboost.spot import CostMeter
from rlboost.tracking import MetricsTracker
from rlboost.trainer import Trainer

if TYPE_CHECKING:
    from rlboost.trainer.ranks import TrainerGroup

RUN_LOG = "run.log"


def train(cfg: RLBoostConfig, config_path: str | Path | None = None, console: Console | None = None) -> Path:
    """Run GRPO as configured; returns the run folder. Its log (`run.log`) gets every message, Ray's
    included; `console` gets one line per event (an instance preempted, joined) and the progress.
    Inside the main thread the first SIGINT / SIGTERM stops the run at a safe point: StopRequested
    is raised once the rollout is aborted and Ray is shut down; the checkpoints on disk are whole."""
    run_dir = run_folder(cfg.run, config_path)
    with run_log(run_dir / RUN_LOG, console), StopOnSignal() as stop:
        run = setup(cfg, config_path, run_dir)
        stop.install()  # again: starting Ray replaced the SIGTERM handler
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
class Prompts:
    """A dataset's rows with their chat-templated token ids."""

    rows: list[PromptRow]
    ids: list[list[int]]


@dataclasses.dataclass
class Run:
    """A run's parts once built and, when resuming, restored."""

    cfg: RLBoostConfig
    dir: Path
    rollout: RolloutBackend
    trainer: Trainer | TrainerGroup
    loader: PromptLoader
    scorer: RewardScorer
    tokenizer: object
    train_set: Prompts
    val_set: Prompts
    start_step: int
    version: int
    """Weight version the rollout workers serve (= optimizer updates so far)."""
    cost: CostMeter
    step: int = 0
    """The step under way (0: the evaluation before the first)."""
    phase: str = "starting"
    """What the loop is doing: rollout, training, publishing weights, testing, saving a checkpoint."""
    owns_ray: bool = False
    """Whether this run started the Ray its trainer ranks use (colocated rollout at world_size > 1)."""

    def close(self) -> None:
        """Trainer ranks first (they live on the rollout's Ray in hybrid mode), then the rollout."""
        close_all(self.trainer, self.rollout, self.owns_ray)

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
        batch = [(i, self.train_set.ids[i], row) for i, row in self.loader.next_batch()]
        groups = new_groups(step, batch, cfg.rollout.n, cfg.run.seed)
        finished: list[Group] = []

        def scored(stream):
            for group in stream:
                with timed(metrics, "reward"):
                    score(group, self.scorer, self.tokenizer)
                check_on_policy([group], version=step - 1)
                finished.append(group)
                yield group

        t0 = time.perf_counter()
        stream = self.rollout.generate(groups, self.sampling(cfg.rollout.temperature), step - 1, training=True)
        t1 = time.perf_counter()
        self.phase = "training"
        metrics |= self.trainer.train_step(scored(stream), len(groups), step=step)
        train_s = time.perf_counter() - t1 - metrics["timing_s/reward"]
        metrics |= self.rollout.step_metrics(train_s)
        metrics.setdefault("timing_s/gen", t1 - t0)
        # the backend knows what of train_s was not training (hybrid: the seeding window, waits for groups)
        metrics.setdefault("timing_s/update_actor", train_s - metrics.get("timing_s/wait_train", 0.0))
        self.phase = "publishing weights"
        with timed(metrics, "update_weights"):
            self.rollout.publish(trainer_weights(self.trainer, self.cfg, step), version=step)
        self.version = step
        metrics |= rollout_metrics(finished)
        metrics["reward/errors"] = float(self.scorer.pop_num_errors())
        metrics["training/global_step"] = float(step)
        metrics["training/epoch"] = float(self.loader.epoch)
        return metrics

    def evaluate(self) -> dict[str, float]:
        """Mean score of `rollout.val_n` responses per held-out prompt (veRL's `val/score/mean`)."""
        self.phase = "testing"
        prompts = [(i, ids, row) for i, (ids, row) in enumerate(zip(self.val_set.ids, self.val_set.rows))]
        groups = new_groups(-1, prompts, self.cfg.rollout.val_n, self.cfg.run.seed)
        params = self.sampling(self.cfg.rollout.val_temperature)
        done = list(self.rollout.generate(groups, params, self.version, training=False))
        by_source: dict[str, list[float]] = {}
        for group in done:
            score(group, self.scorer, self.tokenizer)
            by_source.setdefault(group.data_source, []).extend(s.reward for s in group.samples)
        samples = [s for g in done for s in g.samples]
        metrics = {"val/score/mean": float(np.mean([s.reward for s in samples])),
                   "val/response_length/mean": float(np.mean([len(s.response_ids) for s in samples]))}
        if len(by_source) > 1:
            metrics |= {f"val/{src}/score/mean": float(np.mean(r)) for src, r in by_source.items()}
        return metrics

    def save(self, step: int) -> None:
        save_checkpoint(self.dir, step, self.trainer, self.tokenizer,
                        {"data": self.loader.state_dict(), "cost": self.cost.state_dict()},
                        rollout_state=self.rollout.state_dict())

    def sampling(self, temperature: float) -> SamplingParams:
        r = self.cfg.rollout
        return SamplingParams(temperature=temperature, top_p=r.top_p, top_k=r.top_k,
                              max_tokens=self.cfg.data.max_response_length)


def setup(cfg: RLBoostConfig, config_path: str | Path | None, run_dir: Path | None = None) -> Run:
    """Check every input, build engine and trainer, and restore the latest checkpoint if resuming.
    `run_dir`: the run folder (default: where `run` config puts it)."""
    validate(cfg)
    scorer = RewardScorer(load_reward_fn(cfg.reward), cfg.reward.on_error)
    train_rows, val_rows = load_datasets(cfg.data)
    policy = load_model(cfg.model)
    if policy.tokenizer is None:
        raise ConfigError(f"model.path={cfg.model.path!r} has no tokenizer; training needs text in and out")
    train_set = encode(policy.tokenizer, train_rows, cfg.data.max_prompt_length)
    val_set = encode(policy.tokenizer, val_rows, cfg.data.max_prompt_length)

    seed_everything(cfg.run.seed)
    check_context(cfg, cfg.engine.max_model_len or policy.model.config.max_position_embeddings)
    pad_token_id = policy.tokenizer.pad_token_id or 0
    total_optimizer_steps = cfg.run.total_steps * optimizer_steps_per_step(cfg)
    loader = PromptLoader(train_set.rows, cfg.data.train_batch_size, seed=cfg.data.seed, shuffle=cfg.data.shuffle)
    run_dir = run_dir or run_folder(cfg.run, config_path)
    if cfg.trainer.world_size > 1:
        trainer, rollout, restored, owns_ray = sharded_setup(cfg, run_dir, policy, loader, pad_token_id,
                                                             total_optimizer_steps)
    else:
        ref = load_model(cfg.model).model if cfg.trainer.kl_coef > 0 else None
        trainer = Trainer(policy.model, cfg.trainer, temperature=cfg.rollout.temperature,
                          max_response_length=cfg.data.max_response_length,
                          total_optimizer_steps=total_optimizer_steps, pad_token_id=pad_token_id, ref_model=ref)
        restored = resume(cfg, run_dir, trainer, loader)
        rollout, owns_ray = None, False
    start_step = int(restored.get("global_step", 0))
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(OmegaConf.to_yaml(OmegaConf.structured(cfg)))
    try:
        if rollout is None:
            rollout = make_rollout(cfg, policy.eos_token_ids, trainer_weights(trainer, cfg, start_step), start_step)
        rollout.load_state_dict(restored.get("rollout", {}))
    except BaseException:
        close_all(trainer, rollout, owns_ray)
        raise
    cost = CostMeter(cfg.cost)
    if "cost" in restored:
        cost.load_state_dict(restored["cost"])
    return Run(cfg, run_dir, rollout, trainer, loader, scorer, policy.tokenizer, train_set, val_set, start_step,
               version=start_step, cost=cost, owns_ray=owns_ray)


def sharded_setup(cfg: RLBoostConfig, run_dir: Path, policy, loader: PromptLoader, pad_token_id: int,
                  total_optimizer_steps: int):
    """`trainer.world_size` > 1: the trainer ranks on Ray, restored if resuming, and the rollout.
    Hybrid rollout starts the run's Ray itself, so it comes first, serving the weights as loaded, and
    is given the restored version after a resume. Returns (trainer, rollout or None, restored state,
    whether this run started Ray for the ranks)."""
    import ray

    from rlboost.trainer.ranks import TrainerGroup

    rollout, owns_ray, trainer = None, False, None
    try:
        if cfg.rollout.mode == "hybrid":
            weights = {name: p.detach() for name, p in policy.model.named_parameters()}
            rollout = make_rollout(cfg, policy.eos_token_ids, weights, 0)
            del weights
        elif not ray.is_initialized():
            start_trainer_ray(cfg)
            owns_ray = True
        try:
            trainer = TrainerGroup(cfg.trainer, cfg.model, temperature=cfg.rollout.temperature,
                                   max_response_length=cfg.data.max_response_length,
                                   total_optimizer_steps=total_optimizer_steps, pad_token_id=pad_token_id,
                                   ref_model=cfg.model if cfg.trainer.kl_coef > 0 else None)
        except ValueError as e:  # a world size the cluster cannot place
            raise ConfigError(str(e)) from e
        restored = resume(cfg, run_dir, trainer, loader)
        start_step = int(restored.get("global_step", 0))
        if rollout is not None and start_step:
            rollout.publish(trainer_weights(trainer, cfg, start_step), version=start_step)
        return trainer, rollout, restored, owns_ray
    except BaseException:
        close_all(trainer, rollout, owns_ray)
        raise


def start_trainer_ray(cfg: RLBoostConfig) -> None:
    """The Ray of a colocated run's trainer ranks: the cluster at `rollout.hybrid.ray_address`, or a
    local one secured like a hybrid run's (`rollout.hybrid.ray`), all of it reserved."""
    import os

    import ray

    from rlboost.hybrid.ray_setup import route_ray_messages, start_local_ray
    from rlboost.rollout.step_data import RESERVED

    h = cfg.rollout.hybrid
    if h.ray_address:
        route_ray_messages()
        ray.init(address=h.ray_address, logging_level="ERROR", log_to_driver=False)
    else:
        start_local_ray(h.ray, {RESERVED: 10_000}, os.cpu_count() or 1)


def trainer_weights(trainer: Trainer | TrainerGroup, cfg: RLBoostConfig, version: int):
    """What the rollout backend loads as `version`: the state dict at world size 1. From trainer ranks,
    the version published from their shards into the weight store: its manifest for hybrid rollout
    (the workers pull it), the pulled tensors for the colocated engine in this process."""
    if isinstance(trainer, Trainer):
        return trainer.weights()
    from rlboost.hybrid.weights import pull

    h = cfg.rollout.hybrid
    manifest = trainer.publish(version, h.weights.bucket_mb)
    if cfg.rollout.mode == "hybrid":
        return manifest
    return pull(manifest, manifest.fingerprint, h.weights.pull_timeout_s)


def close_all(trainer, rollout, owns_ray: bool) -> None:
    if trainer is not None and not isinstance(trainer, Trainer):
        trainer.close()
    if rollout is not None:
        rollout.close()
    if owns_ray:
        import ray

        ray.shutdown()


def make_rollout(cfg: RLBoostConfig, eos_token_ids: list[int], weights, version: int):
    """The rollout backend of `rollout.mode`, serving exactly the trainer's weights at `version`."""
    histopipe = HistoPipe(cfg.rollout.histopipe) if cfg.rollout.histopipe.enabled else None
    if cfg.rollout.mode == "hybrid":
        from rlboost.hybrid.rollout import HybridRollout  # Ray is imported only when used
        from rlboost.hybrid.worker import WorkerSpec

        h = cfg.rollout.hybrid
        histospec = cfg.rollout.histospec if cfg.rollout.histospec.enabled else None
        spec = WorkerSpec(cfg.model, cfg.engine, list(eos_token_ids), h.worker_threads, h.heartbeat_interval_s,
                          histospec)
        return HybridRollout(h, spec, weights, version, seed=cfg.run.seed, histopipe=histopipe,
                             reserved_usd_per_s=cfg.cost.reserved_usd_per_s(),
                             instance_usd_per_s=cfg.cost.instance_usd_per_s())
    engine = make_engine(cfg.model, cfg.engine, eos_token_ids, weights=weights, version=version)
    history = None
    if cfg.rollout.histospec.enabled:
        history = HistoryStore(cfg.rollout.histospec.history_max_tokens)
        engine.drafter = Drafter(history, cfg.rollout.histospec)
    return ColocatedRollout(engine, history, histopipe)


def check_on_policy(groups: list[Group], version: int) -> None:
    """Invariant 1: every token trained on at step k came from the weights of version k - 1. A
    violation is a bug upstream, never something to train through."""
    for g in groups:
        for s in g.samples:
            stale = sorted(set(s.versions) - {version})
            if stale or len(s.versions) != len(s.response_ids):
                raise RuntimeError(f"sample {s.uid} carries tokens of weight versions {stale or s.versions} "
                                   f"but this step's weights are version {version}")


def score(group: Group, scorer: RewardScorer, tokenizer) -> None:
    for s in group.samples:
        text = tokenizer.decode(s.response_ids, skip_special_tokens=True)
        s.reward = scorer.score(f"sample {s.uid} (step:prompt:sample, training row {group.row_index})",
                                group.data_source, text, group.ground_truth, group.extra_info)


def rollout_metrics(groups: list[Group]) -> dict[str, float]:
    samples = [s for g in groups for s in g.samples]
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
    }


def encode(tokenizer, rows: list[PromptRow], max_prompt_length: int) -> Prompts:
    """Chat-template every row; a prompt over `data.max_prompt_length` is an error naming its row."""
    ids = [list(tokenizer.apply_chat_template(row.prompt, add_generation_prompt=True, tokenize=True,
                                              return_dict=True)["input_ids"]) for row in rows]
    length = {id(row): len(tokens) for row, tokens in zip(rows, ids)}
    check_prompt_lengths(rows, lambda row: length[id(row)], max_prompt_length)
    return Prompts(rows, ids)


def check_context(cfg: RLBoostConfig, max_model_len: int) -> None:
    need = cfg.data.max_prompt_length + cfg.data.max_response_length
    if need > max_model_len:
        raise ConfigError(f"data.max_prompt_length + data.max_response_length = {need} exceeds the engine's "
                          f"context of {max_model_len} tokens (engine.max_model_len or the model's limit)")


def optimizer_steps_per_step(cfg: RLBoostConfig) -> int:
    mini = cfg.trainer.mini_batch_groups or cfg.data.train_batch_size
    return -(-cfg.data.train_batch_size // mini)


def resume(cfg: RLBoostConfig, run_dir: Path, trainer: Trainer | TrainerGroup, loader: PromptLoader) -> dict:
    """Restore from a checkpoint as `run.resume` says; returns its state (`global_step`: the last
    completed step; `rollout`: the rollout backend's state), or {} when starting fresh. The tracker
    then drops metrics logged after that step: those steps run again."""
    if cfg.run.resume == "disable":
        if latest_checkpoint(run_dir) is not None:
            raise ConfigError(f"{run_dir} already holds checkpoints and run.resume=disable; choose another "
                              "run.output_dir or resume with run.resume=auto")
        return {}
    path = latest_checkpoint(run_dir) if cfg.run.resume == "auto" else Path(cfg.run.resume)
    if path is None:
        return {}
    state = load_checkpoint(path, trainer)
    loader.load_state_dict(state["data"])
    return state


def validate(cfg: RLBoostConfig) -> None:
    """Every section's own checks, as ConfigErrors (the CLI reports them without a traceback)."""
    for section in (cfg.engine, cfg.data, cfg.rollout, cfg.trainer, cfg.reward, cfg.cost, cfg.tracking, cfg.run):
        try:
            section.validate()
        except ValueError as e:
            raise ConfigError(str(e)) from e
    try:
        cfg.engine.check_histospec(cfg.rollout.histospec.enabled)
    except ValueError as e:
        raise ConfigError(str(e)) from e
    if cfg.trainer.tis_cap and optimizer_steps_per_step(cfg) > 1:
        raise ConfigError(f"trainer.tis_cap needs one optimizer step per RL step, but trainer.mini_batch_groups="
                          f"{cfg.trainer.mini_batch_groups} splits data.train_batch_size={cfg.data.train_batch_size} "
                          "into several: set trainer.mini_batch_groups=0 (the trainer's log-probs at the step's "
                          "starting weights are gone after its first update)")
    check_local_devices(cfg)


def check_local_devices(cfg: RLBoostConfig) -> None:
    """A local run's trainer ranks need a device each (a GPU on CUDA, a CPU core otherwise): refuse
    more before anything starts. On a cluster (`rollout.hybrid.ray_address`) Ray's resources decide,
    checked when the ranks are placed."""
    t = cfg.trainer
    if t.world_size == 1 or cfg.rollout.hybrid.ray_address:
        return
    import os

    cuda = t.device.startswith("cuda") or (t.device == "auto" and torch.cuda.is_available())
    have, what = (torch.cuda.device_count(), "GPUs") if cuda else (os.cpu_count() or 1, "CPU cores")
    if t.world_size > have:
        raise ConfigError(f"trainer.world_size={t.world_size} needs {t.world_size} {what} (one per rank) but this "
                          f"machine has {have}")


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


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
