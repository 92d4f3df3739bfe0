"""Everything a run's input can get wrong, checked before the part it concerns starts: `validate` before
the run's folder, Ray or any worker (config sections, the files it reads and the folder it writes, GPUs,
hosts, the trace file, the cluster to join), `check_context` once the model is loaded, `place_gpus` and
`check_model_on_nodes` right after Ray starts, before any worker or rank, and `check_listeners` once
everything is up. Each raises one ConfigError that names the key, file or node (the CLI prints it as one
line, exit 2). `rlboost.train` calls `validate` before it makes the run's folder, `rlboost.assembly` the
rest in that order.
"""
from __future__ import annotations

import functools
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from rlboost.cluster.gpus import KEY as GPU_KEY
from rlboost.cluster.gpus import GpuDemand
from rlboost.config import ConfigError, RLBoostConfig, check_finite
from rlboost.engine.factory import engine_gpus, missing_backend
from rlboost.spot import load_trace
from rlboost.trainer.schedule import optimizer_steps

if TYPE_CHECKING:
    from rlboost.cluster.ray_cluster import Cluster


def check_listeners(cluster: Cluster) -> None:
    """A local run on loopback, once Ray, the trainer ranks and the rollout workers are up: nothing of
    it listens beyond loopback (a ConfigError naming each process and address otherwise)."""
    from rlboost.cluster.ray_setup import ExposedListenerError

    try:
        cluster.check_listeners()
    except ExposedListenerError as e:
        raise ConfigError(str(e)) from e


def needs_cluster(cfg: RLBoostConfig) -> bool:
    """Whether the run stands on Ray: hybrid rollout's workers, or trainer ranks."""
    return cfg.rollout.mode == "hybrid" or cfg.trainer.world_size > 1


def check_context(cfg: RLBoostConfig, max_model_len: int) -> None:
    need = cfg.data.max_prompt_length + cfg.data.max_response_length
    if need > max_model_len:
        raise ConfigError(f"data.max_prompt_length + data.max_response_length = {need} exceeds the engine's "
                          f"context of {max_model_len} tokens (engine.max_model_len or the model's limit)")


def optimizer_steps_per_step(cfg: RLBoostConfig) -> int:
    return optimizer_steps(cfg.data.train_batch_size, cfg.trainer.mini_batch_groups)


def validate(cfg: RLBoostConfig) -> None:
    """Every section's own checks, as ConfigErrors (the CLI reports them without a traceback)."""
    check_finite(cfg)  # `load_config` checked it too; a config built in code comes here only
    for section in (cfg.engine, cfg.data, cfg.rollout, cfg.trainer, cfg.algorithm, cfg.cluster, cfg.reward, cfg.cost,
                    cfg.tracking, cfg.run):
        try:
            section.validate()
        except ValueError as e:
            raise ConfigError(str(e)) from e
    if cfg.algorithm.max_staleness and cfg.rollout.mode != "hybrid":
        raise ConfigError(f"algorithm.max_staleness={cfg.algorithm.max_staleness} runs rollout ahead of the trainer on "
                          "preemptible workers: it needs rollout.mode=hybrid (colocated rollout shares the trainer's "
                          "GPUs and never runs ahead)")
    if cfg.rollout.hybrid.provider == "ray_cluster" and not cfg.cluster.ray_address:
        raise ConfigError("rollout.hybrid.provider=ray_cluster needs cluster.ray_address (a running cluster)")
    try:
        cfg.engine.check_histospec(cfg.rollout.histospec.enabled, cfg.rollout.histospec.drafter)
    except ValueError as e:
        raise ConfigError(str(e)) from e
    if cfg.trainer.tis_cap and optimizer_steps_per_step(cfg) > 1:
        raise ConfigError(f"trainer.tis_cap needs one optimizer step per RL step, but trainer.mini_batch_groups="
                          f"{cfg.trainer.mini_batch_groups} splits data.train_batch_size={cfg.data.train_batch_size} "
                          "into several: set trainer.mini_batch_groups=0 (the trainer's log-probs at the step's "
                          "starting weights are gone after its first update)")
    check_paths(cfg)
    check_local_devices(cfg)
    check_rollout_gpus(cfg)  # its GPU-count message is the more precise one for a hybrid engine's device
    check_installed(cfg)
    check_trace(cfg)
    check_hosts(cfg)
    check_ray_address(cfg)


def check_paths(cfg: RLBoostConfig) -> None:
    """The files the run reads are there and its folder can be written, looked for, not read (the
    loaders say what is wrong inside a file): `model.path` (a local run's; a joined cluster's nodes are
    asked once Ray is up, `check_model_on_nodes`), `data.train_files` / `data.val_files`, `reward.path`,
    and `run.output_dir` (made with its parents)."""
    from rlboost.models.loading import model_problem
    from rlboost.run_dir import unwritable

    if not cfg.cluster.ray_address and (problem := model_problem(cfg.model)):
        raise ConfigError(f"model.path={cfg.model.path!r}: {problem}")
    here = f"relative paths start from {Path.cwd()}"
    for key in ("train_files", "val_files"):
        for f in getattr(cfg.data, key):
            if not Path(f).is_file():
                raise ConfigError(f"data.{key}: {f} not found ({here})")
    reward, _ = cfg.reward.target()
    if reward is not None and not Path(reward).expanduser().exists():
        raise ConfigError(f"reward.path: {Path(reward).expanduser()} not found ({here})")
    if cfg.run.output_dir and (problem := unwritable(Path(cfg.run.output_dir))):
        raise ConfigError(f"run.output_dir={cfg.run.output_dir}: {problem}")


def uses_hosts(cfg: RLBoostConfig) -> bool:
    return cfg.rollout.mode == "hybrid" and cfg.rollout.hybrid.instances == "hosts"


def check_hosts_config(cfg: RLBoostConfig) -> None:
    """The emulated hosts' part of the config (`cluster.hosts`, no `cluster.ray_address`)."""
    if cfg.cluster.ray_address:
        raise ConfigError("rollout.hybrid.instances=hosts emulates a cluster on this machine; it cannot join "
                          f"cluster.ray_address={cfg.cluster.ray_address!r}")
    from rlboost.cluster.hosts import expand_hosts

    try:
        expand_hosts(cfg.cluster.hosts)
    except ValueError as e:
        raise ConfigError(str(e)) from e


def check_hosts(cfg: RLBoostConfig) -> None:
    """Emulated hosts (`rollout.hybrid.instances=hosts`) are a local cluster of this machine's own, in a
    room of namespaces this process must be inside (`enter_hosts_room`)."""
    if not uses_hosts(cfg):
        return
    from rlboost.cluster.hosts import in_room

    check_hosts_config(cfg)
    if not in_room():
        raise ConfigError("rollout.hybrid.instances=hosts runs inside a room of emulated hosts: start it with "
                          "the rlboost command, which enters one")


def check_ray_address(cfg: RLBoostConfig) -> None:
    """The cluster to join (`cluster.ray_address`) answers and, unless `cluster.ray.auth_token=false`,
    refuses calls without a token: a one-line error in seconds instead of minutes of Ray's retries and
    a traceback, or an unauthenticated cluster joined silently. Checked last, as it is the only check
    that talks to another process."""
    if not cfg.cluster.ray_address or not needs_cluster(cfg):
        return
    from rlboost.cluster.address import check_joinable

    try:
        check_joinable(cfg.cluster)
    except ValueError as e:
        raise ConfigError(str(e)) from e


def check_trace(cfg: RLBoostConfig) -> None:
    """The trace provider's file, read and windowed now: a bad file is a one-line error before Ray
    starts, not a traceback from the provider's thread once the workers run."""
    h = cfg.rollout.hybrid
    if cfg.rollout.mode != "hybrid" or h.provider != "trace":
        return
    try:
        load_trace(h.trace)
    except ValueError as e:  # the message names the file and line, or the trace.* field
        raise ConfigError(str(e)) from e


def check_local_devices(cfg: RLBoostConfig) -> None:
    """A local run's trainer ranks need a device each (a GPU on CUDA, a CPU core otherwise): refuse
    more before anything starts. On a cluster (`cluster.ray_address`) Ray's resources decide,
    checked when the ranks are placed."""
    t = cfg.trainer
    if t.world_size == 1 or cfg.cluster.ray_address:
        return
    import os

    cuda = t.device.startswith("cuda") or (t.device == "auto" and torch.cuda.is_available())
    have, what = (torch.cuda.device_count(), "GPUs") if cuda else (os.cpu_count() or 1, "CPU cores")
    if t.world_size > have:
        raise ConfigError(f"trainer.world_size={t.world_size} needs {t.world_size} {what} (one per rank) but this "
                          f"machine has {have}")


def check_installed(cfg: RLBoostConfig) -> None:
    """What the config names exists where it will run: vLLM for `engine.backend=vllm`, CUDA for a
    `cuda` device. A local run (no `cluster.ray_address`) runs all of it on this machine; on a cluster
    only the driver's own part (a colocated engine, a single trainer rank) is checked here, the nodes'
    when their workers start."""
    local = not cfg.cluster.ray_address
    engine_here = local or cfg.rollout.mode == "colocated"
    if engine_here and (missing := missing_backend(cfg.engine)) is not None:
        raise ConfigError(missing)
    for key, device, here in (("engine.device", cfg.engine.device, engine_here),
                              ("trainer.device", cfg.trainer.device, local or cfg.trainer.world_size == 1)):
        if here and str(device).startswith("cuda") and not torch.cuda.is_available():
            raise ConfigError(f"{key}={device!r} but CUDA is not available on this machine")


def gpu_demand(cfg: RLBoostConfig) -> GpuDemand:
    """The GPUs a hybrid run's rollout workers own, and the trainer ranks that share the reserved ones."""
    h, t = cfg.rollout.hybrid, cfg.trainer
    rank_gpus = t.world_size if t.world_size > 1 and t.device != "cpu" else 0
    return GpuDemand(h.gpus_per_worker, h.num_reserved, h.num_preemptible, rank_gpus)


def check_rollout_gpus(cfg: RLBoostConfig) -> None:
    """A hybrid run's rollout workers own 0 GPUs or exactly their engine's, and a local run's demand
    fits this machine's GPUs, before anything starts. On a cluster (`cluster.ray_address`) its nodes'
    GPUs decide, checked right after joining (`place_gpus`)."""
    h, e = cfg.rollout.hybrid, cfg.engine
    if cfg.rollout.mode != "hybrid":
        return
    g, (engine, spans) = h.gpus_per_worker, engine_gpus(e)
    if g not in (0, engine) or (g == 0 and engine > 1):
        raise ConfigError(f"{GPU_KEY}={g}: a rollout worker owns 0 GPUs (a CPU run) or exactly the {engine} its "
                          f"engine uses ({spans})")
    index = e.device.partition(":")[2]
    if e.device.startswith("cuda") and (not g or (index.isdigit() and int(index) >= g)):
        raise ConfigError(f"engine.device={e.device}: a rollout worker sees only the {g} GPU(s) it owns "
                          f"({GPU_KEY}), numbered from cuda:0")
    refusal = None
    if uses_hosts(cfg):  # the emulated hosts offer the logical GPUs cluster.hosts gives them
        from rlboost.cluster.hosts import expand_hosts

        specs = expand_hosts(cfg.cluster.hosts)
        reserved = sum(s.gpus for s in specs if s.kind == "reserved")
        refusal = gpu_demand(cfg).refusal(reserved, sum(s.gpus for s in specs), "cluster.hosts")
    elif not cfg.cluster.ray_address:
        have = torch.cuda.device_count()
        refusal = gpu_demand(cfg).refusal(have, have, "this machine")
    if refusal:
        raise ConfigError(refusal)


def place_gpus(cfg: RLBoostConfig, cluster: Cluster | None) -> None:
    """Right after Ray starts, before any worker or rank: on a joined cluster, refuse a GPU demand its
    nodes cannot hold; then place the reserved GPUs the reserved workers and trainer ranks share."""
    demand = gpu_demand(cfg)
    if cluster is None or cfg.rollout.mode != "hybrid" or not demand.gpus_per_worker:
        return
    from rlboost.cluster.placement import offered_gpus

    if cfg.cluster.ray_address:
        reserved, total = offered_gpus()
        autoscaled = cfg.rollout.hybrid.provider == "ray_cluster"  # its pool grows on demand
        where = f"the Ray cluster at {cfg.cluster.ray_address}"
        refusal = demand.refusal(reserved, None if autoscaled else total, where)
        if refusal:
            raise ConfigError(refusal)
    try:
        cluster.place_reserved_gpus(demand.reserved)
    except ValueError as e:
        raise ConfigError(str(e)) from e


NODE_CHECK_TIMEOUT_S = 120.0
"""How long every node of a joined cluster has to say whether it can read the model (a fresh Ray
worker per node imports torch and transformers first)."""


def check_model_on_nodes(cfg: RLBoostConfig, cluster: Cluster | None) -> None:
    """On a joined cluster (`cluster.ray_address`), right after joining and before any worker or rank:
    every node that may run one can read `model.path` (workers build their model from it there), or
    one ConfigError names the nodes that cannot and why. A local run's nodes share this machine's
    files; nodes joining later are checked by their workers' boots."""
    if cluster is None or not cfg.cluster.ray_address:
        return
    from rlboost.models.loading import model_problem

    answers = cluster.on_every_node(functools.partial(model_problem, cfg.model), NODE_CHECK_TIMEOUT_S)
    bad = {node: why for node, why in answers.items() if why}
    if bad:
        where = "; ".join(f"node {node}: {why}" for node, why in sorted(bad.items()))
        raise ConfigError(f"model.path={cfg.model.path!r}: not readable on {len(bad)} of {len(answers)} nodes of "
                          f"cluster.ray_address={cfg.cluster.ray_address} ({where}); every node must hold the model")
