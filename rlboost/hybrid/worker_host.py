"""Several rollout workers in one process (`rollout.hybrid.workers_per_process` > 1): what lets one
machine stand up hundreds of emulated instances (docs/simulator.md, "The manager's overhead").

A Ray worker process costs about 65 MB and a second or more of CPU to boot: 256 instances and 64
reserved engines as processes of their own do not fit a 24 GB, 2-core machine. A `WorkerHost` actor
holds up to `workers_per_process` `RolloutWorker`s; each is addressed through a `HostedActor`, which
offers the calls the manager, the report relay and the fleet make on a worker's actor
(`actor.method.remote(...)`, `actor.stream.options(...).remote()`, `end_actor`: `rlboost.hybrid.handles`),
so nothing else knows. The host's threads serve every worker's stream and control calls (`max_concurrency`: as many
per worker as a worker actor of its own has).

What it does not emulate: the hard kill of one instance. The process is shared, so preempting a
hosted worker (`HostedInstance`) tears it out of it (`WorkerHost.drop`): its stream ends in an error
at its next report (a heartbeat at most), every later call raises, as a dead actor's would, and its
tokens not yet sent are lost; the process and its other workers live on. A stand-in for benches of
the control plane with emulated engines, named as such; a real engine needs a process of its own (its
device, its memory), and the config refuses hosting with GPUs or Ray nodes per instance.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field

from rlboost.hybrid.handles import HostedActor, end_actor
from rlboost.hybrid.wire import WorkerInfo, WorkerReport
from rlboost.hybrid.worker import RolloutWorker, WorkerSpec

THREADS_PER_WORKER = 8
"""Actor threads per worker: a worker actor of its own has this many (`Fleet._launch`), a host this
many per worker it holds (its stream's thread, pings and control calls beside a long engine step)."""


class WorkerDropped(RuntimeError):
    """The worker was torn out of its host (a stand-in preemption, or given back)."""


class WorkerHost:
    """Up to `capacity` rollout workers in this process, by name (a Ray actor, threaded)."""

    def __init__(self):
        self._workers: dict[str, RolloutWorker] = {}
        self._lock = threading.Lock()

    def add(self, name: str, spec: WorkerSpec) -> WorkerInfo:
        """Build worker `name` here; its info, as a worker actor's `info()` answers once booted."""
        worker = RolloutWorker(spec)
        with self._lock:
            self._workers[name] = worker
        return worker.info()

    def call(self, name: str, method: str, args: tuple, kwargs: dict):
        """Worker `name`'s control call `method` (WorkerDropped once it was dropped)."""
        return getattr(self._worker(name), method)(*args, **kwargs)

    def stream(self, name: str) -> Iterator[WorkerReport]:
        """Worker `name`'s report stream, ending in WorkerDropped at the first report after a drop."""
        for report in self._worker(name).stream():
            self._worker(name)
            yield report

    def drop(self, name: str) -> None:
        """Tear worker `name` out: its stream fails at its next report, its calls from now on."""
        with self._lock:
            self._workers.pop(name, None)

    def names(self) -> list[str]:
        with self._lock:
            return sorted(self._workers)

    def _worker(self, name: str) -> RolloutWorker:
        with self._lock:
            worker = self._workers.get(name)
        if worker is None:
            raise WorkerDropped(f"rollout worker {name} was torn out of its shared process (pid {os.getpid()})")
        return worker


@dataclass
class HostedInstance:
    """Where a hosted worker runs (an `rlboost.cluster.instances.Instance` kind): a share of a process.
    Preempting, crashing or ending it drops the worker from its host; the process lives on."""

    name: str
    actor: HostedActor
    placement: dict
    node_id: str | None = None
    pid: int | None = None
    dropped: bool = False

    def options(self) -> dict:
        return dict(self.placement)

    def booted(self, pid: int, node_id: str) -> None:
        self.pid, self.node_id = pid, node_id

    def preempt(self) -> None:
        self.end()

    def crash(self, pid: int) -> None:
        self.end()

    def end(self) -> None:
        if not self.dropped:
            self.dropped = True
            end_actor(self.actor)

    def poll(self) -> int | None:
        return -9 if self.dropped else None


@dataclass
class WorkerHosts:
    """The fleet's hosts: each worker placed on a host of its placement with a free slot, a new host
    when none has one. `per_process`: the most workers a host holds."""

    per_process: int
    _hosts: list[tuple[str, object, set[str]]] = field(default_factory=list)
    """(placement key, actor handle, names of the workers it holds)."""
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def place(self, name: str, placement: dict, spec: WorkerSpec) -> tuple[HostedInstance, object]:
        """Worker `name` on a host placed by `placement` (Ray actor options): its instance, whose
        `actor` is the worker's, and the reference its info answers on."""
        import ray

        key = repr(sorted(placement.items()))
        with self._lock:
            entry = next((e for e in self._hosts if e[0] == key and len(e[2]) < self.per_process), None)
            if entry is None:
                options = placement | {"num_cpus": 0, "max_concurrency": THREADS_PER_WORKER * self.per_process}
                entry = (key, ray.remote(WorkerHost).options(**options).remote(), set())
                self._hosts.append(entry)
            _, host, names = entry
            names.add(name)
        actor = HostedActor(host, name)
        return HostedInstance(name, actor, placement), host.add.remote(name, spec)

    def release(self, name: str) -> None:
        """Worker `name` ended: its slot takes another."""
        with self._lock:
            for _, _, names in self._hosts:
                names.discard(name)

    def close(self) -> None:
        """Kill every host (the fleet's shutdown, after its workers were ended)."""
        import ray

        with self._lock:
            hosts, self._hosts = self._hosts, []
        for _, actor, _ in hosts:
            ray.kill(actor, no_restart=True)


__all__ = ["THREADS_PER_WORKER", "HostedInstance", "WorkerDropped", "WorkerHost", "WorkerHosts"]
