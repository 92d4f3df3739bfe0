"""One rank of a sharded trainer: the policy (and the KL reference) sharded with FSDP2 on a device mesh.

Contract (docs/training.md, "Many trainer ranks"; the driver's side is `trainer/ranks.py`):
- `shard_model` applies `fully_shard` to each decoder block, then to a root module around the model
  that computes response log-probs, so the root's parameters (embeddings, final norm, LM head, tied or
  not) are gathered by the root's own forward. Parameters, gradients and AdamW's state are DTensors
  holding 1/shard_size of each tensor; on CUDA the mixed-precision policy computes in bf16 and reduces
  gradients in fp32 over fp32 master weights.
- Collectives run in lock-step. Every FSDP2 forward and backward gathers and reduce-scatters, so
  every rank must run the same sequence of passes: the driver has all ranks run a micro-batch pass
  together, and a rank with no groups for that pass runs `dummy_pass` (a one-token batch whose loss
  is multiplied by 0: the same modules, the same collectives, no gradient). Each micro-batch is one
  padded batch (one forward per model), since sharing a prompt makes the number of forwards depend
  on the data.
- Exactness: gradients are reduced as sums (divide factor 1) and accumulate in the sharded grads; at
  the mini-batch boundary `optimizer_step` all-reduces the loss normaliser and numerators, so the
  update is the world-1 update of the same groups, whatever rank each group went to.
- Weights leave a rank bucket by bucket (`full_tensor` per parameter, each a collective): see
  `cluster/weights.publish_gathered`; no rank holds the whole model while publishing.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from transformers import PreTrainedModel

from rlboost.engine.engine import resolve_device
from rlboost.rollout.sample import Group
from rlboost.trainer import state
from rlboost.trainer.config import TrainerConfig
from rlboost.trainer.logprobs import pad_batch, response_logprobs
from rlboost.trainer.trainer import Trainer, use_bf16


class LogprobRoot(nn.Module):
    """The root FSDP unit: its forward is what the trainer calls, so the model's own parameters outside
    the decoder blocks are gathered before any of them is used (the trainer reads the LM head directly,
    which a sharded model's forward alone would not unshard)."""

    def __init__(self, model: PreTrainedModel):
        super().__init__()
        self.model = model

    def forward(self, batch: dict[str, torch.Tensor], temperature: float, with_entropy: bool):
        return response_logprobs(self.model, batch, temperature, with_entropy)


def make_mesh(device_type: str, world_size: int, shard_size: int) -> DeviceMesh:
    """1-D mesh (FSDP) when every rank shards; (replicate, shard) (HSDP) when shard_size < world_size."""
    if not shard_size or shard_size == world_size:
        return init_device_mesh(device_type, (world_size,), mesh_dim_names=("shard",))
    return init_device_mesh(device_type, (world_size // shard_size, shard_size),
                            mesh_dim_names=("replicate", "shard"))


def decoder_blocks(model: PreTrainedModel) -> list[nn.Module]:
    layers = getattr(model.base_model, "layers", None)
    if layers is None:
        raise ValueError(f"{type(model).__name__}: no decoder blocks at model.base_model.layers to shard")
    return list(layers)


def shard_model(model: PreTrainedModel, mesh: DeviceMesh, mixed_precision: MixedPrecisionPolicy | None) -> LogprobRoot:
    """Shard `model` in place (its parameters become DTensors); returns the root to call."""
    kwargs = {"mesh": mesh} | ({"mp_policy": mixed_precision} if mixed_precision is not None else {})
    units = []
    for block in decoder_blocks(model):
        fully_shard(block, **kwargs)
        units.append(block)
    root = fully_shard(LogprobRoot(model), **kwargs)
    for unit in [*units, root]:
        # sums, not means: the trainer divides by the global normaliser itself, as at world 1; plain
        # SUM collectives also work on gloo, which has neither AVG nor PREMUL_SUM
        unit.set_gradient_divide_factor(1.0)
        unit.set_force_sum_reduction_for_comms(True)
    return root


def local_bytes(tensors) -> int:
    """Bytes this rank holds of `tensors` (a DTensor's local shard, a plain tensor whole)."""
    total = 0
    for t in tensors:
        if t is None:
            continue
        local = t.to_local() if hasattr(t, "to_local") else t
        total += local.numel() * local.element_size()
    return total


def full_tensor(t: torch.Tensor) -> torch.Tensor:
    """The whole tensor on every rank (an all-gather for a DTensor: every rank must call it)."""
    return (t.full_tensor() if hasattr(t, "full_tensor") else t).detach()


class ShardedPlacement:
    """A `Trainer`'s `Placement` on one rank of a mesh: the policy and the reference sharded, their
    log-probs through the root FSDP unit, the step's sums all-reduced."""

    autocast = False
    """FSDP2's mixed-precision policy casts instead of autocast."""
    shares_prompts = False
    """One forward per micro-batch on every rank (module docstring)."""

    def __init__(self, mesh: DeviceMesh, device: torch.device, mixed_precision: MixedPrecisionPolicy | None):
        self.mesh, self.device, self.mixed_precision = mesh, device, mixed_precision
        self.roots: dict[int, LogprobRoot] = {}
        """id(model) -> the root FSDP unit to call for its log-probs."""

    def place_policy(self, model: PreTrainedModel, device: torch.device) -> PreTrainedModel:
        model = model.to(device, dtype=torch.float32).train()
        self.roots[id(model)] = shard_model(model, self.mesh, self.mixed_precision)
        return model

    def place_reference(self, model: PreTrainedModel, device: torch.device) -> PreTrainedModel:
        model = model.to(device, dtype=torch.float32).eval().requires_grad_(False)
        self.roots[id(model)] = shard_model(model, self.mesh, self.mixed_precision)
        return model

    def logprobs(self, model: PreTrainedModel, batch: dict[str, torch.Tensor], temperature: float,
                 with_entropy: bool):
        return self.roots[id(model)](batch, temperature, with_entropy)

    def global_sums(self, sums: list[float]) -> list[float]:
        out = torch.tensor(sums, dtype=torch.float64, device=self.device)
        dist.all_reduce(out)  # the whole world: replicas of an HSDP mesh hold different groups too
        return out.tolist()


def mixed_precision(dtype: str, device: torch.device) -> MixedPrecisionPolicy | None:
    if not use_bf16(dtype, device):
        return None
    return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)


class ShardedTrainer:
    """A `Trainer` on one rank of a mesh (placed by `ShardedPlacement`). The driver calls
    `micro_batch` / `dummy_pass` on every rank together, then `optimizer_step` on every rank;
    `end_step` hands back the rank's share of the metrics."""

    def __init__(self, model: PreTrainedModel, config: TrainerConfig, *, mesh: DeviceMesh, **kwargs):
        device = resolve_device(config.device, key="trainer.device")
        placement = ShardedPlacement(mesh, device, mixed_precision(config.dtype, device))
        self.trainer = Trainer(model, config, placement=placement, **kwargs)
        self.config, self.model, self.optimizer = config, self.trainer.model, self.trainer.optimizer
        self.step_state_bytes = 0
        """`state_bytes()` right after the last optimizer step, gradients still held: the step's peak."""
        self.optimizer.register_step_post_hook(lambda *_: setattr(self, "step_state_bytes", self.state_bytes()))

    # -- the driver's calls, in lock-step on every rank --

    def begin_step(self) -> None:
        self.trainer.begin_step()

    def micro_batch(self, groups: Sequence[Group]) -> None:
        """Groups the driver checked are finished (`TrainerGroup.train_step`)."""
        self.trainer.micro_batch(groups)

    def dummy_pass(self) -> None:
        """The collectives of a micro-batch pass, with no gradient: for a rank that has no group left
        in this mini-batch while another still has one."""
        t = self.trainer
        batch = pad_batch([[t.pad_token_id]], [[t.pad_token_id]], t.pad_token_id, t.device)
        logp, _ = t.placement.logprobs(t.model, batch, t.temperature, True)
        if t.ref_model is not None:
            with torch.no_grad():
                t.placement.logprobs(t.ref_model, batch, t.temperature, False)
        (logp.sum() * 0.0).backward()

    def optimizer_step(self) -> None:
        self.trainer.optimizer_step()

    def end_step(self) -> dict:
        return self.trainer.end_step().totals() | {"lr": self.trainer.lr}

    # -- checkpoints: every rank writes and reads its own shard --

    def save_state(self, folder: Path) -> None:
        self.trainer.save_state(folder)

    def load_state(self, folder: Path) -> None:
        self.trainer.load_state(folder)

    def export_hf(self, folder: Path) -> None:
        state.export_hf(self.model, folder, full_tensor, writer=dist.get_rank() == 0)

    def scheduler_state(self) -> dict:
        return self.trainer.scheduler_state()

    def load_scheduler_state(self, scheduler_state: dict) -> None:
        self.trainer.load_scheduler_state(scheduler_state)

    def state_bytes(self) -> int:
        """Bytes of parameters, gradients and optimizer state this rank holds now."""
        params = self.trainer.params
        optim = [v for state in self.optimizer.state.values() for v in state.values() if torch.is_tensor(v)]
        return local_bytes(params) + local_bytes(p.grad for p in params) + local_bytes(optim)
