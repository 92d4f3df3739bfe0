"""`rlboost bench weights`: how long a joining instance takes to serve the current weights.

For 1, 2 and 4 instances joining together (each a Ray node of its own on this machine, so every byte
crosses from one object store to another like between machines), in one run:
- `startup_s`: launch to a booted worker (process, model skeleton, engine; no weights yet);
- `provision_s`: launch to the last of them serving the published version, verified (pull included);
- `floor_s`: the same number of bare fetches of the same buckets, at the same moment, on fresh nodes,
  timed inside the fetching process: bytes ÷ the bandwidth of that path, no checksum, no copy.
Target: provision_s <= startup_s + 1.5 x floor_s.

With `--patches`, what lossless patches save instead (`rlboost.bench.weight_patches`): bytes per version
on real GRPO steps, bit-identity, and joins and refreshes behind 100 Mbit/s, 1 Gbit/s and 10 Gbit/s
links on emulated hosts.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import ray
from rich.table import Table

from rlboost.cluster.config import ClusterConfig
from rlboost.cluster.hosts import HostEntry, in_room, link_bits_s
from rlboost.cluster.ray_cluster import Cluster
from rlboost.cluster.ray_setup import add_node
from rlboost.cluster.resources import MANY, PREEMPTIBLE, RESERVED
from rlboost.engine import EngineConfig
from rlboost.hybrid.config import HybridConfig
from rlboost.hybrid.fleet import Fleet
from rlboost.hybrid.handles import first_line
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
    patches: bool = False
    """Measure lossless patches instead (the fields below; docs/weights.md)."""
    patch_models: list[str] = field(default_factory=lambda: ["smollm2"])
    """--patches: models trained with real GRPO steps; the first one's versions cross the links."""
    lrs: list[float] = field(default_factory=lambda: [1e-6, 2e-5])
    """--patches: learning rates (1e-6: the usual RL one; 2e-5: the showcase's); the first one's
    versions cross the links."""
    steps: int = 20
    """--patches: GRPO steps per model and lr."""
    max_tokens: int = 48
    """--patches: tokens per response at most in those steps (the showcase's: SmolLM2 needs ~48 to finish
    an answer)."""
    prompts_per_step: int = 8
    """--patches: prompts per GRPO step (the showcase's n samples each, its reward and trainer settings)."""
    links: list[str] = field(default_factory=lambda: ["100mbit", "1gbit", "10gbit"])
    """--patches: link rates of the joins and refreshes measured on emulated hosts (none: skip them)."""
    fanout: list[int] = field(default_factory=lambda: [1, 4, 16])
    """--patches: hosts fetching one version at once, each behind a `fanout_link` link (none: skip)."""
    fanout_link: str = "1gbit"
    """--patches: the link of each fan-out host and of the trainer's own uplink."""
    seed: int = 0
    """--patches: seed of prompts and sampling."""
    versions_dir: str = ""
    """--patches: a folder for the versions the fan-out and links publish (the base and the first
    model's weights after steps - 1 and steps at the first lr, in bf16): written once those steps ran;
    where it already holds them, those steps (and their byte rows) are skipped, so the links rerun
    alone in minutes instead of after hours of steps."""


    def about(self) -> dict:
        """What the versions the links publish are of (`--versions-dir` keeps them with it)."""
        return {"model": self.patch_models[0], "lr": self.lrs[0], "steps": self.steps, "seed": self.seed}

    def validate(self) -> None:
        """Bad input as a ValueError naming the flag, before any Ray, room or step starts."""
        if not self.patches:
            return
        for link in self.links:
            link_bits_s(link, "--links")
        link_bits_s(self.fanout_link, "--fanout-link")
        if self.versions_dir:
            from rlboost.bench.weight_patches import saved_steps

            saved_steps(self.versions_dir, self.about())


def NEEDS_ROOM(cfg: WeightsBenchConfig) -> bool:
    """The links of `--patches` are measured inside a room of emulated hosts."""
    return cfg.patches and bool(cfg.links or cfg.fanout)


@ray.remote(num_cpus=0)
class _Fetcher:
    def fetch(self, refs: list) -> float:
        t0 = time.perf_counter()
        ray.get(refs)
        return time.perf_counter() - t0


def bench_weights(cfg: WeightsBenchConfig, save_partial: Callable[[dict], None] = lambda result: None) -> dict:
    """`save_partial`: called with the result so far after every GRPO step and part of `--patches`
    (they take hours on a CPU), so a stopped run keeps what it measured."""
    if cfg.patches:
        return bench_patches(cfg, save_partial)
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


def bench_patches(cfg: WeightsBenchConfig, save_partial: Callable[[dict], None] = lambda result: None) -> dict:
    from rlboost.bench import weight_patches

    cfg.validate()
    rows, versions = [], {}
    # the weight store's Ray; inside a room, on its reserved host (the room's loopback holds no Ray)
    cluster = (Cluster(dataclasses.replace(ClusterConfig(), hosts=[HostEntry(kind="reserved", name="res-0", cpus=2)]),
                       "hosts") if in_room() else Cluster(ClusterConfig(), "processes"))
    steps = weight_patches.saved_steps(cfg.versions_dir, cfg.about()) if cfg.versions_dir else None
    saved = weight_patches.load_versions(cfg.versions_dir, steps) if steps else None
    try:
        for model in cfg.patch_models:
            for lr in cfg.lrs:
                first = not versions
                if first and saved:
                    versions = saved
                    continue
                keep = (0, cfg.steps - 1, cfg.steps) if first else ()
                done = len(rows)
                out, kept = weight_patches.byte_rows(
                    model, lr, cfg.steps, cfg.max_tokens, cfg.seed, keep, cfg.prompts_per_step,
                    on_rows=lambda so_far: save_partial(_result(cfg, rows[:done] + so_far, [])))
                rows += out
                if first:
                    versions = kept
                    if cfg.versions_dir:
                        weight_patches.save_versions(cfg.versions_dir, kept, cfg.about())
    finally:
        cluster.shutdown()
    errors = []
    for part, wanted, run in (("fanout", cfg.fanout, lambda: weight_patches.fanout_rows(
            cfg.patch_models[0], versions, cfg.fanout, cfg.fanout_link, cfg.bucket_mb)),
                              ("links", cfg.links, lambda: weight_patches.link_rows(
            cfg.patch_models[0], versions, cfg.links, cfg.bucket_mb))):
        if wanted:
            try:  # a part that fails keeps the rows measured before it (the bytes take hours)
                rows += run()
            except Exception as e:  # noqa: BLE001 - reported in the result, and the part's rows are missing
                errors.append(f"{part}: {first_line(e)}")  # Ray's out-of-memory report is 40 lines
            save_partial(_result(cfg, rows, errors))
    return _result(cfg, rows, errors)


def _result(cfg: WeightsBenchConfig, rows: list[dict], errors: list[str]) -> dict:
    return {"config": asdict(cfg), "machine": {"cpus": os.cpu_count()}, "results": rows, "errors": errors}


def render(result: dict):
    if result["config"].get("patches"):
        return _render_patches(result)
    r0 = result["results"][0] if result["results"] else {"bytes": 0}
    table = Table(title=f"weight provisioning, {r0['bytes'] / 2**20:.0f} MiB of {result['config']['model']}, "
                        f"{result['machine']['cpus']} CPUs")
    for col in ("workers", "startup_s", "floor_s", "provision_s", "startup + 1.5 floor", "within target"):
        table.add_column(col, justify="right")
    for r in result["results"]:
        table.add_row(str(r["workers"]), f"{r['startup_s']:.2f}", f"{r['floor_s']:.2f}", f"{r['provision_s']:.2f}",
                      f"{r['startup_s'] + 1.5 * r['floor_s']:.2f}", "yes" if r["within_target"] else "no")
    return table


def _render_patches(result: dict) -> list[Table]:
    import statistics

    sizes = Table(title="lossless patches on real GRPO steps: share of the full version's bytes")
    for col in ("model", "lr", "dtype", "steps", "changed (median)", "patch (median)", "patch (max)",
                "from base (last step)", "encode s (median)", "bit-identical"):
        sizes.add_column(col, justify="left" if col in ("model", "dtype") else "right")
    bytes_rows = [r for r in result["results"] if "dtype" in r]
    for key in dict.fromkeys((r["model"], r["lr"], r["dtype"]) for r in bytes_rows):
        rs = [r for r in bytes_rows if (r["model"], r["lr"], r["dtype"]) == key]
        share = [r["patch_bytes"] / r["full_bytes"] for r in rs]
        sizes.add_row(key[0], f"{key[1]:g}", key[2], str(len(rs)),
                      f"{statistics.median(r['changed_share'] for r in rs):.2%}", f"{statistics.median(share):.2%}",
                      f"{max(share):.2%}", f"{rs[-1]['from_base_bytes'] / rs[-1]['full_bytes']:.2%}",
                      f"{statistics.median(r['encode_s'] for r in rs):.2f}",
                      "yes" if all(r["bit_identical"] for r in rs) else "NO")
    links = Table(title="a spot instance behind a link: join (launch to serving) and refresh (v-1 to v)")
    for col in ("model", "link", "mode", "join_s", "pull_s", "pulled", "refresh mode", "refresh_s", "refreshed"):
        links.add_column(col, justify="left" if col in ("model", "link", "mode", "refresh mode") else "right")
    for r in (r for r in result["results"] if "mode" in r):
        links.add_row(r["model"], r["link"], r["mode"], f"{r['join_s']:.2f}", f"{r['pull_s']:.2f}",
                      f"{r['pulled_bytes'] / 2**20:.1f} MiB", r["refresh_mode"], f"{r['refresh_s']:.2f}",
                      f"{r['refresh_bytes'] / 2**20:.2f} MiB")
    fan = Table(title="fan-out: hosts fetching one version at once (trainer's uplink and every link alike)")
    for col in ("model", "hosts", "link", "full_s", "source floor", "link floor", "patch_s", "patch"):
        fan.add_column(col, justify="left" if col in ("model", "link") else "right")
    for r in (r for r in result["results"] if "fanout" in r):
        fan.add_row(r["model"], str(r["fanout"]), r["fanout_link"], f"{r['full_s']:.2f}", f"{r['source_floor_s']:.2f}",
                    f"{r['link_floor_s']:.2f}", f"{r['patch_s']:.2f}", f"{r['patch_bytes'] / 2**20:.2f} MiB")
    return [t for t in (sizes, fan, links) if t.row_count] + [f"not measured: {e}" for e in result.get("errors", [])]
