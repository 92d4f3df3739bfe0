"""Assembling a run of `rlboost train` from its config, and taking it apart again.

Everything that can be wrong with the input (config, data, reward function, model path, prompt
lengths, the spot trace file) is checked in `setup` (the checks: `rlboost.checks`), before Ray or any worker starts (the reward
function by the reward workers, which import it: the driver never does). `setup` then
starts the run's Ray once (a `Cluster`, when hybrid rollout or trainer ranks need one), builds the
trainer (in this process, or as ranks on the cluster), restores the latest checkpoint if resuming,
and builds the rollout backend of `rollout.mode` serving exactly the trainer's weights. A local run
on loopback then checks that nothing it started listens beyond loopback (`Cluster.check_listeners`).
`RunParts.close` tears it down in reverse: trainer ranks, rollout workers, Ray, then the reward
workers, whatever went wrong before. The training
loop itself is `rlboost.train`.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch
from omegaconf import OmegaConf

from rlboost.checkpoint import CheckpointError, latest_checkpoint, load_checkpoint
from rlboost.checks import (check_context, check_listeners, check_model_on_nodes, needs_cluster,
                            optimizer_steps_per_step, place_gpus, validate)
from rlboost.config import ConfigError, RLBoostConfig
from rlboost.data import PromptLoader, PromptRow, check_prompt_lengths, load_datasets
from rlboost.engine.factory import make_engine
from rlboost.histospec import HistoryStore, make_drafter
from rlboost.models import load_model
from rlboost.policies.histopipe import HistoPipe
from rlboost.rewards import RewardScorer
from rlboost.rollout import ColocatedRollout, RolloutBackend
from rlboost.run_dir import run_folder
from rlboost.spot import CostMeter
from rlboost.trainer import Trainer

if TYPE_CHECKING:
    from rlboost.cluster.ray_cluster import Cluster
    from rlboost.trainer.protocol import PolicyTrainer


@dataclasses.dataclass
class Prompts:
    """A dataset's rows with their chat-templated token ids."""

    rows: list[PromptRow]
    ids: list[list[int]]


@dataclasses.dataclass
class RunParts:
    """A run's parts once built and, when resuming, restored."""

    cfg: RLBoostConfig
    dir: Path
    rollout: RolloutBackend
    trainer: PolicyTrainer
    loader: PromptLoader
    scorer: RewardScorer
    tokenizer: object
    train_set: Prompts
    val_set: Prompts
    start_step: int
    version: int
    """Weight version the rollout workers serve (= optimizer updates so far)."""
    cost: CostMeter
    cluster: Cluster | None
    """The run's Ray, shared by trainer ranks and rollout workers (None: a colocated run at world size 1
    uses none)."""

    def close(self) -> None:
        """Trainer ranks first (they live on the rollout's Ray in hybrid mode), then the rollout, then Ray;
        the reward workers whatever happened before."""
        try:
            close_all(self.trainer, self.rollout, self.cluster)
        finally:
            self.scorer.close()


def setup(cfg: RLBoostConfig, config_path: str | Path | None, run_dir: Path | None = None,
          on_head_lost: Callable[[str], None] | None = None, checked: bool = False) -> RunParts:
    """Check every input, build engine and trainer, and restore the latest checkpoint if resuming.
    `run_dir`: the run folder (default: where `run` config puts it). `on_head_lost(cause)`: called once,
    from a thread of its own, if the Ray head the run started dies under it (`Cluster.watch_head`).
    `checked`: the caller ran `rlboost.checks.validate(cfg)` already (before making the run folder)."""
    if not checked:
        validate(cfg)
    # The reward workers load the reward function (a set-up error if they cannot) before Ray starts;
    # they never get its token either way (rlboost.rewards.pool).
    scorer = RewardScorer.start(cfg.reward)
    try:
        return build(cfg, config_path, run_dir, scorer, on_head_lost)
    except BaseException:
        scorer.close()
        raise


def build(cfg: RLBoostConfig, config_path: str | Path | None, run_dir: Path | None,
          scorer: RewardScorer, on_head_lost: Callable[[str], None] | None = None) -> RunParts:
    """`setup` past the reward workers: data, model, Ray, trainer, rollout, the restored checkpoint."""
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
    cluster = start_cluster(cfg)
    trainer = rollout = None
    try:
        if cluster is not None and on_head_lost is not None:
            cluster.watch_head(on_head_lost)
        place_gpus(cfg, cluster)
        check_model_on_nodes(cfg, cluster)
        if cfg.trainer.world_size > 1:
            trainer, rollout, restored = sharded_setup(cfg, run_dir, policy, loader, pad_token_id,
                                                       total_optimizer_steps, cluster)
        else:
            ref = load_model(cfg.model).model if cfg.trainer.kl_coef > 0 else None
            trainer = Trainer(policy.model, cfg.trainer, temperature=cfg.rollout.temperature,
                              max_response_length=cfg.data.max_response_length,
                              total_optimizer_steps=total_optimizer_steps, pad_token_id=pad_token_id, ref_model=ref)
            restored = resume(cfg, run_dir, trainer, loader)
        start_step = int(restored.get("global_step", 0))
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "config.yaml").write_text(OmegaConf.to_yaml(OmegaConf.structured(cfg)))
        if rollout is None:
            rollout = make_rollout(cfg, policy.eos_token_ids, trainer_weights(trainer, cfg, start_step), start_step,
                                   cluster)
        rollout.load_state_dict(restored.get("rollout", {}))
        if cluster is not None:
            check_listeners(cluster)
    except BaseException:
        close_all(trainer, rollout, cluster)
        raise
    cost = CostMeter(cfg.cost)
    if "cost" in restored:
        cost.load_state_dict(restored["cost"])
    return RunParts(cfg, run_dir, rollout, trainer, loader, scorer, policy.tokenizer, train_set, val_set, start_step,
                    version=start_step, cost=cost, cluster=cluster)


def start_cluster(cfg: RLBoostConfig) -> Cluster | None:
    """The run's Ray, started (or joined at `cluster.ray_address`) once, for whichever needs it:
    hybrid rollout's workers, trainer ranks (`trainer.world_size` > 1), or both. A colocated run at
    world size 1 needs none (None). Only hybrid rollout stands up preemptible instances; without it
    the whole local node is reserved."""
    if not needs_cluster(cfg):
        return None
    from rlboost.cluster.ray_cluster import Cluster  # Ray is imported only when used

    hybrid = cfg.rollout.mode == "hybrid"
    return Cluster(cfg.cluster, cfg.rollout.hybrid.instances if hybrid else None)


def sharded_setup(cfg: RLBoostConfig, run_dir: Path, policy, loader: PromptLoader, pad_token_id: int,
                  total_optimizer_steps: int, cluster: Cluster):
    """`trainer.world_size` > 1: the trainer ranks on the run's cluster, restored if resuming, and the
    rollout. Hybrid rollout is built first, serving the weights as loaded, and is given the restored
    version after a resume. Returns (trainer, rollout or None, restored state); closes what it built
    if it fails."""
    from rlboost.trainer.ranks import TrainerGroup

    rollout, trainer = None, None
    try:
        if cfg.rollout.mode == "hybrid":
            weights = {name: p.detach() for name, p in policy.model.named_parameters()}
            rollout = make_rollout(cfg, policy.eos_token_ids, weights, 0, cluster)
            del weights
        try:
            trainer = TrainerGroup(cfg.trainer, cfg.model, temperature=cfg.rollout.temperature,
                                   max_response_length=cfg.data.max_response_length,
                                   total_optimizer_steps=total_optimizer_steps, pad_token_id=pad_token_id,
                                   ref_model=cfg.model if cfg.trainer.kl_coef > 0 else None, cluster=cluster)
        except ValueError as e:  # a world size the cluster cannot place
            raise ConfigError(str(e)) from e
        restored = resume(cfg, run_dir, trainer, loader)
        start_step = int(restored.get("global_step", 0))
        if rollout is not None and start_step:
            rollout.publish(trainer_weights(trainer, cfg, start_step), version=start_step)
        return trainer, rollout, restored
    except BaseException:
        close_all(trainer, rollout, None)
        raise


def trainer_weights(trainer: PolicyTrainer, cfg: RLBoostConfig, version: int):
    """What the rollout backend loads as `version`: the state dict at world size 1. From trainer ranks,
    the version published from their shards into the weight store: its manifest for hybrid rollout
    (the workers pull it), the pulled tensors for the colocated engine in this process."""
    from rlboost.cluster.manifest import WeightManifest
    from rlboost.cluster.weights import pull

    w = cfg.cluster.weights
    if cfg.rollout.mode != "hybrid":  # one engine in this process, loading whole versions: no patches to keep
        w = dataclasses.replace(w, patches=False)
    weights = trainer.publish(version, w, cfg.engine.serving_dtype(cfg.model.dtype))
    if isinstance(weights, WeightManifest) and cfg.rollout.mode != "hybrid":
        return pull(weights, weights.fingerprint, w.pull_timeout_s)
    return weights


def close_all(trainer: PolicyTrainer | None, rollout, cluster: Cluster | None) -> None:
    if trainer is not None:
        trainer.close()
    if rollout is not None:
        rollout.close()
    if cluster is not None:
        cluster.shutdown()


def make_rollout(cfg: RLBoostConfig, eos_token_ids: list[int], weights, version: int, cluster: Cluster | None):
    """The rollout backend of `rollout.mode`, serving exactly the trainer's weights at `version`
    (hybrid: its workers on `cluster`)."""
    histopipe = HistoPipe(cfg.rollout.histopipe) if cfg.rollout.histopipe.enabled else None
    if cfg.rollout.mode == "hybrid":
        from rlboost.hybrid.rollout import HybridRollout  # Ray is imported only when used
        from rlboost.hybrid.worker import WorkerSpec

        h = cfg.rollout.hybrid
        histospec = cfg.rollout.histospec if cfg.rollout.histospec.enabled else None
        spec = WorkerSpec(cfg.model, cfg.engine, list(eos_token_ids), h.worker_threads, h.heartbeat_interval_s,
                          histospec, join_from_base=cfg.cluster.weights.join_from_base)
        return HybridRollout(h, cluster, spec, weights, version, seed=cfg.run.seed, histopipe=histopipe,
                             reserved_usd_per_s=cfg.cost.reserved_usd_per_s(),
                             instance_usd_per_s=cfg.cost.instance_usd_per_s(),
                             max_staleness=cfg.algorithm.max_staleness, start_ahead=cfg.algorithm.start_ahead)
    histospec = cfg.rollout.histospec
    engine = make_engine(cfg.model, cfg.engine, eos_token_ids, weights=weights, version=version,
                         draft_tokens=histospec.max_draft if histospec.enabled else 0)
    history = None
    if histospec.enabled:
        history = HistoryStore(histospec.history_max_tokens)
        engine.drafter = make_drafter(history, histospec)
    return ColocatedRollout(engine, history, histopipe)


def encode(tokenizer, rows: list[PromptRow], max_prompt_length: int) -> Prompts:
    """Chat-template every row; a prompt over `data.max_prompt_length` is an error naming its row."""
    ids = [list(tokenizer.apply_chat_template(row.prompt, add_generation_prompt=True, tokenize=True,
                                              return_dict=True)["input_ids"]) for row in rows]
    length = {id(row): len(tokens) for row, tokens in zip(rows, ids)}
    check_prompt_lengths(rows, lambda row: length[id(row)], max_prompt_length)
    return Prompts(rows, ids)


def resume(cfg: RLBoostConfig, run_dir: Path, trainer: PolicyTrainer, loader: PromptLoader) -> dict:
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
    try:
        state = load_checkpoint(path, trainer)
    except CheckpointError as e:
        raise ConfigError(str(e)) from e
    loader.load_state_dict(state["data"])
    return state


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
