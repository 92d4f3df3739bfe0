"""Instance providers acting on real processes and Ray nodes: trace replay starts instances when the
trace offers them, hard-kills running ones when it drops, warns ahead when asked, never exceeds the
controller's cap; the Ray-cluster pool serves the nodes that carry the `preemptible` resource and
turns Ray's drains (a cloud's preemption warning) into notices."""

from __future__ import annotations

import math
import os

import pytest
import ray

from drain_scenario import drain_then_vanish
from hybrid_util import check_invariants, reference, run_step, start_fleet, wait_for
from rlboost.cluster.resources import MANY, PREEMPTIBLE, RESERVED
from rlboost.hybrid.providers import RayClusterPool, TraceProvider, drain_notices
from rlboost.spot import SpotTrace, TraceReplay

pytestmark = pytest.mark.e2e  # providers starting and killing real instances: `make test-e2e`


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


class ScriptedClock:
    """The provider's clock, set by the test: the trace's moments come when the fleet is ready for them,
    however long a busy machine takes to boot an instance. It counts its reads, one per tick of the
    provider: `wait_ticks` waits for whole ticks, not for seconds in which a busy machine may run none."""

    def __init__(self, t: float = 0.0):
        self.t = t
        self.reads = 0

    def __call__(self) -> float:
        self.reads += 1
        return self.t

    def wait_ticks(self, n: int) -> None:
        """Until the provider has run `n` whole ticks from now (a tick reads the clock, then acts)."""
        start = self.reads
        wait_for(lambda: self.reads > start + n, 10, f"{n} ticks of the provider")


def test_trace_replay_starts_kills_warns_and_respects_the_cap(tmp_path):
    # two instances, one vanishes at 16 s (warned 4 s ahead), one comes back at 20 s
    trace = SpotTrace(times_s=(0.0, 16.0, 20.0), counts=(2, 1, 2))
    fleet, _ = start_fleet(tmp_path, num_preemptible=0)
    clock = ScriptedClock()
    provider = TraceProvider(fleet, TraceReplay(trace, seed=0, notice_s=4.0), clock=clock)
    try:
        provider.set_cap(1)  # the controller allows one: the trace's second is not asked for
        provider.start()
        wait_for(lambda: len(fleet.killable()) == 1, 30, "the first instance")
        clock.wait_ticks(3)
        assert len(fleet.killable()) + fleet.starting == 1
        provider.set_cap(None)
        wait_for(lambda: len(fleet.killable()) == 2, 30, "the second instance")
        before = {h.name: h for h in fleet.killable()}
        clock.t = 11.0  # nothing due within 4 s
        clock.wait_ticks(3)
        assert provider.events == []
        clock.t = 12.5  # the drop at 16 s is now within the notice
        wait_for(lambda: provider.notices, 10, "the notice")
        assert provider.kills == [] and len(fleet.killable()) == 2  # warned, still serving
        clock.t = 16.0
        wait_for(lambda: provider.kills, 10, "the kill")
        [(noticed_at, _, noticed), (killed_at, _, victim)] = provider.events
        assert noticed in before and victim == noticed  # the instance warned is the one killed...
        assert noticed_at == 12.5 and killed_at == 16.0  # ...ahead of the drop, and at it
        wait_for(lambda: not alive(before[victim].pid), 5, "the victim's process to die")  # a hard kill
        clock.wait_ticks(3)
        assert len(fleet.killable()) + fleet.starting == 1  # no replacement before the trace offers one
        clock.t = 20.0
        wait_for(lambda: len(fleet.killable()) == 2 and victim not in {h.name for h in fleet.killable()}, 40,
                 "the replacement at 20 s")
        assert provider.errors == []
    finally:
        provider.stop()
        fleet.shutdown()


def test_the_ray_cluster_pool_serves_nodes_with_the_preemptible_resource(tmp_path):
    from rlboost.cluster.config import RaySecurityConfig
    from rlboost.cluster.ray_cluster import FAST_NODE_HEALTH
    from rlboost.cluster.ray_setup import add_node, start_local_cluster

    ref = reference()
    security = RaySecurityConfig()
    # an existing cluster (token auth, loopback) that the run joins by address
    cluster = start_local_cluster(security, {RESERVED: MANY}, os.cpu_count(), FAST_NODE_HEALTH)
    ray.shutdown()
    try:
        fleet, _ = start_fleet(tmp_path, num_preemptible=0, provider="ray_cluster", ray_address=cluster.address)
        pool = RayClusterPool(fleet)
        try:
            pool.set_cap(1)
            pool.clock = clock = ScriptedClock()  # it reads no time, but counts its ticks
            pool.start()
            first, second = (add_node(cluster, security, num_cpus=0, resources={PREEMPTIBLE: 1}) for _ in range(2))
            wait_for(lambda: len(fleet.killable()) == 1, 40, "a worker on a preemptible node")
            clock.wait_ticks(3)
            assert pool.launches == 1 and len(fleet.killable()) == 1  # the cap: one node stays unused
            (h,) = fleet.killable()
            assert h.node_id in {first.node_id, second.node_id}
            pool.set_cap(2)
            wait_for(lambda: len(fleet.killable()) == 2, 40, "a worker on the second node")
            fleet.wait_ready()
            gone = next(n for n in (first, second) if n.node_id == h.node_id)
            out, run = run_step(fleet)  # one step with both, then the node goes
            check_invariants(out, run, ref)
            cluster.remove_node(gone, allow_graceful=False)
            os.kill(h.pid, 9)  # a vanished VM takes its processes with it
            out, run = run_step(fleet)
            check_invariants(out, run, ref)
            assert h.fenced and run.stats.preemptions == 1
        finally:
            pool.stop()
            fleet.shutdown()
    finally:
        cluster.shutdown()


def test_drained_nodes_give_each_instance_on_them_one_notice():
    instances = [("pree-2", "node-b"), ("pree-1", "node-a"), ("pree-3", "node-c")]
    draining = {"node-a": 1000.0, "node-c": None, "node-z": 990.0}  # node-z runs none of them
    assert drain_notices(draining, instances, set(), now_unix_s=970.0) == [("pree-1", 30.0), ("pree-3", math.inf)]
    # warned once: the same drains on the next tick call for nothing, a new drain for its instance only
    assert drain_notices(draining, instances, {"pree-1", "pree-3"}, now_unix_s=971.0) == []
    assert drain_notices(draining | {"node-b": 980.0}, instances, {"pree-1", "pree-3"}, 971.0) == [("pree-2", 9.0)]
    # a deadline already past: the notice says 0 s, it is not dropped
    assert drain_notices({"node-a": 1000.0}, instances, set(), now_unix_s=1005.0) == [("pree-1", 0.0)]
    assert drain_notices({}, instances, set(), now_unix_s=0.0) == []


def test_a_node_ray_drains_for_preemption_is_a_notice_and_its_kill_wastes_nothing(tmp_path):
    drain_then_vanish(tmp_path, instances="nodes")
