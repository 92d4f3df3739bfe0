"""How many GPUs a run's placement takes, as plain arithmetic: what `rlboost.cluster.placement` asks
Ray for, checked against what the hosts have before any worker starts.

Contract:
- A rollout worker owns 0 GPUs (a CPU run) or exactly the GPUs its engine uses: 1, or the vLLM
  backend's tensor-parallel size, all on one host (`rlboost.engine.factory.engine_gpus`).
- The reserved GPUs are shared by time: reserved worker j covers reserved GPUs [j*g, (j+1)*g), trainer
  rank i trains on reserved GPU i, so the reserved side needs max(num_reserved x g, ranks on GPU)
  GPUs, not their sum (`GpuDemand.reserved`). Each preemptible instance needs g GPUs of its own.
- `refusal` says, in one line naming `rollout.hybrid.gpus_per_worker`, why hosts with the given GPUs
  cannot hold the demand, or returns None. The caller decides when it can know what the hosts have:
  before Ray for a local run (this machine's GPUs), right after joining for `cluster.ray_address`.

Plain integers: importing this loads neither Ray nor torch.
"""

from __future__ import annotations

from dataclasses import dataclass

KEY = "rollout.hybrid.gpus_per_worker"


@dataclass(frozen=True)
class GpuDemand:
    gpus_per_worker: int
    num_reserved: int
    num_preemptible: int
    """Preemptible instances at once (the pool `num_preemptible` keeps; a cloud's autoscaler may add more)."""
    rank_gpus: int
    """Trainer ranks placed on the reserved GPUs by Ray (world size > 1 on CUDA), else 0."""

    @property
    def reserved(self) -> int:
        """Reserved GPUs, each shared by one reserved worker (or a tp-th of one) and one trainer rank."""
        return max(self.num_reserved * self.gpus_per_worker, self.rank_gpus) if self.gpus_per_worker else 0

    @property
    def preemptible(self) -> int:
        return self.num_preemptible * self.gpus_per_worker

    def refusal(self, reserved_have: int, total_have: int | None, where: str) -> str | None:
        """Why hosts offering `reserved_have` GPUs on the reserved resources and `total_have` in all
        (None: not known, an autoscaled pool) cannot hold this demand; None when they can. `where`:
        the hosts, in words ("this machine", "the Ray cluster")."""
        if not self.gpus_per_worker:
            return None
        g, reserved, preemptible = self.gpus_per_worker, self.reserved, self.preemptible
        ranks = f" and trainer.world_size={self.rank_gpus} ranks taking turns on them" if self.rank_gpus else ""
        if reserved > reserved_have:
            return (f"{KEY}={g}: rollout.hybrid.num_reserved={self.num_reserved} workers{ranks} need {reserved} GPUs "
                    f"on the reserved resources but {where} has {reserved_have} there")
        if total_have is not None and reserved + preemptible > total_have:
            return (f"{KEY}={g}: {reserved} reserved GPUs plus rollout.hybrid.num_preemptible={self.num_preemptible} "
                    f"instances of {g} need {reserved + preemptible} GPUs but {where} has {total_have}")
        return None


__all__ = ["GpuDemand", "KEY"]
