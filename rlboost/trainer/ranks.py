"""The trainer at `trainer.world_size` > 1: N ranks as Ray actors, driven from the training loop.

Contract (docs/training.md, "Many trainer ranks"):
- `TrainerGroup` places N `TrainerRank` actors in one placement group (a GPU each on CUDA, a CPU
  each otherwise, plus one unit of the `reserved` resource when the cluster has it, so a rank never
  lands on a preemptible instance); on CUDA, when the run's reserved GPUs are placed for rollout
  workers that own GPUs (`Cluster.reserved_gpus`), rank i sits on reserved GPU i instead, taking turns
  with the reserved worker there (`rlboost.cluster.placement`); joins them with torch.distributed and
  has each load the model and shard it (`trainer/sharding.py`). A world size the cluster cannot place is refused before any rank
  starts, naming `trainer.world_size`.
- `train_step(groups, num_groups)` has the meaning of `Trainer.train_step` and runs the same
  `BatchSchedule` (`trainer/schedule.py`) at world size N: groups are dealt to ranks as they arrive
  (whole groups; `deal` picks the rank, round-robin by default); as soon as every rank has a
  micro-batch, all of them run it together; at a mini-batch boundary the ranks still holding groups
  run them while the others run dummy passes, then every rank steps. The optimizer steps at the
  world-1 boundaries and the update is the world-1 update of the same groups.
- Faults: the driver waits on every rank's calls at once, so the first rank that dies or raises fails
  the step with an error naming that rank and the step (`TrainerRankError`); the group is then torn
  down (a surviving rank may be blocked in a collective) and refuses further calls. A rank hung in a
  collective fails after `trainer.collective_timeout_s`; ranks that answer none of the driver's calls
  for `trainer.call_timeout_s` (stopped, or stuck outside a collective) fail it naming them.
- Listening: rank 0's rendezvous store and every rank's collectives listen on their node's cluster
  address only (127.0.0.1 in a local run; `trainer/rendezvous.py`).
- `publish(version, store, dtype)` puts the new weights in the weight store from the shards, one bucket
  gathered at a time (`cluster/weights.publish_gathered`); rank 0 packs and owns the buckets, and its
  `Publisher` keeps what lossless patches are made from (`cluster/publisher.py`).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from datetime import timedelta
from pathlib import Path

import ray
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from rlboost.cluster.ray_cluster import Cluster
from rlboost.cluster.resources import RESERVED
from rlboost.models import ModelConfig
from rlboost.rollout.sample import Group
from rlboost.trainer.errors import TrainerRankError
from rlboost.trainer.rendezvous import StoreSocket, bind_collectives, client_store
from rlboost.trainer.config import TrainerConfig
from rlboost.trainer.schedule import BatchSchedule, MicroBatch
from rlboost.trainer.stats import TrainStepStats

DEATH_GRACE_S = 10.0
"""After a rank fails, how long to look for a rank that died: when one dies mid-collective, the others
fail too (gloo: connection closed), and the death is the cause to name."""


class TrainerRank:
    """One rank (a Ray actor): a `ShardedTrainer` and the calls the driver makes on it."""

    def __init__(self, rank: int, world_size: int):
        self.rank, self.world_size = rank, world_size
        self.trainer = None
        self.publisher = None
        self.model: ModelConfig | None = None
        """The policy's model, as loaded at set-up: the base of a resumed run's patches."""
        self.captured: list[dict] = []
        self.store_socket: StoreSocket | None = None
        """Rank 0's: where its torch.distributed store serves."""

    def rendezvous(self) -> tuple[str, int]:
        """Rank 0's node address and the port its torch.distributed store will serve on, bound and
        listening on that address alone (`trainer/rendezvous.py`)."""
        self.store_socket = StoreSocket(ray.util.get_node_ip_address())
        return self.store_socket.host, self.store_socket.port

    def setup(self, host: str, port: int, config: TrainerConfig, model: ModelConfig, ref_model: ModelConfig | None,
              kwargs: dict) -> dict:
        import torch
        import torch.distributed as dist

        from rlboost.engine.engine import resolve_device
        from rlboost.models import load_model
        from rlboost.trainer.sharding import ShardedTrainer, make_mesh

        device = resolve_device(config.device, key="trainer.device")
        if device.type == "cuda":
            device = torch.device("cuda", 0)  # Ray shows each rank its own GPU only
            torch.cuda.set_device(device)
        bind_collectives(ray.util.get_node_ip_address(), device.type)  # a local run: loopback, like its Ray
        timeout = timedelta(seconds=config.collective_timeout_s)
        store = (self.store_socket.server(self.world_size, timeout) if self.rank == 0
                 else client_store(host, port, self.world_size, timeout))
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo", store=store, rank=self.rank,
                                world_size=self.world_size, timeout=timeout)
        mesh = make_mesh(device.type, self.world_size, config.shard_size)
        policy, self.model = load_model(model).model, model
        ref = load_model(ref_model or model).model if config.kl_coef > 0 else None
        config = TrainerConfig(**{**vars(config), "device": str(device)})
        self.trainer = ShardedTrainer(policy, config, mesh=mesh, ref_model=ref, **kwargs)
        return {"rank": self.rank, "pid": os.getpid(), "device": str(device),
                "visible_gpus": os.environ.get("CUDA_VISIBLE_DEVICES")}

    def begin_step(self) -> None:
        self.trainer.begin_step()

    def micro_batch(self, groups: list[Group] | None) -> None:
        if groups:
            self.trainer.micro_batch(groups)
        else:
            self.trainer.dummy_pass()

    def optimizer_step(self) -> None:
        self.trainer.optimizer_step()

    def end_step(self) -> dict:
        return self.trainer.end_step()

    def reconfigure(self, fields: dict) -> None:
        for key, value in fields.items():
            setattr(self.trainer.config, key, value)

    def capture_grads(self) -> None:
        """From now on keep the full gradient each optimizer step sees (tests; a collective per tensor)."""
        from rlboost.trainer.sharding import full_tensor

        self.capturing = True

        def hook(*_):
            if not self.capturing:
                return
            grads = {n: full_tensor(p.grad).clone() for n, p in self.trainer.model.named_parameters()}
            if self.rank == 0:
                self.captured.append(grads)

        self.trainer.optimizer.register_step_pre_hook(hook)

    def take_captured(self) -> list[dict]:
        out, self.captured = self.captured, []
        return out

    def stop_capturing(self) -> None:
        self.capturing = False

    def state_bytes(self) -> int:
        return self.trainer.step_state_bytes

    def publish(self, version: int, store, dtype: str):
        from rlboost.cluster.host_copy import base_reader
        from rlboost.cluster.publisher import Publisher
        from rlboost.trainer.sharding import full_tensor

        if self.publisher is None or (self.publisher.cfg, self.publisher.dtype) != (store, dtype):
            # it keeps the versions patches are made from; rank 0, which holds them, reads a resumed
            # run's base from its disk
            base = base_reader(self.model) if store.join_from_base and self.rank == 0 else None
            self.publisher = Publisher(store, dtype, load_base=base)
        named = list(self.trainer.model.named_parameters())  # tied weights once, as at world 1
        out = self.publisher.publish(named, version, gather=full_tensor, keep=self.rank == 0)
        return out.manifest, out.peak_bytes

    def save_state(self, folder: str) -> None:
        self.trainer.save_state(Path(folder))

    def load_state(self, folder: str) -> None:
        self.trainer.load_state(Path(folder))

    def export_hf(self, folder: str) -> None:
        self.trainer.export_hf(Path(folder))

    def scheduler_state(self) -> dict:
        return self.trainer.scheduler_state()

    def load_scheduler_state(self, scheduler_state: dict) -> None:
        self.trainer.load_scheduler_state(scheduler_state)


def placement_bundle(device_type: str, cluster: dict[str, float]) -> dict[str, float]:
    bundle = {"GPU": 1.0} if device_type == "cuda" else {"CPU": 1.0}
    if cluster.get(RESERVED, 0) >= 1:
        bundle[RESERVED] = 1.0
    return bundle


def check_world_size(config: TrainerConfig, device_type: str, cluster: dict[str, float]) -> None:
    """Refuse a world size the cluster cannot place (ValueError naming trainer.world_size)."""
    need = placement_bundle(device_type, cluster)
    for resource, amount in need.items():
        have = cluster.get(resource, 0.0)
        if have < amount * config.world_size:
            what = {"GPU": "GPUs", "CPU": "CPUs"}.get(resource, f"units of the `{resource}` resource")
            raise ValueError(f"trainer.world_size={config.world_size} needs {config.world_size} {what} (one per "
                             f"rank) but the Ray cluster has {have:g}")


class TrainerGroup:
    """The driver's handle on N ranks; the same `train_step` as `Trainer` (both a `PolicyTrainer`)."""

    def __init__(self, config: TrainerConfig, model: ModelConfig, *, temperature: float, max_response_length: int,
                 total_optimizer_steps: int, pad_token_id: int = 0, ref_model: ModelConfig | None = None,
                 cluster: Cluster, deal: Callable[[int], int] | None = None, device_type: str | None = None,
                 placement_timeout_s: float = 120.0):
        """`cluster`: the run's Ray, where the ranks are placed; it outlives the group (`close` ends
        the ranks, not Ray)."""
        config.validate()
        self.config, self.world_size = config, config.world_size
        self.deal = deal
        """Which rank a group goes to, by its index in the mini-batch (None: round-robin)."""
        self.broken: str | None = None
        self.step = 0
        offered = cluster.resources()
        if device_type is None:
            device_type = "cpu" if config.device == "cpu" or (
                config.device == "auto" and not offered.get("GPU")) else "cuda"
        check_world_size(config, device_type, offered)
        self.pg = None
        """The ranks' own placement group (None: they sit on the reserved GPUs the rollout shares)."""
        actor = ray.remote(TrainerRank)
        shared = cluster.reserved_gpus if device_type == "cuda" else None
        if shared is not None:  # rank i takes turns with the reserved rollout worker on reserved GPU i
            if shared.count < self.world_size:
                raise ValueError(f"trainer.world_size={self.world_size} needs {self.world_size} reserved GPUs but "
                                 f"{shared.count} are placed for the run (rollout.hybrid.gpus_per_worker x "
                                 "num_reserved)")
            options = [{"num_cpus": 0} | shared.options(i, 1) for i in range(self.world_size)]
        else:
            bundle = placement_bundle(device_type, offered)
            self.pg = placement_group([bundle] * self.world_size, strategy="PACK")
            ready, _ = ray.wait([self.pg.ready()], timeout=placement_timeout_s)
            if not ready:
                remove_placement_group(self.pg)
                raise ValueError(f"trainer.world_size={self.world_size}: Ray could not place {self.world_size} "
                                 f"ranks of {bundle} within {placement_timeout_s:g} s")
            options = [{"num_cpus": bundle.get("CPU", 0), "num_gpus": bundle.get("GPU", 0),
                        "resources": {k: v for k, v in bundle.items() if k not in ("CPU", "GPU")},
                        "scheduling_strategy": PlacementGroupSchedulingStrategy(self.pg, i)}
                       for i in range(self.world_size)]
        self.ranks = [actor.options(**options[i]).remote(i, self.world_size) for i in range(self.world_size)]
        try:
            [(host, port)] = self._all([(0, self.ranks[0].rendezvous.remote())], "starting")
            kwargs = dict(temperature=temperature, max_response_length=max_response_length,
                          total_optimizer_steps=total_optimizer_steps, pad_token_id=pad_token_id)
            self.info = self._all([r.setup.remote(host, port, config, model, ref_model, kwargs) for r in self.ranks],
                                  "starting")
        except BaseException:
            self.close()
            raise

    # -- training --

    def train_step(self, groups: Iterable[Group], num_groups: int, step: int | None = None) -> dict[str, float]:
        """Train on `num_groups` groups pulled from `groups` (`step`: the RL step, for error messages)."""
        self.step = step if step is not None else self.step + 1
        cfg = self.config
        schedule = BatchSchedule(num_groups, cfg.micro_batch_groups, cfg.mini_batch_groups, tis_cap=cfg.tis_cap,
                                 world_size=self.world_size, deal=self.deal)
        self._check_usable()
        pending = self._each("begin_step")
        for group in groups:
            for event in schedule.add(group):
                if isinstance(event, MicroBatch):  # every rank runs it together
                    pending += self._pass(event.per_rank)
                    pending = self._poll(pending)
                else:
                    pending += self._each("optimizer_step")
                    self._all(pending, "training")
                    pending = []
            if schedule.done:
                break
        self._all(pending, "training")
        schedule.finish()
        parts = self._all([r.end_step.remote() for r in self.ranks], "training")
        return TrainStepStats.merged(parts).metrics(parts[0]["lr"])

    def _each(self, method: str, *args) -> list:
        return [(i, getattr(r, method).remote(*args)) for i, r in enumerate(self.ranks)]

    def _pass(self, per_rank: list[list[Group] | None]) -> list:
        return [(i, r.micro_batch.remote(groups)) for i, (r, groups) in enumerate(zip(self.ranks, per_rank))]

    # -- weights --

    def publish(self, version: int, store, dtype: str | None = None):
        """The weights after the last step, as version `version` in the weight store (a WeightManifest)."""
        out = self._all([r.publish.remote(version, store, dtype) for r in self.ranks], "publishing weights")
        self.last_publish_peak_bytes = max(peak for _, peak in out)
        return out[0][0]

    def reconfigure(self, **fields) -> None:
        """Change config fields read at each step (loss_agg_mode, clip ratios, micro_batch_groups,
        mini_batch_groups) on the driver and every rank, keeping the ranks and their weights."""
        for key, value in fields.items():
            setattr(self.config, key, value)
        self.config.validate()
        self._all(self._each("reconfigure", fields), "reconfiguring")

    # -- checkpoints: `Trainer`'s calls, run by every rank (DCP writes one shard per rank) --

    def save_state(self, folder: Path) -> None:
        self._all(self._each("save_state", str(folder)), "saving a checkpoint")

    def load_state(self, folder: Path) -> None:
        self._all(self._each("load_state", str(folder)), "loading a checkpoint")

    def load_unsharded_state(self, hf_folder: Path, optimizer_state: dict) -> None:
        raise ValueError(f"checkpoint {hf_folder.parent} predates sharded checkpoints (no dcp/ folder): resume it "
                         "with trainer.world_size=1; its next checkpoint loads at any world size")

    def export_hf(self, folder: Path) -> None:
        self._all(self._each("export_hf", str(folder)), "saving a checkpoint")

    def scheduler_state(self) -> dict:
        return self._all([(0, self.ranks[0].scheduler_state.remote())], "saving a checkpoint")[0]

    def load_scheduler_state(self, scheduler_state: dict) -> None:
        self._all(self._each("load_scheduler_state", scheduler_state), "loading a checkpoint")

    def capture_grads(self) -> None:
        self._all([r.capture_grads.remote() for r in self.ranks], "training")

    def take_captured(self) -> list[dict]:
        return self._all([self.ranks[0].take_captured.remote()], "training")[0]

    def stop_capturing(self) -> None:
        self._all(self._each("stop_capturing"), "training")

    def state_bytes(self) -> list[int]:
        """Per rank: bytes of parameters, gradients and AdamW state held right after the last step."""
        return self._all(self._each("state_bytes"), "training")

    # -- waiting on ranks --

    def _all(self, calls: list, doing: str) -> list:
        """Results of `calls` ((rank, ref) pairs or refs in rank order), failing at the first rank that
        dies or raises, whichever of them it is."""
        self._check_usable()
        pairs = [c if isinstance(c, tuple) else (i % self.world_size, c) for i, c in enumerate(calls)]
        by_ref = {ref: rank for rank, ref in pairs}
        waiting = [ref for _, ref in pairs]
        limit = self.config.call_timeout_s
        while waiting:
            done, waiting = ray.wait(waiting, num_returns=1, timeout=limit)
            if not done:
                self._hung(sorted({by_ref[r] for r in waiting}), doing, limit)
            try:
                ray.get(done[0])
            except BaseException as e:
                self._fail(by_ref[done[0]], doing, e, [(by_ref[r], r) for r in waiting])
        return ray.get([ref for _, ref in pairs])

    def _poll(self, pending: list) -> list:
        """Check the calls already finished (a dead rank is found here, not only at the step's end)."""
        refs = [ref for _, ref in pending]
        done, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
        done = set(done)
        for rank, ref in pending:
            if ref in done:
                try:
                    ray.get(ref)
                except BaseException as e:
                    self._fail(rank, "training", e, [p for p in pending if p[1] is not ref])
        return [(rank, ref) for rank, ref in pending if ref not in done]

    def _hung(self, ranks: list[int], doing: str, limit: float):
        who = f"rank {ranks[0]}" if len(ranks) == 1 else "ranks " + ", ".join(map(str, ranks))
        self.broken = (f"trainer {who} of {self.world_size} answered nothing for {limit:g} s at step {self.step} "
                       f"({doing}): hung or stopped (trainer.call_timeout_s)")
        self.close()
        raise TrainerRankError(self.broken)

    def _fail(self, rank: int, doing: str, error: BaseException, others: list = ()):
        died = isinstance(error, ray.exceptions.RayActorError)
        if not died and others:  # a collective with a dead rank fails the live ones: name the dead one
            refs = [ref for _, ref in others]
            done, _ = ray.wait(refs, num_returns=len(refs), timeout=DEATH_GRACE_S)
            for other, ref in others:
                if ref in done:
                    try:
                        ray.get(ref)
                    except ray.exceptions.RayActorError as death:
                        rank, error, died = other, death, True
                        break
                    except BaseException:
                        pass
        cause = "died" if died else f"failed: {type(error).__name__}: {str(error).strip().splitlines()[-1][:300]}"
        self.broken = f"trainer rank {rank} of {self.world_size} {cause} at step {self.step} ({doing})"
        self.close()  # the others may be blocked in a collective with the dead rank
        raise TrainerRankError(self.broken) from error

    def _check_usable(self) -> None:
        if self.broken:
            raise TrainerRankError(f"the trainer ranks were torn down: {self.broken}")

    def close(self) -> None:
        for r in getattr(self, "ranks", []):
            ray.kill(r, no_restart=True)
        self.ranks = []
        if getattr(self, "pg", None) is not None:
            remove_placement_group(self.pg)
            self.pg = None
