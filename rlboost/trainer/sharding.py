"""One rank of a sharded trainer: the policy (and the KL reference) sharded with FSDP2 on a device mesh.

Contract (DESIGN.md 2.6; the driver's side is `trainer/ranks.py`):
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

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from transformers import PreTrainedModel

from rlboost.rollout.sample import Group
from rlboost.trainer import state
from rlboost.trainer.config import TrainerConfig
from rlboost.trainer.logprobs import pad_batch, response_logprobs
from rlboost.trainer.trainer import Trainer, _StepStats, use_bf16


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


class ShardedTrainer(Trainer):
    """`Trainer` on one rank of a mesh. The driver calls `micro_batch` / `dummy_pass` on every rank
    together, then `optimizer_step` on every rank; `end_step` hands back the rank's share of the
    metrics."""

    def __init__(self, model: PreTrainedModel, config: TrainerConfig, *, mesh: DeviceMesh, **kwargs):
        self.mesh = mesh
        super().__init__(model, config, **kwargs)
        self.bf16 = False  # FSDP2's mixed-precision policy casts instead of autocast
        self.share_prompt = False  # one forward per micro-batch on every rank (module docstring)
        self.stats = _StepStats()
        self.denominator = 0.0
        self.step_state_bytes = 0
        """`state_bytes()` right after the last optimizer step, gradients still held: the step's peak."""
        self.optimizer.register_step_post_hook(lambda *_: setattr(self, "step_state_bytes", self.state_bytes()))

    def _mixed_precision(self) -> MixedPrecisionPolicy | None:
        if not use_bf16(self.config.dtype, self.device):
            return None
        return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)

    def _place_policy(self, model: PreTrainedModel) -> PreTrainedModel:
        model = model.to(self.device, dtype=torch.float32).train()
        self.policy_root = shard_model(model, self.mesh, self._mixed_precision())
        return model

    def _place_reference(self, model: PreTrainedModel) -> PreTrainedModel:
        model = model.to(self.device, dtype=torch.float32).eval().requires_grad_(False)
        self.reference_root = shard_model(model, self.mesh, self._mixed_precision())
        return model

    def _logprobs(self, model, samples, batch: dict[str, torch.Tensor], with_entropy: bool = False):
        root = self.policy_root if model is self.model else self.reference_root
        return root(batch, self.temperature, with_entropy)

    # -- the driver's calls, in lock-step on every rank --

    def begin_step(self) -> None:
        self.stats, self.denominator = _StepStats(), 0.0
        self.optimizer.zero_grad(set_to_none=True)

    def micro_batch(self, groups: list[Group]) -> None:
        """Groups the driver checked are finished (`TrainerGroup.train_step`)."""
        self.denominator += self._accumulate(groups, self.stats)

    def dummy_pass(self) -> None:
        """The collectives of a micro-batch pass, with no gradient: for a rank that has no group left
        in this mini-batch while another still has one."""
        batch = pad_batch([[self.pad_token_id]], [[self.pad_token_id]], self.pad_token_id, self.device)
        logp, _ = self.policy_root(batch, self.temperature, True)
        if self.ref_model is not None:
            with torch.no_grad():
                self.reference_root(batch, self.temperature, False)
        (logp.sum() * 0.0).backward()

    def optimizer_step(self) -> None:
        self._optimizer_step(self.denominator, self.stats)
        self.denominator = 0.0

    def end_step(self) -> dict:
        return self.stats.totals() | {"lr": self.optimizer.param_groups[0]["lr"]}

    def _global_sums(self, denominator: float, stats: _StepStats) -> float:
        sums = torch.tensor([denominator, stats.pg_numerator, stats.kl_numerator], dtype=torch.float64,
                            device=self.device)
        dist.all_reduce(sums)  # the whole world: replicas of an HSDP mesh hold different groups too
        denominator, stats.pg_numerator, stats.kl_numerator = sums.tolist()
        return denominator

    def export_hf(self, folder) -> None:
        state.export_hf(self.model, folder, full_tensor, writer=dist.get_rank() == 0)

    def weights(self):
        raise RuntimeError("a sharded trainer holds no whole weights; publish them with gathered_buckets")

    def state_bytes(self) -> int:
        """Bytes of parameters, gradients and optimizer state this rank holds now."""
        optim = [v for state in self.optimizer.state.values() for v in state.values() if torch.is_tensor(v)]
        return local_bytes(self.params) + local_bytes(p.grad for p in self.params) + local_bytes(optim)
