"""Inside a room (run by tests/test_hosts.py): a spot host warned the way clouds warn, through Ray's
drain of its node (reason preemption, a deadline), then vanished whole: the same script as
tests/test_providers.py runs on Ray nodes of this machine (tests/drain_scenario.py)."""

from __future__ import annotations

from drain_scenario import drain_then_vanish
from rlboost.cluster.hosts import HostEntry


def test_a_host_ray_drains_for_preemption_is_a_notice_and_its_vanishing_wastes_nothing(tmp_path):
    drain_then_vanish(tmp_path, instances="hosts", heartbeat_timeout_s=3.0,
                      hosts=[HostEntry(kind="reserved", name="res-0", cpus=2),
                             HostEntry(kind="preemptible", count=3, link="100mbit")])
