"""Where a rollout worker runs, as a type per kind: what a cloud rents, preempts and bills.

Contract (`Instance`):
- `name`: the worker's name; `node_id`: the Ray node the worker runs on, once known (a node of its
  own is known when the cluster lists it, a shared node when the worker booted).
- `options()`: the Ray actor options that place a worker there (a resource of its own, or of its kind,
  or a pin to one node); the caller adds what the worker itself needs (GPUs, concurrency).
- `booted(pid, node_id)`: the worker's process, once it answered (a process instance IS that process).
- `preempt()`: the instance goes whole and at once, with no cleanup, as a spot VM does: the worker's
  process, its Ray node's whole process tree, or its host vanishing (link silent first). Nothing is told.
- `crash(pid)`: one process of it dies (SIGKILL, as the instance sees PIDs); the instance lives on.
- `end()`: the run is done with it (given back, reaped, shut down): for a node or a host, the same
  hard end as a preemption, which nothing of it outlives. Both are idempotent.
- `poll()`: None while it runs, else how it ended (`subprocess.Popen.poll`).

Kinds, one class each, made by `Cluster.launch` (or `Cluster.start_node` for a bare node):
- `WorkerProcess`: a worker process on a node it shares (`instances=processes`, a reserved worker, a
  worker on a node of a joined cluster);
- `NodeProcess`: a Ray node of its own on this machine (`instances=nodes`);
- `HostInstance`: a Ray node on an emulated host of its own behind a link (`instances=hosts`).

Nothing here keeps books: billing is `rlboost.spot.meter.InstanceMeter`, kept by the fleet (and by the
simulator for its own instances).
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from rlboost.cluster.hosts import Host


@runtime_checkable
class Instance(Protocol):
    name: str
    node_id: str | None

    def options(self) -> dict: ...

    def booted(self, pid: int, node_id: str) -> None: ...

    def preempt(self) -> None: ...

    def crash(self, pid: int) -> None: ...

    def end(self) -> None: ...

    def poll(self) -> int | None: ...


def _sigkill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _sigkill_on(node_id: str, pid: int) -> None:
    """SIGKILL `pid` on Ray node `node_id`, wherever it runs (a task pinned there; not awaited: a node
    that is gone already has nothing left to kill)."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    task = ray.remote(num_cpus=0, max_retries=0)(_sigkill)
    task.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False)).remote(pid)


@dataclass
class WorkerProcess:
    """A worker process on a node it shares with others: the instance is the process. `placement`:
    the actor options that put it there; `local`: the node is this machine's (its PIDs are ours to
    signal), else a pinned task kills on its node."""

    name: str
    placement: dict
    local: bool = True
    node_id: str | None = None
    pid: int | None = None

    def options(self) -> dict:
        return dict(self.placement)

    def booted(self, pid: int, node_id: str) -> None:
        self.pid, self.node_id = pid, node_id

    def preempt(self) -> None:
        if self.pid is not None:
            self.crash(self.pid)

    def crash(self, pid: int) -> None:
        if self.local or self.node_id is None:
            _sigkill(pid)
        else:
            _sigkill_on(self.node_id, pid)

    def end(self) -> None:
        """Nothing to end: its actor is killed by whoever started it, and the node is not its own."""

    def poll(self) -> int | None:
        """None while its process runs, or where this machine cannot see it (not booted, another node's)."""
        if self.pid is None or not self.local:
            return None
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return -signal.SIGKILL
        except PermissionError:
            pass
        return None


@dataclass
class NodeProcess:
    """A Ray node of its own on this machine: one process tree in a session of its own
    (`rlboost.cluster.node_process`). `resource`: the custom resource only it offers, which pins the
    worker there (None for a bare node)."""

    name: str
    process: object
    """Its `subprocess.Popen`: every process of the node descends from it."""
    resource: str | None = None
    node_id: str | None = None
    _gone: bool = field(default=False, repr=False)

    @property
    def pid(self) -> int:
        return self.process.pid

    def options(self) -> dict:
        return {"resources": {self.resource: 1}} if self.resource else {}

    def booted(self, pid: int, node_id: str) -> None:
        self.node_id = node_id

    def preempt(self) -> None:
        from rlboost.cluster.ray_setup import kill_node_process

        if not self._gone:  # once: its PID, reaped, may be another process's by a second call
            self._gone = True
            kill_node_process(self.process)

    def crash(self, pid: int) -> None:
        _sigkill(pid)

    def end(self) -> None:
        self.preempt()

    def poll(self) -> int | None:
        return self.process.poll()


@dataclass
class HostInstance:
    """A Ray node on an emulated host of its own behind a link (`rlboost.cluster.hosts`): its PIDs are its
    namespace's. `vanish(host)`: the room's; `freed(host)`: called once, when it has gone, so a fresh
    instance may boot on its host's spec."""

    name: str
    host: Host
    process: object
    """The node's `subprocess.Popen` (its `nsenter`), as the room sees it."""
    vanish: Callable[[Host], None]
    freed: Callable[[Host], None]
    resource: str | None = None
    node_id: str | None = None
    _gone: bool = field(default=False, repr=False)

    def options(self) -> dict:
        return {"resources": {self.resource: 1}} if self.resource else {}

    def booted(self, pid: int, node_id: str) -> None:
        self.node_id = node_id

    def preempt(self) -> None:
        if self._gone:
            return
        self._gone = True
        self.vanish(self.host)
        self.freed(self.host)

    def crash(self, pid: int) -> None:
        self.host.kill_process(pid)

    def end(self) -> None:
        self.preempt()

    def poll(self) -> int | None:
        return self.process.poll() if self.host.alive() else -signal.SIGKILL


__all__ = ["HostInstance", "Instance", "NodeProcess", "WorkerProcess"]
