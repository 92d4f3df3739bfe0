"""Which GPUs each rollout worker and trainer rank owns, as Ray placement (the counts are
`rlboost.cluster.gpus`').

Contract:
- A worker that owns GPUs asks Ray for them, so Ray sets its CUDA_VISIBLE_DEVICES to those alone and
  its engine's `cuda:0` is its own first GPU; a worker that owns none asks for none (`worker_options`).
- A preemptible worker with one GPU asks `num_gpus=1` beside the resource that pins it to its kind or
  instance. A tensor-parallel vLLM worker (tp > 1) gets a placement group of tp one-GPU bundles on one
  host (STRICT_PACK) of its own: its actor sits in bundle 0 asking no GPU, and vLLM's Ray executor,
  which finds the group as the actor's (its children are captured), places its tp GPU workers one per
  bundle (`VLLM_RAY_BUNDLE_INDICES`, `VLLM_RAY_PER_WORKER_GPUS`). The caller removes that group when
  the worker ends, which frees the GPUs for the next instance.
- `ReservedGpus` is the run's reserved GPUs: one placement group of one-GPU bundles on the `reserved`
  resource, placed once per run (`Cluster.place_reserved_gpus`) and used by both sides. Bundle i is
  the GPU trainer rank i trains on and the one reserved worker covering it generates
  on (worker j covers bundles [j*g, (j+1)*g)). They share it by time, not by space: the step sleeps the
  reserved engines (KV cache freed) before the ranks train and wakes them after the new weights are
  published (docs/hybrid.md, "The step"), so each asks for `SHARE` of the bundle's GPU. Ray's accounting must
  let both sit on one GPU at once; a whole GPU each would need twice the GPUs the reserved node has,
  and GPUs asked for outside one group would pair worker j with whichever rank Ray chose.
"""

from __future__ import annotations

import ray
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from rlboost.cluster.gpus import KEY
from rlboost.cluster.resources import PREEMPTIBLE, RESERVED

SHARE = 0.5
"""The part of a reserved GPU that a reserved rollout worker, and the trainer rank beside it, each
ask for: the two take turns on the whole GPU (see the module docstring)."""

NODE_ID_LABEL = "ray.io/node-id"
"""The label Ray gives every node: its id, for pinning a tensor-parallel instance's group to a node."""


class ReservedGpus:
    """The reserved GPUs that reserved rollout workers and trainer ranks share by time (module docstring)."""

    def __init__(self, count: int, offered: dict[str, float], timeout_s: float = 120.0):
        """`count` one-GPU bundles, on the `reserved` resource when the cluster offers it (`offered`:
        Ray's totals); ValueError naming rollout.hybrid.gpus_per_worker when Ray cannot place them."""
        bundle = {"GPU": 1.0} | ({RESERVED: 1.0} if offered.get(RESERVED, 0) >= count else {})
        self.count = count
        self.group = placement_group([bundle] * count, strategy="PACK")
        if not ray.wait([self.group.ready()], timeout=timeout_s)[0]:
            remove_placement_group(self.group)
            raise ValueError(f"{KEY}: Ray could not place {count} reserved GPUs ({bundle} each) within {timeout_s:g} s")

    def options(self, first: int, gpus: int) -> dict:
        """Actor options for the one who uses bundles [first, first + gpus): a trainer rank (gpus=1) or
        reserved worker first // gpus."""
        if first + gpus > self.count:
            raise ValueError(f"{KEY}: reserved GPUs {first}..{first + gpus - 1} asked for, but {self.count} are placed")
        return _in_group(self.group, first, gpus, SHARE)


def _in_group(group: PlacementGroup, first: int, gpus: int, per_gpu: float) -> dict:
    """Options of an actor that uses bundles [first, first + gpus) of `group`: itself, holding `per_gpu`
    of one GPU; or, for several (tensor parallelism), in `first` holding none, with vLLM told which
    bundles its workers take and how much of each."""
    strategy = PlacementGroupSchedulingStrategy(group, first, placement_group_capture_child_tasks=gpus > 1)
    if gpus == 1:
        return {"num_gpus": per_gpu, "scheduling_strategy": strategy}
    vllm = {"VLLM_RAY_BUNDLE_INDICES": ",".join(str(i) for i in range(first, first + gpus)),
            "VLLM_RAY_PER_WORKER_GPUS": str(per_gpu)}
    return {"num_gpus": 0, "scheduling_strategy": strategy, "runtime_env": {"env_vars": vllm}}


def worker_options(gpus: int, pinned: dict, reserved: ReservedGpus | None = None, slot: int = 0,
                   node_id: str | None = None) -> tuple[dict, PlacementGroup | None]:
    """Ray options giving a rollout worker its `gpus` GPUs, to merge over `pinned` (the options that
    place it: `resources` of its kind or instance, or a node affinity for `node_id`), and the placement
    group made for it alone (None: none; the caller removes it when the worker ends).
    `reserved`: the worker is reserved worker number `slot` on the shared reserved GPUs."""
    if gpus == 0:
        return pinned, None
    # in a placement group the bundles place it: a custom resource asked too would be taken from them
    rest = {k: v for k, v in pinned.items() if k not in ("resources", "scheduling_strategy")}
    if reserved is not None:
        return rest | reserved.options(slot * gpus, gpus), None
    if gpus == 1:
        return pinned | {"num_gpus": 1}, None
    bundles = [{"GPU": 1.0} for _ in range(gpus)]
    bundles[0] |= pinned.get("resources", {})
    labels = [{NODE_ID_LABEL: node_id}] * gpus if node_id is not None else None
    group = placement_group(bundles, strategy="STRICT_PACK", bundle_label_selector=labels)
    return rest | _in_group(group, 0, gpus, 1.0), group


def offered_gpus() -> tuple[int, int]:
    """GPUs of the cluster's live nodes that offer the `reserved` resource, and of those offering either kind."""
    nodes = [n["Resources"] for n in ray.nodes() if n["Alive"]]
    reserved = sum(int(r.get("GPU", 0)) for r in nodes if RESERVED in r)
    total = sum(int(r.get("GPU", 0)) for r in nodes if RESERVED in r or PREEMPTIBLE in r)
    return reserved, total


__all__ = ["ReservedGpus", "SHARE", "offered_gpus", "worker_options"]
