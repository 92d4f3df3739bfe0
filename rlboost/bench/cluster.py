"""`rlboost bench cluster`: the hybrid rollout on emulated hosts behind real links (`instances=hosts`).

For each model and link rate: a room of 1 reserved host and `spot_hosts` preemptible hosts, each a
Ray node in network namespaces of its own behind a `tbf`-shaped link (`rlboost.cluster.hosts`). It
measures, in one run:
- `join_s`: a new instance from launch to serving (host boot, Ray node, worker, weights pulled and
  verified), `pull_s` the pull alone and `weight_bytes_per_join` what it pulled; `transfer_floor_s`
  is those bytes over the link rate, what the link alone costs;
- `step_s`: one rollout step on the reserved worker and the spot instances (after a warm-up step);
- `vanish_detect_s`: a host vanishes mid-step (its link silent, its processes gone, no reset) until
  the manager declares it dead; `kill_detect_s`: the same for the worker's process killed on a host
  that lives on (its sockets reset at once);
- `lost_tokens`: tokens the step's samples lack at the end (every sample has exactly max_tokens,
  EOS ignored), and `wasted_tokens`: tokens generated and thrown away, over both faulty steps.
Then `one_host` rows: the same step with every worker on the room's own node (`instances=processes`),
the one-host run the link rows compare with. The room's processes share this machine's cores: step
times say how the links and the control plane behave, not how fast a cluster of GPUs is.
"""

from __future__ import annotations

import dataclasses
import random
import time
from dataclasses import asdict, dataclass, field

from rich.table import Table

from rlboost.cluster.config import ClusterConfig
from rlboost.cluster.hosts import HostEntry, in_room, link_bits_s
from rlboost.cluster.ray_cluster import Cluster
from rlboost.cluster.resources import PREEMPTIBLE, RESERVED
from rlboost.engine import EngineConfig, SamplingParams
from rlboost.hybrid.config import HybridConfig
from rlboost.hybrid.fleet import Fleet
from rlboost.hybrid.harness import OwnClusterFleet, first_preemptible_past, run_step
from rlboost.hybrid.manager import RolloutManager
from rlboost.hybrid.worker import WorkerSpec
from rlboost.models import ModelConfig, load_model
from rlboost.rollout import new_groups

NEEDS_ROOM = True
"""The CLI runs this bench inside a room of emulated hosts (`rlboost.cluster.hosts.enter_room`)."""


@dataclass
class ClusterBenchConfig:
    models: list[str] = field(default_factory=lambda: ["tiny:qwen2", "smollm2"])
    """Models (`model.path` values)."""
    links: list[str] = field(default_factory=lambda: ["10gbit", "1gbit", "100mbit"])
    """Link rates of the spot hosts, as tc writes them."""
    spot_hosts: int = 4
    """Preemptible hosts, one instance each, beside the reserved host."""
    prompts: int = 8
    """Prompts in a step."""
    n: int = 2
    """Samples per prompt."""
    max_tokens: int = 48
    """Tokens per sample (EOS ignored)."""
    heartbeat_timeout_s: float = 5.0
    """rollout.hybrid.heartbeat_timeout_s: the silence after which a worker is declared dead."""
    seed: int = 0
    """Seed of prompts, sampling and the fault moments."""


class _Row:
    data_source, ground_truth, extra_info = "bench", None, {}


@dataclass
class _Workload:
    prompts: list
    params: SamplingParams
    n: int
    seed: int
    steps: int = 0

    def step(self, fleet: Fleet, faults=()):
        """One measured rollout step (`rlboost.hybrid.harness.run_step`: the hand-off once the reserved
        worker streamed); `faults`: (tokens streamed by the victim, act(victim)) to do once a live
        preemptible worker not hit yet has streamed that many. Returns (groups, run, fault times)."""
        self.steps += 1
        fired: dict[str, float] = {}
        scripted = []
        for tokens, act in faults:
            victim = first_preemptible_past(tokens, skip=lambda: set(fired))

            def hit(run, victim=victim, act=act):
                name = victim(run)
                fired[name] = time.monotonic() - run.t0
                act(name)
            scripted.append((lambda run, victim=victim: victim(run) is not None, hit))
        groups, run = run_step(fleet.manager, new_groups(self.steps, self.prompts, self.n, self.seed), self.params, 0,
                               faults=scripted)
        return groups, run, fired

    def lost_tokens(self, groups) -> int:
        expected = len(self.prompts) * self.n * self.params.max_tokens
        return expected - sum(len(s.response_ids) for g in groups for s in g.samples)


def bench_cluster(cfg: ClusterBenchConfig) -> dict:
    if not in_room():
        raise RuntimeError("rlboost bench cluster runs inside a room of emulated hosts; the CLI enters one")
    for link in cfg.links:
        link_bits_s(link, "--links")
    rng = random.Random(cfg.seed)
    work = _Workload([(i, [rng.randrange(3, 250) for _ in range(12)], _Row()) for i in range(cfg.prompts)],
                     SamplingParams(temperature=1.0, max_tokens=cfg.max_tokens, ignore_eos=True), cfg.n, cfg.seed)
    rows = []
    for model in cfg.models:
        state = {k: p.detach() for k, p in load_model(ModelConfig(path=model)).model.named_parameters()}
        for link in cfg.links:
            rows.append(_on_hosts(cfg, model, link, state, work))
        rows.append(_one_host(cfg, model, state, work))
    return {"config": asdict(cfg), "heartbeat_timeout_s": cfg.heartbeat_timeout_s, "results": rows}


def _fleet(cfg: ClusterBenchConfig, model: str, instances: str, cluster_cfg: ClusterConfig) -> OwnClusterFleet:
    """An empty fleet on a cluster of its own (its shutdown ends the cluster)."""
    hybrid = HybridConfig(num_preemptible=cfg.spot_hosts, instances=instances,
                          heartbeat_timeout_s=cfg.heartbeat_timeout_s)
    engine = EngineConfig(device="cpu", max_num_seqs=cfg.prompts * cfg.n, stream_interval=4)
    cluster = Cluster(cluster_cfg, instances)
    try:
        spec = WorkerSpec(ModelConfig(path=model), engine, [], heartbeat_interval_s=0.5)
        return OwnClusterFleet(hybrid, spec, RolloutManager(hybrid, cluster.cfg.weights), cluster)
    except BaseException:
        cluster.shutdown()
        raise


def _on_hosts(cfg: ClusterBenchConfig, model: str, link: str, state: dict, work: _Workload) -> dict:
    hosts = [HostEntry(kind="reserved", name="res-0", cpus=2),
             HostEntry(kind="preemptible", count=cfg.spot_hosts + 1, link=link)]  # one spare: a host boots while one dies
    fleet = _fleet(cfg, model, "hosts", dataclasses.replace(ClusterConfig(), hosts=hosts))
    try:
        manifest = fleet.publish(state, 0)
        fleet.start(RESERVED, 1)
        fleet.manager.pulls.take_stats()
        for _ in range(cfg.spot_hosts):  # one after another: each join has its link to itself
            fleet.start(PREEMPTIBLE, 1)
            fleet.wait_ready()
        joins = fleet.manager.pulls.take_stats()
        work.step(fleet)  # warm-up: every engine has run once
        groups, run, _ = work.step(fleet)
        step_s = run.stats.rollout_s

        def vanish(victim):
            fleet.preempt(fleet.worker(victim))

        def crash(victim):
            fleet.preempt(fleet.worker(victim), how="process")

        detect, lost, wasted = {}, 0, 0
        for label, act in (("vanish", vanish), ("kill", crash)):
            fleet.replenish()
            fleet.wait_ready()
            groups, run, fired = work.step(fleet, [(cfg.max_tokens // 3, act)])
            (victim, at), = fired.items()
            detect[label] = next((t - at for t, name, _ in run.stats.deaths if name == victim), float("nan"))
            lost += work.lost_tokens(groups)
            wasted += run.stats.wasted_tokens
        pulls = [(s, b) for _, s, b, _ in joins.pulls]
        bits = link_bits_s(link)
        return {"model": model, "link": link, "step_s": step_s,
                "join_s": sum(joins.provision_s) / max(1, len(joins.provision_s)),
                "pull_s": sum(s for s, _ in pulls) / max(1, len(pulls)),
                "weight_bytes_per_join": manifest.nbytes, "transfer_floor_s": manifest.nbytes * 8 / bits,
                "vanish_detect_s": detect["vanish"], "kill_detect_s": detect["kill"],
                "lost_tokens": lost, "wasted_tokens": wasted}
    finally:
        fleet.shutdown()


def _one_host(cfg: ClusterBenchConfig, model: str, state: dict, work: _Workload) -> dict:
    fleet = _fleet(cfg, model, "processes", ClusterConfig())
    try:
        fleet.publish(state, 0)
        fleet.start_pool({RESERVED: 1, PREEMPTIBLE: cfg.spot_hosts})
        fleet.wait_ready()
        work.step(fleet)
        groups, run, _ = work.step(fleet)
        return {"model": model, "link": "one host", "step_s": run.stats.rollout_s,
                "lost_tokens": work.lost_tokens(groups), "wasted_tokens": run.stats.wasted_tokens}
    finally:
        fleet.shutdown()


def render(result: dict) -> Table:
    table = Table(title=f"hybrid rollout on emulated hosts (heartbeat timeout {result['heartbeat_timeout_s']} s)")
    columns = ("model", "link", "step_s", "join_s", "pull_s", "transfer_floor_s", "weight_bytes_per_join",
               "vanish_detect_s", "kill_detect_s", "lost_tokens", "wasted_tokens")
    for column in columns:
        table.add_column(column.replace("_", " "), justify="left" if column in ("model", "link") else "right")
    for row in result["results"]:
        table.add_row(*(_fmt(row.get(column)) for column in columns))
    return table


def _fmt(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.2f}"
    if isinstance(value, int) and value >= 10**6:
        return f"{value / 2**20:.1f} MiB"
    return str(value)
