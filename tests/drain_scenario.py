"""A preemption warning delivered the way clouds deliver it, through Ray's node draining, run by
tests/test_providers.py (instances as Ray nodes on this machine) and tests/in_room/room_drain.py
(instances on hosts behind links): one script for both."""

from __future__ import annotations

import psutil
import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from hybrid_util import check_invariants, patience, reference, run_step, start_fleet, wait_for
from rlboost.cluster.draining import drain_node, draining_nodes
from rlboost.cluster.resources import PREEMPTIBLE
from rlboost.hybrid.handles import WorkerState
from rlboost.hybrid.providers import RayClusterPool
from rlboost.hybrid.token_ledger import read_ledger


def node_id_of(resource: str) -> str | None:
    """The live Ray node offering `resource`, if any."""
    return next((n["NodeID"] for n in ray.nodes() if n["Alive"] and resource in n["Resources"]), None)


def room_pid(node, pid: int) -> int:
    """This process's PID of process `pid` of `node` (a host's processes have PIDs of its own namespace)."""
    host = getattr(node, "host", None)
    return host.room_pid(pid) if host is not None else pid


@ray.remote(num_cpus=0)
class Placeholder:
    """Another job's actor, keeping a node busy."""

    def ready(self) -> bool:
        return True


def drain_then_vanish(tmp_path, **fleet_cfg) -> None:
    """The cloud's warning as Ray delivers it: the GCS's drain (reason preemption, a deadline a few
    seconds out) of the node an instance runs on, mid-step. The pool warns the manager, which sends
    it no more work and takes its samples back; then the node vanishes whole (`Instance.end`: its
    process tree SIGKILLed, or its host gone), at the moment the deadline stands for here: once the
    instance holds nothing (a real deadline is wall time, which no test may depend on).
    `fleet_cfg`: how the instances stand (`instances=nodes`, or hosts and their `hosts`)."""
    ref = reference()
    fleet, _ = start_fleet(tmp_path, num_preemptible=0, provider="ray_cluster", **fleet_cfg)
    nodes = {}
    pool = RayClusterPool(fleet)
    try:
        node_ids = {}
        for label in ("spot-a", "spot-b", "spot-c"):  # spot instances with Ray nodes of their own
            nodes[label] = fleet.cluster.start_node({PREEMPTIBLE: 1, label: 1})  # one at a time: ports race
            wait_for(lambda: node_id_of(label) is not None, 60, f"the node {label}")
            node_ids[label] = node_id_of(label)
        # spot-c is going away (a drain with no deadline) before the pool sees it. A drained node that
        # runs nothing exits at once (Ray's raylet does), so something else runs there.
        other = Placeholder.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node_ids["spot-c"], soft=False))
        other = other.remote()
        ray.get(other.ready.remote())
        drain_node(node_ids["spot-c"], None)
        assert dict(draining_nodes()) == {node_ids["spot-c"]: None}
        pool.start()
        wait_for(lambda: len(fleet.killable()) == 2 and not fleet.starting, 60, "workers on the spot nodes")
        fleet.wait_ready(timeout_s=patience(120))
        on = {h.node_id: h for h in fleet.killable()}
        assert set(on) == {node_ids["spot-a"], node_ids["spot-b"]}  # none booted on the draining node
        victim = on[node_ids["spot-a"]]
        worker = psutil.Process(room_pid(nodes["spot-a"], victim.pid))
        seen = {}

        def warn(run):  # it holds samples: held still until noticed, so it cannot finish them first
            worker.suspend()
            seen["held"] = run.state.holding(victim.name)
            drain_node(node_ids["spot-a"], notice_s=5.0)

        def noticed(run):
            w = run.state.workers.get(victim.name)
            return w is not None and w.status is WorkerState.NOTICED

        def drained(run):
            return noticed(run) and not run.state.holding(victim.name) and "resumed" in seen

        def resume(run):
            seen["resumed"] = True
            worker.resume()

        def vanish(run):
            seen["tokens_at_kill"] = run.stats.tokens_by_worker[victim.name]
            nodes.pop("spot-a").end()

        def holds(run):
            return run.state.holding(victim.name) > 0 and run.stats.tokens_by_worker[victim.name] >= 8

        try:
            out, run = run_step(fleet, faults=[(holds, warn), (noticed, resume), (drained, vanish)])
        finally:
            if worker.is_running():
                worker.resume()
        check_invariants(out, run, ref, tmp_path / "ledgers")
        assert "tokens_at_kill" in seen, "the node never drained"
        assert seen["held"] > 0 and run.stats.migrated["noticed"] > 0  # its samples went back...
        assert run.stats.wasted_tokens == 0 and run.stats.in_flight_at_preemption == 0  # ...so the kill cost none
        assert run.stats.tokens_by_worker[victim.name] == seen["tokens_at_kill"]  # nothing from it after
        deaths = [name for _, name, _ in run.stats.deaths]
        if deaths:
            assert deaths == [victim.name] and run.stats.preemptions == 1
        steps = 0
        while not deaths:  # a silent host is found by its silence, maybe steps later (it serves nothing)
            steps += 1
            assert steps <= 20, "the vanished host was never declared dead"
            after, later = run_step(fleet)
            check_invariants(after, later, ref)
            deaths = [name for _, name, _ in later.stats.deaths]
            assert deaths in ([], [victim.name]), deaths
        generated = read_ledger(tmp_path / "ledgers" / f"{victim.name}.ledger").generated
        lost = {rid: n - run.stats.received[rid] for rid, n in generated.items()
                if rid.rpartition("#")[0] in run.tracked}
        assert lost and all(v == 0 for v in lost.values()), lost
        # one notice, though the node stayed draining for many ticks; none for spot-c, which ran no instance
        assert [(what, name) for _, what, name in pool.events] == [("notice", victim.name)] and pool.notices == 1
        assert pool.errors == [] and fleet.joins == 2
    finally:
        try:
            pool.stop()
            for node in nodes.values():
                node.end()
        finally:
            fleet.shutdown()
