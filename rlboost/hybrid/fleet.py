"""The workers of a local hybrid run: Ray, reserved and preemptible instances, and real preemptions.

Reserved workers are actors needing the `reserved` resource of the driver's node. A preemptible
instance is either a worker process of the same node (`instances=processes`) or a Ray node of its
own started on this machine (`instances=nodes`). Preempting an instance is a hard kill: SIGKILL of
its process, or removal of its Ray node plus SIGKILL of its processes (a vanished VM takes its
processes with it; a removed local node alone leaves them running). Nothing tells the manager: it
finds out the way it would on a real cluster.
"""

from __future__ import annotations

import dataclasses
import os
import random
import signal
import threading
from pathlib import Path

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from rlboost.hybrid.config import HybridConfig
from rlboost.hybrid.manager import PREEMPTIBLE, RESERVED, RolloutManager, WorkerHandle
from rlboost.hybrid.worker import RolloutWorker, WorkerSpec

WorkerActor = ray.remote(RolloutWorker)
MANY = 10_000  # resource units: enough that the custom resources never limit how many workers fit
# Ray's default takes ~15 s to declare a silent node dead; a local emulation of spot instances wants
# the cluster's view of a vanished node within about a second, like a cloud's preemption signal.
FAST_NODE_HEALTH = {"health_check_period_ms": 300, "health_check_timeout_ms": 300,
                    "health_check_failure_threshold": 3}


class Fleet:
    def __init__(self, cfg: HybridConfig, spec: WorkerSpec, manager: RolloutManager):
        self.cfg, self.spec, self.manager = cfg, spec, manager
        self.cluster = None
        self.nodes: dict[str, object] = {}  # worker name -> its own Ray node (instances=nodes)
        self._counter = 0
        self.joins = 0
        self.killed: set[str] = set()
        if ray.is_initialized():
            raise RuntimeError("a hybrid run starts its own local Ray; ray.init() was already called in this process")
        if cfg.instances == "nodes":
            from ray.cluster_utils import Cluster

            self.cluster = Cluster(initialize_head=True, head_node_args={
                "num_cpus": os.cpu_count(), "resources": {RESERVED: MANY}, "include_dashboard": False,
                "_system_config": FAST_NODE_HEALTH})
            ray.init(address=self.cluster.address, logging_level="ERROR")
        else:
            ray.init(num_cpus=os.cpu_count(), resources={RESERVED: MANY, PREEMPTIBLE: MANY},
                     include_dashboard=False, logging_level="ERROR")

    def start(self, kind: str, count: int, weights_ref=None, version: int = 0) -> list[WorkerHandle]:
        """Start `count` workers of `kind` (in parallel), load `weights_ref` at `version` if given, and
        add them to the manager. A worker that fails to start is an error naming it."""
        pending = []
        for _ in range(count):
            self._counter += 1
            name = f"{kind[:4]}-{self._counter}"
            options: dict = {"num_cpus": 0, "max_concurrency": 4, "name": None}
            if kind == PREEMPTIBLE and self.cluster is not None:
                node = self.cluster.add_node(num_cpus=0, resources={PREEMPTIBLE: MANY})
                self.nodes[name] = node
                options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(node.node_id, soft=False)
            else:
                options["resources"] = {kind: 1}
            actor = WorkerActor.options(**options).remote(self._spec_for(name))
            pending.append((name, actor, actor.info.remote()))
        handles = []
        for name, actor, info_ref in pending:
            try:
                info = ray.get(info_ref, timeout=self.cfg.call_timeout_s)
            except Exception as e:
                raise RuntimeError(f"rollout worker {name} ({kind}) failed to start: {e}") from e
            handles.append(WorkerHandle(name, kind, actor, info.pid, info.node_id, info.max_running, info.version))
        if weights_ref is not None:
            ray.get([h.actor.load_weights.remote(weights_ref, version) for h in handles],
                    timeout=self.cfg.call_timeout_s)
            for h in handles:
                h.version = version
        for h in handles:
            self.manager.add_worker(h)
        if kind == PREEMPTIBLE:
            self.joins += len(handles)
        return handles

    def replenish(self, weights_ref, version: int) -> int:
        """Bring the preemptible pool back to `num_preemptible` (killed instances are replaced at step
        boundaries); returns how many joined."""
        self.manager.reap()
        missing = self.cfg.num_preemptible - len(self.manager.alive(PREEMPTIBLE))
        if missing <= 0:
            return 0
        return len(self.start(PREEMPTIBLE, missing, weights_ref, version))

    def killable(self) -> list[WorkerHandle]:
        """Live preemptible instances not yet killed (the manager may not have noticed a kill yet), by name."""
        return sorted((h for h in self.manager.alive(PREEMPTIBLE) if h.name not in self.killed), key=lambda h: h.name)

    def preempt(self, handle: WorkerHandle, how: str | None = None) -> None:
        """Hard-kill an instance, as a cloud provider would; tells the manager nothing."""
        how = how or self.cfg.preempt_with
        if handle.name in self.killed:
            return  # its pid may belong to another process by now
        self.killed.add(handle.name)
        if how == "node":
            node = self.nodes.pop(handle.name, None)
            if node is None:
                raise ValueError(f"{handle.name} has no Ray node of its own (rollout.hybrid.instances=nodes)")
            self.cluster.remove_node(node, allow_graceful=False)
        try:
            os.kill(handle.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def shutdown(self) -> None:
        self.manager.shutdown()
        ray.shutdown()
        if self.cluster is not None:
            self.cluster.shutdown()

    def _spec_for(self, name: str) -> WorkerSpec:
        if not self.cfg.ledger_dir:
            return self.spec
        Path(self.cfg.ledger_dir).mkdir(parents=True, exist_ok=True)
        return dataclasses.replace(self.spec, ledger_path=str(Path(self.cfg.ledger_dir) / f"{name}.ledger"))


class Preempter:
    """Chaos: hard-kills a random live preemptible instance at seeded exponential intervals."""

    def __init__(self, fleet: Fleet, every_s: float, seed: int):
        self.fleet, self.every_s = fleet, every_s
        self.rng = random.Random(seed)
        self.kills: list[str] = []
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="preempter", daemon=True)

    def start(self) -> Preempter:
        if self.every_s > 0:
            self.thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(self.rng.expovariate(1.0 / self.every_s)):
            victims = self.fleet.killable()
            if victims:
                victim = self.rng.choice(victims)
                self.fleet.preempt(victim)
                self.kills.append(victim.name)
