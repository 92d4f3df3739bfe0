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

Failures never stop a provider, and never flood the console nor hammer the cloud: after a failed
boot every provider holds its launches back, exponentially longer while boots keep failing
(`rlboost.policies.launch_backoff`, `rollout.hybrid.launch_backoff_s`), and failed boots and
failed ticks are each reported as one warning line per cause, then as rare summary lines
(`rlboost.policies.failure_digest`, `rollout.hybrid.failure_summary_s`), on the console of a run.
Both run on the provider's thread at its ticks, on the monotonic clock (`turn(wall_s)`).
"""

from __future__ import annotations

import logging
import math
import random
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Set

from rlboost.cluster.draining import draining_nodes
from rlboost.hybrid.fleet import Fleet
from rlboost.hybrid.handles import PREEMPTIBLE, first_line
from rlboost.policies.failure_digest import FailureDigest, seconds
from rlboost.policies.launch_backoff import LaunchBackoff
from rlboost.spot import ProgressClock, TraceReplay

logger = logging.getLogger(__name__)
BOOT_FAILED = "an instance failed to boot: %s"


class Provider:
    """Shared loop: a `turn` every `rollout.hybrid.provider_tick_s` seconds until `stop()` (the ended boots, then `tick(now)`,
    its launches through `launch`, which holds them back after failed boots); `cap` from the controller.
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
        """`Type: first line` of every failed tick (each also reported, once per cause)."""
        cfg = fleet.cfg
        self.backoff = LaunchBackoff(cfg.launch_backoff_s, cfg.launch_backoff_max_s)
        self.boot_digest = FailureDigest(cfg.failure_summary_s, cfg.failure_summary_max_s)
        self.tick_digest = FailureDigest(cfg.failure_summary_s, cfg.failure_summary_max_s)
        self.launches = 0
        """Boots asked of the fleet (each of one or more instances)."""
        self.booting_on: dict[str | None, int] = {}
        """Boots under way, by the Ray node asked for (None: any)."""
        self._booted: deque[tuple[str | None, str | None]] = deque()
        """(node, None or why not) of each boot that ended, from the boot threads, for the next turn."""
        self._wall_s = 0.0
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
        while not self._stop.wait(self.fleet.cfg.provider_tick_s):
            self.turn(time.monotonic())

    def turn(self, wall_s: float) -> None:
        """One tick of the provider at monotonic time `wall_s` (the clock of the launch backoff and of
        the reports; a test passes its own): take the ended boots, reap, `tick`, report."""
        self._wall_s = wall_s
        self._take_ended_boots(wall_s)
        tick_failed = f"provider {type(self).__name__}: a tick failed: %s"
        try:
            self.fleet.reap()
            self.tick(self.clock() - self.t0)
        except Exception as e:  # noqa: BLE001 - a provider hiccup must not end the run; it is reported
            self.errors.append(first_line(e))
            _warn(tick_failed, [self.tick_digest.failed(wall_s, first_line(e))])
        _warn(tick_failed, self.tick_digest.due(wall_s))
        _warn(BOOT_FAILED, self.boot_digest.due(wall_s, note=self._launch_note(wall_s)))

    def _take_ended_boots(self, wall_s: float) -> None:
        """What the boot threads told since the last turn: a boot resets the backoff, a failure
        lengthens it and is reported if its cause is new."""
        while self._booted:
            node, error = self._booted.popleft()
            self.booting_on[node] -= 1
            if not self.booting_on[node]:
                del self.booting_on[node]
            if error is None:
                self.backoff.booted()
            else:
                self.backoff.failed(wall_s)
                _warn(BOOT_FAILED, [self.boot_digest.failed(wall_s, error, note=self._launch_note(wall_s))])

    def launch(self, count: int, node_id: str | None = None) -> bool:
        """Ask the fleet for `count` instances (on Ray node `node_id`), unless launches are held back
        after failed boots (then False: the next ticks ask again)."""
        if count <= 0 or not self.backoff.may_launch(self._wall_s):
            return False
        self.launches += 1
        self.booting_on[node_id] = self.booting_on.get(node_id, 0) + 1
        self.fleet.launch(count, node_id, on_boot=lambda error: self._booted.append((node_id, error)))
        return True

    def _launch_note(self, wall_s: float) -> str:
        """When launches go on, for a line about failed boots."""
        wait_s = self.backoff.wait_s(wall_s)
        if wait_s > 0:
            return f"next launch in {seconds(wait_s)} s"
        return "an instance booted since" if not self.backoff.failures else ""

    def tick(self, now_s: float) -> None:
        raise NotImplementedError


class FixedPool(Provider):
    """`preempt_every`: mean time between seeded kills on `clock`, in `unit` (seconds, or the run's
    generated tokens when `clock` is its progress); 0: none."""

    def __init__(self, fleet: Fleet, size: int, preempt_every: float, seed: int, respawn: bool,
                 clock: Callable[[], float] = time.monotonic, unit: str = "s"):
        super().__init__(fleet, clock)
        self.size, self.respawn = size, respawn
        self.every, self.unit = preempt_every, unit
        self.rng = random.Random(seed)
        self.next_kill = self.rng.expovariate(1.0 / preempt_every) if preempt_every > 0 else float("inf")

    def tick(self, now_s: float) -> None:
        if now_s >= self.next_kill:
            # drawn from when the kill was due, not from this tick: the kills do not drift by a tick each
            self.next_kill += self.rng.expovariate(1.0 / self.every)
            victims = self.running()
            if victims:
                victim = self.rng.choice(victims)
                self.fleet.preempt(victim, by=f"the seeded random preemptions (one per ~{self.every:g} {self.unit})")
                self.kills.append(victim.name)
        if self.respawn:
            target = self.size if self.cap is None else min(self.size, self.cap)
            self.launch(target - len(self.running()) - self.fleet.starting)


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
            self.launch(actions.start)


class RayClusterPool(Provider):
    """Instances are the cluster's nodes with the `preemptible` resource. A node that appears gets a
    worker (if the cap allows); a node that vanishes takes its worker with it, and the manager finds
    out from the node table. The cap is forwarded to the autoscaler as resource demand. A node whose
    worker failed to boot, or died while the node lives on, gets another (after the launch backoff).

    Preemption warnings come as Ray delivers them on a cloud: the autoscaler or KubeRay drains the
    node (reason preemption, a deadline) when the cloud warns of it. Every tick reads Ray's draining
    nodes (`rlboost.cluster.draining`) and gives each instance on one a preemption notice, once
    (`drain_notices`): the manager stops dispatching to it and takes its samples back, so the kill at
    the deadline wastes no token. A draining node gets no new worker (Ray would still place one)."""

    def __init__(self, fleet: Fleet):
        super().__init__(fleet)
        self.requested: int | None = None
        self.warned: set[str] = set()
        """Instances given a notice for their node's drain."""

    def tick(self, now_s: float) -> None:
        import ray

        draining = dict(draining_nodes())
        self._warn(draining, now_s)
        nodes = [n for n in ray.nodes() if n["Alive"] and n.get("Resources", {}).get(PREEMPTIBLE, 0) > 0]
        # a node is served by its live worker or the boot of one
        served = {n["NodeID"] for n in nodes} & ({h.node_id for h in self.running()} | set(self.booting_on))
        for node in nodes:
            if node["NodeID"] in served or node["NodeID"] in draining:
                continue
            if self.cap is not None and len(served) >= self.cap:
                break
            if not self.launch(1, node["NodeID"]):
                break  # held back after failed boots
            served.add(node["NodeID"])
        if self.cap is not None and self.cap != self.requested:
            from ray.autoscaler.sdk import request_resources

            request_resources(bundles=[{PREEMPTIBLE: 1}] * self.cap)
            self.requested = self.cap

    def _warn(self, draining: dict[str, float | None], now_s: float) -> None:
        running = [(h.name, h.node_id) for h in self.running()]
        self.warned &= {name for name, _ in running}
        for name, seconds_left in drain_notices(draining, running, self.warned, time.time()):
            self.fleet.manager.table.notice(name, seconds_left)
            self.warned.add(name)
            self.notices += 1
            self.events.append((now_s, "notice", name))


def _warn(template: str, lines: list[str | None]) -> None:
    """Each line (None: nothing to report) as a warning: the console of a run shows it (`rlboost.run_log`)."""
    for line in lines:
        if line is not None:
            logger.warning(template, line)


def drain_notices(draining: dict[str, float | None], instances: Iterable[tuple[str, str]], warned: Set[str],
                  now_unix_s: float) -> list[tuple[str, float]]:
    """The notices Ray's drains call for: (instance, seconds until its node's deadline; inf when the
    drain named none) for each instance in `instances` ((name, node id)) on a node in `draining`
    (node id -> deadline in Unix seconds or None) that is not in `warned` yet. Pure."""
    return [(name, math.inf if draining[node] is None else max(0.0, draining[node] - now_unix_s))
            for name, node in sorted(instances) if node in draining and name not in warned]


def make_provider(cfg, fleet: Fleet, seed: int, progress: ProgressClock | None = None) -> Provider:
    """The provider of `rollout.hybrid.provider`. `progress`: the run's, which a `trace` provider
    with `trace.tokens_per_s` > 0 replays on, and the `fixed` pool's chaos with
    `preempt_every_tokens` > 0 kills on (None there: an error)."""
    if cfg.provider == "trace":
        if cfg.trace.tokens_per_s > 0 and progress is None:
            raise ValueError("rollout.hybrid.trace.tokens_per_s > 0 needs the run's progress clock")
        clock = progress if cfg.trace.tokens_per_s > 0 else time.monotonic
        return TraceProvider(fleet, TraceReplay.from_config(cfg.trace), clock=clock)
    if cfg.provider == "ray_cluster":
        return RayClusterPool(fleet)
    if cfg.preempt_every_tokens > 0:
        if progress is None:
            raise ValueError("rollout.hybrid.preempt_every_tokens > 0 needs the run's progress clock")
        return FixedPool(fleet, cfg.num_preemptible, cfg.preempt_every_tokens, seed, cfg.respawn,
                         clock=progress.tokens, unit="tokens")
    return FixedPool(fleet, cfg.num_preemptible, cfg.preempt_every_s, seed, cfg.respawn)
