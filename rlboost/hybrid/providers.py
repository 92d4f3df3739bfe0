"""Instance providers: who decides which preemptible instances exist, on their own schedule.

A provider runs in a thread of the driver. It launches instances through the `Fleet` (they join the
manager when booted, mid-step too) and ends them with real hard kills; it never asks for more than
the offload controller's cap (`set_cap`). The manager is told nothing about a kill; a preemption
notice (`RolloutManager.notice`) is the only warning, as on a cloud.

- `FixedPool`: keep `num_preemptible` instances, replacing killed ones at once; optional seeded
  Poisson chaos kills (tests, demos).
- `TraceReplay`: instances follow a spot-availability trace (`rlboost.spot.TraceReplay` decides;
  this class acts), with optional advance notices, on wall time or on the run's progress
  (`trace.tokens_per_s`: a `ProgressClock` as its clock).
- `RayClusterPool`: the instances are the Ray nodes carrying the `preemptible` resource; one worker
  per node, node loss is preemption, a node Ray drains is a preemption notice, and more nodes are
  requested through Ray's autoscaler.
"""

from __future__ import annotations

import math
import random
import threading
import time
from collections.abc import Callable, Iterable, Set

from rlboost.cluster.draining import draining_nodes
from rlboost.hybrid.fleet import Fleet
from rlboost.hybrid.handles import PREEMPTIBLE
from rlboost.spot import ProgressClock, TraceReplay

TICK_S = 0.1


class Provider:
    """Shared loop: `tick(now)` every TICK_S seconds until `stop()`; `cap` from the controller.
    `now` is seconds since `start()` on `clock` (the monotonic clock; a test passes its own to script
    the schedule at exact moments)."""

    def __init__(self, fleet: Fleet, clock: Callable[[], float] = time.monotonic):
        self.fleet = fleet
        self.clock = clock
        self.cap: int | None = None
        self.kills: list[str] = []
        self.notices = 0
        self.events: list[tuple[float, str, str]] = []
        """(seconds since start, "notice" | "kill" | "release", instance) of everything it did to one."""
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=type(self).__name__, daemon=True)
        self.t0 = clock()

    def start(self) -> Provider:
        self.t0 = self.clock()
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)

    def set_cap(self, cap: int | None) -> None:
        self.cap = cap

    def running(self):
        """Live instances, not yet killed or given back, by name."""
        return self.fleet.killable()

    def _run(self) -> None:
        while not self._stop.wait(TICK_S):
            try:
                self.fleet.reap()
                self.tick(self.clock() - self.t0)
            except Exception as e:  # noqa: BLE001 - a provider hiccup must not end the run; it is reported
                self.errors.append(f"{type(e).__name__}: {e}")

    def tick(self, now_s: float) -> None:
        raise NotImplementedError


class FixedPool(Provider):
    def __init__(self, fleet: Fleet, size: int, preempt_every_s: float, seed: int, respawn: bool,
                 clock: Callable[[], float] = time.monotonic):
        super().__init__(fleet, clock)
        self.size, self.respawn = size, respawn
        self.every_s = preempt_every_s
        self.rng = random.Random(seed)
        self.next_kill = self.rng.expovariate(1.0 / preempt_every_s) if preempt_every_s > 0 else float("inf")

    def tick(self, now_s: float) -> None:
        if now_s >= self.next_kill:
            self.next_kill = now_s + self.rng.expovariate(1.0 / self.every_s)
            victims = self.running()
            if victims:
                victim = self.rng.choice(victims)
                self.fleet.preempt(victim, by=f"the seeded random preemptions (one per ~{self.every_s:g} s)")
                self.kills.append(victim.name)
        if self.respawn:
            target = self.size if self.cap is None else min(self.size, self.cap)
            self.fleet.launch(target - len(self.running()) - self.fleet.starting)


class TraceProvider(Provider):
    def __init__(self, fleet: Fleet, replay: TraceReplay, clock: Callable[[], float] = time.monotonic):
        super().__init__(fleet, clock)
        self.replay = replay

    def tick(self, now_s: float) -> None:
        running = {h.name: h for h in self.running()}
        # every change of the trace since the last tick, in order: a clock tied to progress may jump
        # over several of them on a fast machine
        for _, actions in self.replay.advance(now_s, sorted(running), self.fleet.starting, self.cap):
            for name, kill_at in actions.notify:
                self.fleet.manager.table.notice(name, max(0.0, kill_at - now_s))
                self.notices += 1
                self.events.append((now_s, "notice", name))
            for name in actions.kill:
                if name in running:
                    self.fleet.preempt(running[name], by="the trace")
                    self.kills.append(name)
                    self.events.append((now_s, "kill", name))
            for name in actions.release:
                if name in running:
                    self.fleet.release(running[name])
                    self.events.append((now_s, "release", name))
            self.fleet.launch(actions.start)



class RayClusterPool(Provider):
    """Instances are the cluster's nodes with the `preemptible` resource. A node that appears gets a
    worker (if the cap allows); a node that vanishes takes its worker with it, and the manager finds
    out from the node table. The cap is forwarded to the autoscaler as resource demand.

    Preemption warnings come as Ray delivers them on a cloud: the autoscaler or KubeRay drains the
    node (reason preemption, a deadline) when the cloud warns of it. Every tick reads Ray's draining
    nodes (`rlboost.cluster.draining`) and gives each instance on one a preemption notice, once
    (`drain_notices`): the manager stops dispatching to it and takes its samples back, so the kill at
    the deadline wastes no token. A draining node gets no new worker (Ray would still place one)."""

    def __init__(self, fleet: Fleet):
        super().__init__(fleet)
        self.served: set[str] = set()
        self.requested: int | None = None
        self.warned: set[str] = set()
        """Instances given a notice for their node's drain."""

    def tick(self, now_s: float) -> None:
        import ray

        draining = dict(draining_nodes())
        self._warn(draining, now_s)
        nodes = [n for n in ray.nodes() if n["Alive"] and n.get("Resources", {}).get(PREEMPTIBLE, 0) > 0]
        self.served &= {n["NodeID"] for n in nodes}
        for node in nodes:
            if node["NodeID"] in self.served or node["NodeID"] in draining:
                continue
            if self.cap is not None and len(self.served) >= self.cap:
                break
            self.served.add(node["NodeID"])
            self.fleet.launch_on(node["NodeID"])
        if self.cap is not None and self.cap != self.requested:
            from ray.autoscaler.sdk import request_resources

            request_resources(bundles=[{PREEMPTIBLE: 1}] * self.cap)
            self.requested = self.cap

    def _warn(self, draining: dict[str, float | None], now_s: float) -> None:
        running = [(h.name, h.node_id) for h in self.running()]
        self.warned &= {name for name, _ in running}
        for name, seconds in drain_notices(draining, running, self.warned, time.time()):
            self.fleet.manager.table.notice(name, seconds)
            self.warned.add(name)
            self.notices += 1
            self.events.append((now_s, "notice", name))


def drain_notices(draining: dict[str, float | None], instances: Iterable[tuple[str, str]], warned: Set[str],
                  now_unix_s: float) -> list[tuple[str, float]]:
    """The notices Ray's drains call for: (instance, seconds until its node's deadline; inf when the
    drain named none) for each instance in `instances` ((name, node id)) on a node in `draining`
    (node id -> deadline in Unix seconds or None) that is not in `warned` yet. Pure."""
    return [(name, math.inf if draining[node] is None else max(0.0, draining[node] - now_unix_s))
            for name, node in sorted(instances) if node in draining and name not in warned]


def make_provider(cfg, fleet: Fleet, seed: int, progress: ProgressClock | None = None) -> Provider:
    """The provider of `rollout.hybrid.provider`. `progress`: the run's, which a `trace` provider
    with `trace.tokens_per_s` > 0 replays on (None there: an error)."""
    if cfg.provider == "trace":
        if cfg.trace.tokens_per_s > 0 and progress is None:
            raise ValueError("rollout.hybrid.trace.tokens_per_s > 0 needs the run's progress clock")
        clock = progress if cfg.trace.tokens_per_s > 0 else time.monotonic
        return TraceProvider(fleet, TraceReplay.from_config(cfg.trace), clock=clock)
    if cfg.provider == "ray_cluster":
        return RayClusterPool(fleet)
    return FixedPool(fleet, cfg.num_preemptible, cfg.preempt_every_s, seed, cfg.respawn)
