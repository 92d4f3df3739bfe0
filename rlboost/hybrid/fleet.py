"""The workers of a hybrid run on the run's cluster: reserved and preemptible instances, and real
preemptions.

Reserved workers are actors needing the `reserved` resource of the driver's node. A worker owns the
GPUs it uses (`rollout.hybrid.gpus_per_worker`, `rlboost.cluster.placement`): reserved ones share the
reserved GPUs with the trainer ranks by time; a preemptible one has its own. A preemptible
instance is a worker process of the same node (`instances=processes`), a Ray node of its own started
on this machine (`instances=nodes`), or a Ray node on an emulated host of its own behind a link
(`instances=hosts`): an `Instance` of its kind (`rlboost.cluster.instances`, from `Cluster.launch`),
which the fleet preempts, crashes and ends without knowing which kind it is. Preempting an instance
is a hard kill of the whole instance: SIGKILL of its process, or of its Ray node's whole process tree (a
vanished VM takes its processes with it; a removed local node alone leaves them running), or the
whole host vanishing, its link silent first (`preempt_with=process`: only the worker's process dies).
Nothing tells the manager: it finds out the way it would on a real cluster. The instances held are
billed on one `InstanceMeter` (`rlboost.spot.meter`), the simulator's.

The fleet ends its workers and their nodes (`shutdown`); Ray itself is the run's `Cluster`, which
outlives the fleet.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable
from pathlib import Path

import ray
from ray.util.placement_group import PlacementGroup, remove_placement_group

from rlboost.cluster.host_copy import base_reader
from rlboost.cluster.instances import Instance
from rlboost.cluster.manifest import WeightManifest
from rlboost.cluster.placement import worker_options
from rlboost.cluster.publisher import Publisher
from rlboost.cluster.ray_cluster import Cluster
from rlboost.hybrid.config import PREEMPT_WITH, HybridConfig
from rlboost.hybrid.handles import PREEMPTIBLE, RESERVED, WorkerHandle, end_actor, first_line
from rlboost.hybrid.manager import RolloutManager
from rlboost.hybrid.token_ledger import ledger_path
from rlboost.hybrid.worker import RolloutWorker, WorkerSpec
from rlboost.hybrid.worker_host import THREADS_PER_WORKER, WorkerHosts
from rlboost.run_log import event
from rlboost.spot.meter import InstanceMeter

WorkerActor = ray.remote(RolloutWorker)


class Fleet:
    def __init__(self, cfg: HybridConfig, spec: WorkerSpec, manager: RolloutManager, cluster: Cluster):
        """`cluster`: the run's Ray (and its weight store's settings), started by the caller, who shuts
        it down after the fleet."""
        self.cfg, self.spec, self.manager, self.cluster = cfg, spec, manager, cluster
        self.instances: dict[str, Instance] = {}
        """Worker name -> where it runs (reserved workers too), until it ends."""
        self._counter = 0
        self._lock = threading.Lock()
        self._boots: list[threading.Thread] = []
        """Threads booting instances: shutdown waits for them, as none may touch Ray after it stops."""
        self.joins = 0
        self.starting = 0
        """Instances asked for whose worker is not admitted yet."""
        self.killed: set[str] = set()
        self.released: set[str] = set()
        self.meter = InstanceMeter(time.monotonic())
        """The preemptible instances held over time (monotonic clock): what a cloud bills."""
        self._billed: set[str] = set()
        """Instances on the meter now: launched (booting too), not ended."""
        self.groups: dict[str, PlacementGroup] = {}
        """Worker name -> the placement group of its GPUs, when it has one of its own (tensor parallelism)."""
        self._reserved_slots: dict[str, int] = {}
        """Live reserved worker -> its share of the reserved GPUs (a replacement takes the dead one's)."""
        self.manifest: WeightManifest | None = None
        self.publisher = Publisher(cluster.cfg.weights, spec.engine.serving_dtype(spec.model.dtype),
                                   load_base=base_reader(spec.model) if spec.join_from_base else None)
        """Publishes the versions of a trainer in this process (sharded trainer ranks have their own)."""
        self.boot_failures: list[str] = []
        self._stopping = False
        self.hosts = WorkerHosts(cfg.workers_per_process) if cfg.workers_per_process > 1 else None
        """Processes that hold several workers each (rollout.hybrid.workers_per_process > 1), else None."""
        manager.table.on_retire = self._retire
        manager.table.on_dead = self._replace
        manager.reader.start()  # the report relay boots before any worker's boot queues ahead of it

    def publish(self, state: dict | WeightManifest, version: int) -> WeightManifest:
        """Put version `version` in the weight store once and make it the one to serve: reserved
        workers load it before this returns, the others pull it in the background. A manifest is a
        version already in the store (published by sharded trainer ranks, bucket by bucket)."""
        if isinstance(state, WeightManifest):
            if state.version != version:
                raise ValueError(f"asked to serve version {version} with the manifest of version {state.version}")
            self.manifest = state
        else:
            self.manifest = self.publisher.publish(list(state.items()), version).manifest
        self.manager.publish(self.manifest)  # the previous manifest, and its buckets, are freed now
        return self.manifest

    def start(self, kind: str, count: int, node_id: str | None = None) -> list[WorkerHandle]:
        """Start `count` workers of `kind` in parallel and admit them to the manager, which has them
        pull the current weights. A worker that fails to start is an error naming it; one serving
        another model is refused and left out of the result. `node_id`: on that existing Ray node."""
        return self.start_pool({kind: count}, node_id)

    def start_pool(self, counts: dict[str, int], node_id: str | None = None) -> list[WorkerHandle]:
        """`start` for several kinds at once (`counts`: kind -> workers), all booting side by side: a run's
        reserved workers and its first instances boot together instead of one kind after the other."""
        launched = time.monotonic()
        pending = []
        for kind, count in counts.items():
            for _ in range(count):
                if self._stopping:
                    break
                pending.append((kind, *self._launch(kind, node_id)))
        handles = []
        for kind, name, actor, info_ref in pending:
            try:
                info = self._await_boot(name, info_ref)
            except Exception as e:
                self._ended(name)
                self._end_instance(name)  # its node or host too, which nothing else would end before shutdown
                if kind == PREEMPTIBLE and (name in self.killed or self._stopping):
                    continue  # preempted while it booted
                raise RuntimeError(f"rollout worker {name} ({kind}) failed to start: {first_line(e)}") from e
            with self._lock:
                instance = self.instances.get(name)
            if instance is not None:  # None: the fleet shut down while it booted
                instance.booted(info.pid, info.node_id)
            handle = WorkerHandle(name, kind, actor, info.pid, info.node_id, info.max_running, info.version,
                                  info.fingerprint, info.checksum, launched=launched, kv_tokens=info.kv_tokens)
            if self.manager.add_worker(handle):
                handles.append(handle)
                if kind == PREEMPTIBLE:
                    self.joins += 1
            else:
                self._ended(name)
                self._end_instance(name)
        return handles

    def _launch(self, kind: str, node_id: str | None) -> tuple[str, object, object]:
        """Create one worker's instance (`Cluster.launch`: for one on a node of its own, the node, booted)
        and actor: its name, the actor and the reference its boot answers on. An instance is billed from
        the moment it is asked for, its boot included."""
        with self._lock:
            self._counter += 1
            name = f"{kind[:4]}-{self._counter}"
            if kind == PREEMPTIBLE:
                self._billed.add(name)
                self.meter.count(+1, time.monotonic())
        try:
            instance = self.cluster.launch(name, kind, node_id, self.cfg.call_timeout_s, lambda: self._stopping)
        except BaseException:
            self._ended(name)
            raise
        if self.hosts is not None:  # a share of a process (the config refuses GPUs and nodes here)
            instance, info_ref = self.hosts.place(name, instance.options(), self._spec_for(name))
            with self._lock:
                self.instances[name] = instance
            return name, instance.actor, info_ref
        with self._lock:
            self.instances[name] = instance
        own_process = {"num_cpus": 0, "max_concurrency": THREADS_PER_WORKER, "name": None}
        options = self._with_gpus(name, kind, own_process | instance.options(), node_id)
        actor = WorkerActor.options(**options).remote(self._spec_for(name))
        return name, actor, actor.info.remote()

    def launch(self, count: int, node_id: str | None = None,
               on_boot: Callable[[str | None], None] = lambda error: None) -> None:
        """Ask for `count` preemptible instances without waiting: they join (mid-step too) once
        booted, and serve once their pull verifies. `node_id`: boot it on that Ray node. `on_boot`,
        called from the boot thread before `starting` drops: None once they booted, else the first
        line of why not (kept in `boot_failures` too); the provider reports it, once per cause."""
        if count <= 0:
            return
        with self._lock:
            self.starting += count

        def boot():
            try:
                self.start(PREEMPTIBLE, count, node_id)
            except Exception as e:  # noqa: BLE001 - a failed boot is a missing instance, not a failed run
                self.boot_failures.append(first_line(e))
                on_boot(first_line(e))
            else:
                on_boot(None)
            finally:
                with self._lock:
                    self.starting -= count

        thread = threading.Thread(target=boot, name="instance-boot", daemon=True)
        with self._lock:
            self._boots = [t for t in self._boots if t.is_alive()] + [thread]
        thread.start()

    def wait_ready(self, timeout_s: float | None = None) -> None:
        """Between steps: wait until every live worker serves the current version (or is dropped)."""
        self.manager.wait_ready(timeout_s)

    def reap(self) -> None:
        """Forget (and kill) workers the manager declared dead, and their nodes or hosts (a fenced
        instance whose link came back is ended, not counted twice); they stop being billed."""
        for h in self.manager.table.reap():
            self._ended(h.name)
            self._end_instance(h.name)

    def replenish(self) -> int:
        """Bring the preemptible pool back to `num_preemptible` at once; returns how many joined."""
        self.reap()
        missing = self.cfg.num_preemptible - len(self.manager.table.alive(PREEMPTIBLE))
        return len(self.start(PREEMPTIBLE, missing)) if missing > 0 else 0

    # ---- the workers, from any thread (the manager's table is its own) -------------------------------

    def worker(self, name: str) -> WorkerHandle:
        """The handle of worker `name`, alive or not; KeyError when the fleet never had it."""
        handle = self.manager.table.get(name)
        if handle is None:
            raise KeyError(f"no worker {name!r} in the fleet")
        return handle

    def alive(self, kind: str | None = None) -> list[WorkerHandle]:
        """The workers not declared dead (of `kind`, when given)."""
        return self.manager.table.alive(kind)

    def handles(self) -> list[WorkerHandle]:
        """Every worker the manager holds, the dead ones not yet reaped included."""
        return self.manager.table.handles()

    def fence(self, name: str, reason: str) -> None:
        """Declare worker `name` dead for `reason` (its owner thread applies it): whatever it sends after
        is dropped (invariant 6), alive or not."""
        self.manager.table.fence(name, reason)

    def notice(self, name: str, seconds: float) -> None:
        """A preemption notice for instance `name`, `seconds` before it goes, as a cloud's warning."""
        self.manager.table.notice(name, seconds)

    def killable(self) -> list[WorkerHandle]:
        """Live preemptible instances not yet killed or given back (the manager may not have noticed
        yet), by name."""
        return sorted((h for h in self.manager.table.alive(PREEMPTIBLE) if h.name not in self.killed | self.released),
                      key=lambda h: h.name)

    def preempt(self, handle: WorkerHandle, how: str | None = None, by: str = "a hard kill") -> None:
        """Hard-kill an instance, as a cloud provider would (`how`: `instance`, the whole of it, or
        `process`, its worker's process alone; default `rollout.hybrid.preempt_with`); tells the manager
        nothing it acts on (it finds the death itself), only who did it (`by`), for the console's line
        about it. Billing stops now; a crashed instance's node or host ends when its worker is reaped."""
        how = how or self.cfg.preempt_with
        if how not in PREEMPT_WITH:
            raise ValueError(f"preempt how={how!r}; choose one of {', '.join(PREEMPT_WITH)}")
        if handle.name in self.killed:
            return
        self.killed.add(handle.name)
        self.manager.table.causes[handle.name] = f"preempted by {by}"
        self._ended(handle.name)
        if how == "process":
            instance = self.instances.get(handle.name)
            if instance is not None:  # None: ended already, when its dead worker was reaped
                instance.crash(handle.pid)
        else:
            self._end_instance(handle.name, preempted=True)

    def release(self, handle: WorkerHandle) -> None:
        """Give an instance back (beyond the cap): a graceful end, not a preemption. The manager takes
        its samples back exactly, then ends it (`_retire`)."""
        if handle.name in self.killed or handle.name in self.released:
            return
        self.released.add(handle.name)
        self.manager.table.release(handle.name)

    def _replace(self, handle: WorkerHandle) -> bool:
        """The table's `on_dead`: a reserved worker that died is replaced like an instance, on its share of
        the reserved GPUs, by a thread (this runs in the step's loop). True: a replacement boots."""
        with self._lock:
            self._reserved_slots.pop(handle.name, None)
        if handle.kind != RESERVED or self._stopping or not self.cfg.replace_reserved:
            return False

        def boot():
            try:
                if not self.start(RESERVED, 1):
                    refused = self.manager.pulls.stats.refused
                    raise RuntimeError(f"refused: {refused[-1][1]}" if refused else "the fleet is shutting down")
                event("reserved worker %s replaced", handle.name)
            except Exception as e:  # noqa: BLE001 - the step hears of it, and fails if nobody else is left
                self.manager.table.replacement_failed(first_line(e))

        thread = threading.Thread(target=boot, name="reserved-replacement", daemon=True)
        with self._lock:
            self._boots = [t for t in self._boots if t.is_alive()] + [thread]
        thread.start()
        return True

    def _retire(self, handle: WorkerHandle) -> None:
        """The manager's `on_retire`: the instance holds nothing any more; end it and its node."""
        self._ended(handle.name)
        end_actor(handle.actor)
        self._end_instance(handle.name)

    def billed_seconds(self) -> float:
        """Preemptible instance-seconds billed from the fleet's start until now (a window's bill is the
        difference of two readings)."""
        with self._lock:
            return self.meter.seconds(time.monotonic())

    def _end_instance(self, name: str, preempted: bool = False) -> None:
        """Forget where worker `name` ran and end it (or preempt it), once."""
        with self._lock:
            instance = self.instances.pop(name, None)
        if instance is not None and preempted:
            instance.preempt()
        elif instance is not None:
            instance.end()
        if self.hosts is not None:
            self.hosts.release(name)

    def _ended(self, name: str) -> None:
        """Worker `name` is done for the books: off the meter, its GPUs' placement group removed."""
        with self._lock:
            if name in self._billed:
                self._billed.discard(name)
                self.meter.count(-1, time.monotonic())
        group = self.groups.pop(name, None)
        if group is not None:  # its GPUs go back for the next instance
            remove_placement_group(group)

    def shutdown(self) -> None:
        self._stopping = True
        with self._lock:
            boots = list(self._boots)
        for thread in boots:  # each gives up within a poll interval once it sees _stopping
            thread.join(timeout=30)
        self.manager.shutdown()
        for name in list(self.groups) + list(self._billed):
            self._ended(name)
        for name in list(self.instances):
            self._end_instance(name)
        if self.hosts is not None:
            self.hosts.close()

    def _await_boot(self, name: str, info_ref):
        """Booting worker `name`'s info; gives up at call_timeout_s, or at once when the fleet stops."""
        deadline = time.monotonic() + self.cfg.call_timeout_s
        while not ray.wait([info_ref], timeout=0.2)[0]:
            if self._stopping:
                raise RuntimeError("the fleet is shutting down")
            if time.monotonic() > deadline:
                raise TimeoutError(f"no answer in {self.cfg.call_timeout_s} s")
        return ray.get(info_ref)

    def _with_gpus(self, name: str, kind: str, options: dict, node_id: str | None) -> dict:
        """`options` plus the GPUs worker `name` owns (`rlboost.cluster.placement`): reserved worker j
        its share of the reserved GPUs, placed once for it and the trainer ranks; a preemptible one
        GPUs of its own, in a placement group of its own for tensor parallelism (removed when it ends)."""
        gpus = self.cfg.gpus_per_worker
        reserved = None
        if kind == RESERVED and gpus:
            reserved = self.cluster.reserved_gpus or self.cluster.place_reserved_gpus(self.cfg.num_reserved * gpus)
            with self._lock:
                slot = min(set(range(self.cfg.num_reserved)) - set(self._reserved_slots.values()))
                self._reserved_slots[name] = slot
        else:
            slot = 0
        options, group = worker_options(gpus, options, reserved, slot, node_id)
        if group is not None:
            self.groups[name] = group
        return options

    def _spec_for(self, name: str) -> WorkerSpec:
        """The spec of worker `name`: the fleet's, with the run's reporting settings and its own ledger."""
        ledger = None
        if self.cfg.ledger_dir:
            Path(self.cfg.ledger_dir).mkdir(parents=True, exist_ok=True)
            ledger = str(ledger_path(self.cfg.ledger_dir, name))
        return dataclasses.replace(self.spec, ledger_path=ledger, report_delay_s=self.cfg.report_delay_s)
