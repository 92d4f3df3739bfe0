"""GPUs per worker and rank, on logical GPUs: a local Ray that offers 12 GPUs this CPU machine does not
have. Ray still assigns them and sets CUDA_VISIBLE_DEVICES in every actor that asks for some, which
is all a worker's engine reads; the engines and ranks themselves compute on the CPU.

What is asserted is what each process sees: a preemptible worker its own GPU, reserved worker i the
reserved GPU that trainer rank i sees too (they take turns on it), a tensor-parallel worker's engine
processes one GPU each; and that a config asking for more GPUs than the hosts have is refused in one
line naming the key, before anything starts."""

from __future__ import annotations

import dataclasses
import os
import time
from pathlib import Path

import pytest
import ray
from ray.util.placement_group import remove_placement_group
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from rlboost.cli import main
from rlboost.cluster.config import ClusterConfig
from rlboost.cluster.placement import SHARE, ReservedGpus, worker_options
from rlboost.cluster.ray_cluster import Cluster
from rlboost.cluster.resources import PREEMPTIBLE, RESERVED
from rlboost.config import ConfigError, RLBoostConfig, load_config
from rlboost.hybrid.config import HybridConfig
from rlboost.hybrid.fleet import Fleet
from rlboost.hybrid.manager import RolloutManager
from rlboost.hybrid.worker import WorkerSpec
from rlboost.trainer import TrainerConfig
from rlboost.trainer.ranks import TrainerGroup

from hybrid_util import ENGINE, MODEL, patience, weights

pytestmark = pytest.mark.e2e  # placement of workers and ranks on a Ray cluster: `make test-e2e`

GPUS = 12
CONFIGS = Path(__file__).parent.parent / "configs"


@pytest.fixture(scope="module")
def cluster():
    cluster = Cluster(ClusterConfig(), "processes", num_gpus=GPUS)
    try:
        yield cluster
    finally:
        cluster.shutdown()


def free_gpus(expected: float | None = None) -> float:
    """The GPUs Ray has free; with `expected`, once they reach it (a killed actor's GPUs go back
    asynchronously), or as they stand after a patient wait."""
    deadline = time.monotonic() + patience(30)
    while True:
        free = ray.available_resources().get("GPU", 0.0)
        if expected is None or free == expected or time.monotonic() > deadline:
            return free
        time.sleep(0.1)


def test_each_worker_owns_its_gpu_and_reserved_ones_take_turns_with_the_ranks(cluster):
    hybrid = HybridConfig(num_reserved=2, num_preemptible=3, gpus_per_worker=1, call_timeout_s=patience(120))
    cluster.place_reserved_gpus(2)  # as a run's assembly does: max(2 reserved workers x 1 GPU, 2 ranks)
    spec = WorkerSpec(MODEL, dataclasses.replace(ENGINE, device="auto"), eos_token_ids=[])
    fleet = Fleet(hybrid, spec, RolloutManager(hybrid, cluster.cfg.weights), cluster)
    trainers = None
    try:
        fleet.publish(weights(), version=0)
        reserved = fleet.start(RESERVED, 2)
        preemptible = fleet.start(PREEMPTIBLE, 3)
        seen = {h.name: ray.get(h.actor.info.remote()).visible_gpus for h in reserved + preemptible}
        mine = [seen[h.name] for h in preemptible]
        shared = [seen[h.name] for h in reserved]
        assert all(v is not None and len(v.split(",")) == 1 for v in mine + shared), seen
        assert len(set(mine)) == 3 and not set(mine) & set(shared), seen  # a GPU each, none of the reserved ones
        assert len(set(shared)) == 2, seen
        assert free_gpus() == GPUS - 2 - 3  # the two reserved GPUs are placed once, whoever sits on them

        trainers = TrainerGroup(TrainerConfig(world_size=2, device="cpu"), MODEL, temperature=1.0,
                                max_response_length=8, total_optimizer_steps=1, cluster=cluster, device_type="cuda")
        assert [info["visible_gpus"] for info in trainers.info] == shared  # rank i on reserved worker i's GPU
        assert trainers.pg is None and free_gpus() == GPUS - 2 - 3  # no GPU of their own
    finally:
        if trainers is not None:
            trainers.close()
        fleet.shutdown()
    assert free_gpus(GPUS - 2) == GPUS - 2  # the preemptible workers' GPUs went back; the reserved stay the run's


@ray.remote
class VllmLikeDriver:
    """What vLLM's Ray executor does in a tensor-parallel worker's actor: one GPU process per bundle of
    the actor's placement group that VLLM_RAY_BUNDLE_INDICES names, each asking for
    VLLM_RAY_PER_WORKER_GPUS of a GPU. Returns what each of them sees."""

    def engine_gpus(self) -> tuple[str | None, list[str]]:
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        group = ray.util.get_current_placement_group()
        share = float(os.environ["VLLM_RAY_PER_WORKER_GPUS"])

        @ray.remote
        def visible() -> str:
            return os.environ["CUDA_VISIBLE_DEVICES"]

        refs = [visible.options(num_cpus=0, num_gpus=share, scheduling_strategy=PlacementGroupSchedulingStrategy(
            group, int(i))).remote() for i in os.environ["VLLM_RAY_BUNDLE_INDICES"].split(",")]
        return os.environ.get("CUDA_VISIBLE_DEVICES"), ray.get(refs)


def test_a_tensor_parallel_worker_gets_a_group_of_tp_gpus(cluster):
    """Two preemptible tp=2 workers, one pinned by its kind, one to a node: two GPUs each, none
    shared; reserved tp=2 worker j: reserved GPUs 2j and 2j+1, the ones ranks 2j and 2j+1 see."""
    before = free_gpus()
    groups, actors = [], []
    reserved = ReservedGpus(4, ray.cluster_resources())
    try:
        node = ray.get_runtime_context().get_node_id()
        pinned = [{"resources": {PREEMPTIBLE: 1}},  # by its kind, or on a node (the ray_cluster provider)
                  {"scheduling_strategy": NodeAffinitySchedulingStrategy(node, soft=False)}]
        for where, node_id in zip(pinned, [None, node]):
            options, group = worker_options(2, {"num_cpus": 0} | where, node_id=node_id)
            groups.append(group)
            actors.append(VllmLikeDriver.options(**options).remote())
        seen = ray.get([a.engine_gpus.remote() for a in actors], timeout=patience(60))
        assert all(own is None for own, _ in seen)  # the actor itself asks for no GPU: its engine's processes do
        gpus = [g for _, engine in seen for g in engine]
        assert len(gpus) == 4 and len(set(gpus)) == 4, seen

        @ray.remote
        def rank_sees() -> str:
            return os.environ["CUDA_VISIBLE_DEVICES"]

        ranks = ray.get([rank_sees.options(num_cpus=0, **reserved.options(i, 1)).remote() for i in range(4)])
        tp_reserved = [VllmLikeDriver.options(**worker_options(2, {"num_cpus": 0}, reserved, slot)[0]).remote()
                       for slot in range(2)]
        engines = ray.get([a.engine_gpus.remote() for a in tp_reserved], timeout=patience(60))
        assert [engine for _, engine in engines] == [ranks[0:2], ranks[2:4]]
        assert len(set(ranks)) == 4 and not set(ranks) & set(gpus)
        assert reserved.options(0, 1)["num_gpus"] == SHARE
        with pytest.raises(ValueError, match="rollout.hybrid.gpus_per_worker: reserved GPUs 4..5 asked for, but 4"):
            worker_options(2, {}, reserved, slot=2)
        actors += tp_reserved
    finally:
        for actor in actors:
            ray.kill(actor)
        for group in groups + [reserved.group]:
            remove_placement_group(group)
    assert free_gpus(before) == before


def past_validation(*args, **kwargs):
    raise AssertionError("the run went past its validation with a GPU demand this machine cannot hold")


def error_lines(capsys) -> list[str]:
    captured = capsys.readouterr()
    assert "Traceback" not in captured.out + captured.err
    return [line for line in (captured.out + captured.err).splitlines() if line.startswith("error:")]


@pytest.mark.parametrize("override, message", [
    ("rollout.hybrid.gpus_per_worker=1", "error: rollout.hybrid.gpus_per_worker=1: rollout.hybrid.num_reserved=1 "
                                         "workers need 1 GPUs on the reserved resources but this machine has 0 there"),
    ("rollout.hybrid.gpus_per_worker=2", "error: rollout.hybrid.gpus_per_worker=2: a rollout worker owns 0 GPUs (a "
                                         "CPU run) or exactly the 1 its engine uses (rlboost's engine)"),
    ("engine.device=cuda", "error: engine.device=cuda: a rollout worker sees only the 0 GPU(s) it owns "
                           "(rollout.hybrid.gpus_per_worker), numbered from cuda:0"),
])
def test_more_gpus_than_this_machine_has_exit_2_naming_the_key_before_anything_starts(
        override, message, tmp_path, capsys, monkeypatch):
    import rlboost.assembly

    for step in ("load_datasets", "load_model", "start_cluster"):
        monkeypatch.setattr(rlboost.assembly, step, past_validation)
    assert main(["train", str(CONFIGS / "hybrid_smoke.yaml"), override, f"run.output_dir={tmp_path}"]) == 2
    assert error_lines(capsys) == [message]


def test_a_joined_cluster_with_too_few_gpus_is_refused_before_any_worker(cluster):
    """On `cluster.ray_address` the nodes' GPUs are known once joined: checked then, before any worker."""
    from rlboost.checks import place_gpus

    cfg = load_config(RLBoostConfig, CONFIGS / "hybrid_smoke.yaml", ["rollout.hybrid.gpus_per_worker=1",
                                                                      "rollout.hybrid.num_preemptible=12"])
    cfg.cluster.ray_address = ray.get_runtime_context().gcs_address  # this test's own local Ray
    placed = cluster.reserved_gpus
    with pytest.raises(ConfigError, match=r"^rollout.hybrid.gpus_per_worker=1: 1 reserved GPUs plus "
                                          r"rollout.hybrid.num_preemptible=12 instances of 1 need 13 GPUs but the Ray "
                                          rf"cluster at {cfg.cluster.ray_address} has {GPUS}$"):
        place_gpus(cfg, cluster)
    assert cluster.reserved_gpus is placed  # refused before placing anything
