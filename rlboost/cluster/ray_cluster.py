"""The one owner of a run's Ray: started (or joined) once by the run's assembly, handed to the rollout
fleet and to the trainer ranks, and ended by its `shutdown` alone.

Contract:
- `Cluster(cfg, instances)` connects this process to Ray: the running cluster at `cfg.ray_address`
  (after `address.check_joinable`: it answers, and refuses calls without a token unless
  `cfg.ray.auth_token` is false; ValueError otherwise, before `ray.init`), or a local one started as `rlboost.cluster.ray_setup` secures it (token, loopback, quiet driver). It
  refuses to start when this process already has a Ray: two owners would end it twice.
- What a local cluster offers depends on how the run stands up preemptible instances (`instances`):
  `None` (no instances: a colocated run's trainer ranks) or `processes` (worker processes of this
  node): the node offers `reserved` (and with processes `preemptible`) to as many as the CPUs fit;
  `nodes`: the head offers `reserved` only and each instance is a Ray node of its own on this machine
  (`start_node`), declared dead within about a second of vanishing, like a cloud's preemption;
  `hosts`: this process runs in a room of hosts (`rlboost.cluster.hosts`): the head is the first
  reserved host of `cfg.hosts` (the room), further reserved hosts join at once, and each
  `start_node` boots the next free preemptible host behind its link; Ray keeps its own (slow, as on
  a cloud) node health checks, so the run's heartbeats find a vanished host. A joined cluster offers
  what its nodes carry.
- `launch(name, kind)` is where a worker runs, an `Instance` of the kind the cluster stands up
  (`rlboost.cluster.instances`): a preemptible one's own node is up and listed when it returns.
  `start_node(resources)` is a bare node of its own. Either ends by its own `end()` or `preempt()`:
  SIGKILL of its process tree, or the whole host vanishing (link silent first, no reset).
- `on_every_node(fn, timeout_s)` runs `fn()` once on every alive node (pinned zero-CPU tasks) and
  returns each node's answer, what it raised, or that it did not answer in time: the start-up checks
  of a joined cluster (`checks.check_model_on_nodes`).
- `place_reserved_gpus(count)` places the run's reserved GPUs once; the fleet's reserved workers and
  the trainer ranks find them in `reserved_gpus` and share them by time (`rlboost.cluster.placement`).
- `check_listeners()`: the start-up check of a local run on loopback (`cluster.ray.bind_host`
  127.0.0.1), called once Ray, the trainer ranks and the rollout workers are up: every process of the
  run (this one and all it started) listens on loopback only, or `ExposedListenerError` names each one
  that does not and its address. A joined cluster (`ray_address`) and a room of hosts, whose nodes
  own addresses of their own, are not local in this sense.
- `watch_head(on_lost)`: a local head's GCS or raylet that ends under the run is reported once, with
  its cause, from a thread of its own (the run then ends, saying so).
- Starting Ray never takes the process's signal handlers (`signals_kept`: Ray's `init` installs a
  SIGTERM handler of its own in the driver); a stop while Ray starts ends whatever of it started.
- `shutdown()` disconnects from Ray and stops the local cluster it started; the users (the fleet, the
  trainer ranks) end their actors and nodes first and never shut Ray down themselves.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import threading
import time
from collections.abc import Callable

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from rlboost.cluster.address import check_joinable
from rlboost.cluster.config import ClusterConfig
from rlboost.cluster.hosts import ROOM_IP, Host, HostSpec, Room, expand_hosts
from rlboost.cluster.placement import ReservedGpus
from rlboost.cluster.instances import HostInstance, Instance, NodeProcess, WorkerProcess
from rlboost.cluster.ray_setup import (check_listeners, node_process_argv, route_ray_messages,
                                       start_local_cluster, start_local_ray, start_node_process)
from rlboost.cluster.resources import INSTANCE_KINDS, MANY, PREEMPTIBLE, RESERVED
from rlboost.stopping import StopRequested


def _call(fn):
    """A Ray task's body that runs any callable (a `functools.partial` too, which `ray.remote` refuses)."""
    return fn()


FAST_NODE_HEALTH = {"health_check_period_ms": 500, "health_check_timeout_ms": 1000,
                    "health_check_failure_threshold": 5}
"""Ray's default takes ~15 s to declare a silent node dead; a local emulation of spot instances wants
the cluster's view of a vanished node within a few seconds, like a cloud's preemption signal (2.5-5 s
here). Not faster: 3 misses of 300 ms let the GCS declare a healthy raylet dead while it started up
on a loaded 2-core machine (a CI run beside a CPU hog), a preemption nobody made."""


@contextlib.contextmanager
def signals_kept():
    """Ray's `init` installs a SIGTERM handler of its own in the driver (`sys.exit(15)`): the process
    keeps its own instead (a run's clean stop, `rlboost.stopping`), restored as soon as Ray is up. A
    SIGTERM that lands while Ray starts meets Ray's handler: its exit becomes the stop it was meant as."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.getsignal(signal.SIGTERM)
    try:
        yield
    except SystemExit as e:
        if e.code != signal.SIGTERM:
            raise
        raise StopRequested(signal.SIGTERM) from None
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


class Cluster:
    def __init__(self, cfg: ClusterConfig, instances: str | None = None, num_cpus: int | None = None,
                 num_gpus: int | None = None):
        """`num_cpus`: the logical CPUs a local Ray offers (default: this machine's). `num_gpus`: the GPUs
        a local one-node Ray offers (default: the ones Ray finds; more are logical GPUs, for tests)."""
        if instances is not None and instances not in INSTANCE_KINDS:
            raise ValueError(f"instances={instances!r}; choose None or one of {', '.join(INSTANCE_KINDS)}")
        if ray.is_initialized():
            raise RuntimeError("a run starts or joins its own Ray; ray.init() was already called in this process")
        self.cfg = cfg
        self.head = None
        """The local multi-node cluster (`ray.cluster_utils.Cluster`) when instances are nodes or hosts."""
        self.room: Room | None = None
        """The hosts, when instances are hosts."""
        self._free_hosts: list[HostSpec] = []
        self._boot_lock = threading.Lock()
        """One instance's node boots at a time (`launch`)."""
        self.reserved_gpus: ReservedGpus | None = None
        """The reserved GPUs the reserved rollout workers and the trainer ranks share (`place_reserved_gpus`)."""
        self._watching: threading.Event | None = None
        """Set to stop watching the head (`watch_head`): an orderly shutdown is no loss."""
        cpus = num_cpus or os.cpu_count() or 1
        try:
            self._start(cfg, instances, cpus, num_gpus)
        except BaseException:  # a stop or a failure while Ray starts: what of it started ends here
            self.shutdown()
            raise

    def _start(self, cfg: ClusterConfig, instances: str | None, cpus: int, num_gpus: int | None) -> None:
        with signals_kept():
            if instances == "hosts":
                self._start_hosts(cfg)
            elif cfg.ray_address:
                check_joinable(cfg)
                route_ray_messages()
                ray.init(address=cfg.ray_address, logging_level="ERROR", log_to_driver=False)
            elif instances == "nodes":
                self.head = start_local_cluster(cfg.ray, {RESERVED: MANY}, cpus, FAST_NODE_HEALTH)
            else:
                offered = {RESERVED: MANY} | ({PREEMPTIBLE: MANY} if instances == "processes" else {})
                start_local_ray(cfg.ray, offered, cpus, num_gpus)

    @property
    def local_nodes(self) -> bool:
        """Whether preemptible instances are Ray nodes of their own on this machine (`start_node`)."""
        return self.head is not None

    def resources(self) -> dict[str, float]:
        """What the whole cluster offers now (Ray's totals)."""
        return ray.cluster_resources()

    def place_reserved_gpus(self, count: int) -> ReservedGpus:
        """Place the run's `count` reserved GPUs once, for the reserved rollout workers and the trainer
        ranks to share by time (`rlboost.cluster.placement`); Ray removes them with the run's job."""
        if self.reserved_gpus is None:
            self.reserved_gpus = ReservedGpus(count, self.resources())
        return self.reserved_gpus

    def launch(self, name: str, kind: str, node_id: str | None = None, timeout_s: float = 120.0,
               stopping: Callable[[], bool] = lambda: False) -> Instance:
        """Where worker `name` of `kind` will run (`rlboost.cluster.instances`): a preemptible instance gets
        a Ray node of its own (instances=nodes or hosts), booted and listed by the cluster before this
        returns (RuntimeError if it is not within `timeout_s`, or once `stopping()`); any other worker is
        a process of a node it shares, that of its kind's resource or, with `node_id`, that node."""
        if node_id is not None:
            return WorkerProcess(name, {"scheduling_strategy": NodeAffinitySchedulingStrategy(node_id, soft=False)},
                                 local=False, node_id=node_id)
        if kind != PREEMPTIBLE or not self.local_nodes:
            return WorkerProcess(name, {"resources": {kind: 1}})
        resource = f"instance-{name}"
        with self._boot_lock:  # nodes booting side by side on one machine race for the same ports
            node = self.start_node({PREEMPTIBLE: MANY, resource: 1}, name, resource)
            deadline = time.monotonic() + timeout_s
            while (listed := self._listed(resource)) is None:
                if node.poll() is not None or time.monotonic() > deadline or stopping():
                    node.end()
                    raise RuntimeError(f"the Ray node of {name} did not come up")
                time.sleep(0.05)
        node.node_id = listed
        return node

    def start_node(self, resources: dict[str, float], name: str = "node",
                   resource: str | None = None) -> NodeProcess | HostInstance:
        """A new Ray node offering `resources`: a process tree of its own on this machine, or a
        preemptible host of its own (instances=hosts): what a spot VM is to the cluster. Whoever
        starts one ends it (`end()`), before `shutdown`. `resource`: the one of `resources` that pins
        a worker to it."""
        if self.head is None:
            raise RuntimeError("start_node needs a local cluster of nodes (rollout.hybrid.instances=nodes or hosts)")
        if self.room is None:
            return NodeProcess(name, start_node_process(self.cfg.ray, self.head.address, resources), resource)
        if not self._free_hosts:
            raise RuntimeError("every preemptible host of cluster.hosts is in use")
        return self._boot_host(self._free_hosts.pop(0), resources, name, resource)

    @staticmethod
    def _listed(resource: str) -> str | None:
        """The id of the alive node offering `resource`, once the cluster lists it."""
        return next((n["NodeID"] for n in ray.nodes() if n["Alive"] and resource in n["Resources"]), None)

    def on_every_node(self, fn, timeout_s: float) -> dict[str, object]:
        """`fn()` run once on every alive node of the cluster (a zero-CPU task pinned to it), by the
        node's address and id: its result, or the text of what it raised, or that it did not answer
        within `timeout_s`."""
        task = ray.remote(num_cpus=0, max_retries=0)(_call)
        refs = {f"{n['NodeManagerAddress']} ({n['NodeID'][:8]})":
                task.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)).remote(fn)
                for n in ray.nodes() if n["Alive"]}
        ready, _ = ray.wait(list(refs.values()), num_returns=len(refs), timeout=timeout_s)
        out: dict[str, object] = {}
        for node, ref in refs.items():
            if ref not in ready:
                ray.cancel(ref, force=True)
                out[node] = f"no answer within {timeout_s:g} s"
                continue
            try:
                out[node] = ray.get(ref)
            except Exception as e:  # what the node raised is its answer (Ray wraps it: its cause)
                cause = getattr(e, "cause", None) or e
                out[node] = f"{type(cause).__name__}: {cause}".splitlines()[0]
        return out

    def check_listeners(self) -> None:
        if not self.cfg.ray_address and self.room is None:
            check_listeners(self.cfg.ray)

    def watch_head(self, on_lost: Callable[[str], None], period_s: float = 0.5) -> bool:
        """Call `on_lost(cause)` once, from a thread of its own, if the Ray head this process started
        loses its GCS or its raylet (killed, crashed, out of memory) while the run uses it: without them
        every Ray call of the run would fail or hang, so the run must end, saying why. Returns whether
        there is such a head to watch: a joined cluster's head lives elsewhere, and its loss reaches the
        run as failed calls. `shutdown` stops the watch first."""
        node = self.head.head_node if self.head is not None else ray._private.worker._global_node
        if node is None or self.cfg.ray_address:
            return False
        watched = {name: infos[0].process for name in ("gcs_server", "raylet")
                   if (infos := node.all_processes.get(name))}
        stop = self._watching = threading.Event()

        def watch() -> None:
            while not stop.wait(period_s):
                for name, process in watched.items():
                    if process.poll() is not None and not stop.is_set():
                        code = process.returncode
                        how = (f"was killed by {signal.Signals(-code).name}" if code < 0 else
                               f"exited with status {code}")
                        on_lost(f"its {name} (pid {process.pid}) {how}")
                        return

        threading.Thread(target=watch, name="ray-head-watch", daemon=True).start()
        return bool(watched)

    def shutdown(self) -> None:
        """Disconnect from Ray and stop the local cluster this run started, if any, and its hosts."""
        if self._watching is not None:
            self._watching.set()
        ray.shutdown()
        if self.head is not None:
            self.head.shutdown()
            self.head = None
        if self.room is not None:
            self.room.close()
            self.room = None

    def _start_hosts(self, cfg: ClusterConfig) -> None:
        specs = expand_hosts(cfg.hosts)
        self.room = Room()
        try:
            head = specs[0]
            self.cfg = dataclasses.replace(cfg, ray=dataclasses.replace(cfg.ray, bind_host=ROOM_IP))
            self.head = start_local_cluster(self.cfg.ray, {RESERVED: MANY}, head.cpus, {}, num_gpus=head.gpus)
            for spec in specs[1:]:
                if spec.kind == RESERVED:
                    self._boot_host(spec, {RESERVED: MANY})
                else:
                    self._free_hosts.append(spec)
        except BaseException:
            self.shutdown()
            raise

    def _boot_host(self, spec: HostSpec, resources: dict[str, float], name: str = "host",
                   resource: str | None = None) -> HostInstance:
        host = self.room.add_host(spec)
        proc = host.run(node_process_argv(self.head.address, resources, host.ip, HOST_OBJECT_STORE_BYTES,
                                          spec.cpus, spec.gpus))
        return HostInstance(name, host, proc, self._vanish, self._freed, resource)

    def _vanish(self, host: Host) -> None:
        if self.room is not None:  # gone with the room already, if the cluster shut down first
            self.room.vanish(host)

    def _freed(self, host: Host) -> None:
        if host.spec.kind == PREEMPTIBLE:
            self._free_hosts.append(host.spec)  # a fresh instance may boot in its place


HOST_OBJECT_STORE_BYTES = 2**30
"""Object store of a host's node: room for a few versions of a small model's weights."""


__all__ = ["FAST_NODE_HEALTH", "Cluster"]
