"""`rlboost bench weights`: how long a joining instance takes to serve the current weights.

For 1, 2 and 4 instances joining together (each a Ray node of its own on this machine, so every byte
crosses from one object store to another like between machines), in one run:
- `startup_s`: launch to a booted worker (process, model skeleton, engine; no weights yet);
- `provision_s`: launch to the last of them serving the published version, verified (pull included);
- `floor_s`: the same number of bare fetches of the same buckets, at the same moment, on fresh nodes,
  timed inside the fetching process: bytes ÷ the bandwidth of that path, no checksum, no copy.
Target: provision_s <= startup_s + 1.5 x floor_s.
"""

from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass, field

import ray
from rich.table import Table

from rlboost.cluster.config import ClusterConfig
from rlboost.cluster.ray_cluster import Cluster
from rlboost.cluster.ray_setup import add_node
from rlboost.cluster.resources import MANY, PREEMPTIBLE, RESERVED
from rlboost.engine import EngineConfig
from rlboost.hybrid.config import HybridConfig
from rlboost.hybrid.fleet import Fleet
from rlboost.hybrid.manager import RolloutManager
from rlboost.hybrid.worker import WorkerSpec
from rlboost.models import ModelConfig, load_model


@dataclass
class WeightsBenchConfig:
    model: str = "smollm2"
    """Model (any `model.path` value); its fp32 parameters are what is pulled."""
    workers: list[int] = field(default_factory=lambda: [1, 2, 4])
    """How many instances join together, one measurement each."""
    bucket_mb: float = 64.0
    """cluster.weights.bucket_mb."""


@ray.remote(num_cpus=0)
class _Fetcher:
    def fetch(self, refs: list) -> float:
        t0 = time.perf_counter()
        ray.get(refs)
        return time.perf_counter() - t0


def bench_weights(cfg: WeightsBenchConfig) -> dict:
    hybrid = HybridConfig(num_preemptible=0, instances="nodes")
    cluster_cfg = ClusterConfig()
    cluster_cfg.weights.bucket_mb = cfg.bucket_mb
    model_cfg = ModelConfig(path=cfg.model)
    spec = WorkerSpec(model_cfg, EngineConfig(device="cpu", max_num_seqs=8), [])
    cluster = Cluster(cluster_cfg, hybrid.instances)
    fleet = Fleet(hybrid, spec, RolloutManager(hybrid, cluster.cfg.weights), cluster)
    results = []
    try:
        state = {n: p.detach() for n, p in load_model(model_cfg).model.named_parameters()}
        manifest = fleet.publish(state, version=1)
        fleet.start(RESERVED, 1)  # the trainer's side, as in a run
        fleet.wait_ready()
        refs = [b.ref for b in manifest.buckets]
        for n in cfg.workers:
            floor_s = _floor(fleet, refs, n)
            launched = time.monotonic()
            handles = fleet.start(PREEMPTIBLE, n)
            startup_s = time.monotonic() - launched
            fleet.wait_ready()
            provision_s = max(h.ready for h in handles) - launched
            results.append({"workers": n, "provision_s": provision_s, "startup_s": startup_s, "floor_s": floor_s,
                            "bytes": manifest.nbytes,
                            "within_target": provision_s <= startup_s + 1.5 * floor_s})
            for h in handles:
                fleet.release(h)
            fleet.reap()
    finally:
        fleet.shutdown()
        cluster.shutdown()
    return {"config": asdict(cfg), "machine": {"cpus": os.cpu_count()}, "results": results}


def _floor(fleet: Fleet, refs: list, n: int) -> float:
    """Seconds for `n` fresh nodes to fetch the buckets at once (the slowest of them)."""
    cluster = fleet.cluster
    nodes = [add_node(cluster.head, cluster.cfg.ray, num_cpus=0, resources={"probe": MANY}) for _ in range(n)]
    try:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        fetchers = [_Fetcher.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node.node_id, soft=False)).remote()
                    for node in nodes]
        ray.get([f.__ray_ready__.remote() for f in fetchers])
        return max(ray.get([f.fetch.remote(refs) for f in fetchers]))
    finally:
        for node in nodes:
            cluster.head.remove_node(node, allow_graceful=False)


def render(result: dict) -> Table:
    r0 = result["results"][0] if result["results"] else {"bytes": 0}
    table = Table(title=f"weight provisioning, {r0['bytes'] / 2**20:.0f} MiB of {result['config']['model']}, "
                        f"{result['machine']['cpus']} CPUs")
    for col in ("workers", "startup_s", "floor_s", "provision_s", "startup + 1.5 floor", "within target"):
        table.add_column(col, justify="right")
    for r in result["results"]:
        table.add_row(str(r["workers"]), f"{r['startup_s']:.2f}", f"{r['floor_s']:.2f}", f"{r['provision_s']:.2f}",
                      f"{r['startup_s'] + 1.5 * r['floor_s']:.2f}", "yes" if r["within_target"] else "no")
    return table
