"""Where a worker runs, one type per kind behind one contract (`rlboost.cluster.instances`), and the one
meter that bills instances for the fleet and the simulator (`rlboost.spot.meter`). The kinds are driven
here with real processes; the Ray nodes and hosts they stand for are driven by test_hybrid_nodes,
test_chaos (a crash and a whole-instance preemption in turn) and the room tests."""

from __future__ import annotations

import signal
import subprocess
import sys

import psutil
import pytest

from hybrid_util import patience, wait_for
from rlboost.cluster.instances import HostInstance, Instance, NodeProcess, WorkerProcess
from rlboost.spot.meter import InstanceMeter


def test_the_meter_bills_the_seconds_each_instance_was_held():
    meter = InstanceMeter(start=10.0)
    meter.count(+1, 10.0)
    meter.count(+1, 12.0)
    assert meter.seconds(13.0) == pytest.approx(3.0 + 1.0)
    meter.count(-1, 14.0)
    assert meter.seconds(20.0) == pytest.approx(4.0 + 2.0 + 6.0)  # a window's bill: the difference of two readings
    assert meter.seconds(20.0) - meter.seconds(14.0) == pytest.approx(6.0)
    assert meter.timeline == [(10.0, 1), (12.0, 2), (14.0, 1)] and meter.live == 1


def test_the_meter_refuses_a_book_kept_out_of_order():
    meter = InstanceMeter()
    meter.count(+1, 5.0)
    with pytest.raises(ValueError, match="before the last change"):
        meter.count(-1, 4.0)
    with pytest.raises(ValueError, match="2 instances ended"):
        meter.count(-2, 6.0)
    assert meter.live == 1 and meter.seconds(6.0) == pytest.approx(1.0)


def test_every_kind_keeps_the_contract():
    kinds = [WorkerProcess("a", {}), NodeProcess("b", process=None), HostInstance("c", None, None, print, print)]
    assert all(isinstance(instance, Instance) for instance in kinds)
    assert not isinstance(object(), Instance)


def running(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def sleeper() -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])


def test_a_worker_process_is_its_instance():
    """Preempting it is SIGKILL of its worker's process; before the worker booted there is nothing to kill."""
    proc = sleeper()
    try:
        instance = WorkerProcess("pree-1", {"resources": {"preemptible": 1}})
        assert instance.options() == {"resources": {"preemptible": 1}}
        instance.preempt()  # not booted: no PID to kill
        instance.booted(proc.pid, "node-a")
        assert instance.node_id == "node-a" and instance.poll() is None
        instance.end()  # the node is not its own: nothing ends
        assert proc.poll() is None
        instance.preempt()
        assert proc.wait(timeout=patience(30)) == -signal.SIGKILL
        assert instance.poll() == -signal.SIGKILL
        instance.preempt()  # idempotent: the PID is gone
    finally:
        proc.kill()
        proc.wait()


def test_a_node_of_its_own_goes_whole_and_a_crash_takes_one_process():
    """A node process's tree (its raylet, store and workers stand in as children here) dies at once on
    a preemption; a crash kills only the process named."""
    tree = subprocess.Popen([sys.executable, "-c",
                             "import subprocess, sys, time\n"
                             "kids = [subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])"
                             " for _ in range(2)]\n"
                             "print(' '.join(str(k.pid) for k in kids), flush=True)\n"
                             "time.sleep(600)\n"], stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        first, second = (int(pid) for pid in tree.stdout.readline().split())
        node = NodeProcess("pree-2", tree, resource="instance-pree-2")
        assert node.options() == {"resources": {"instance-pree-2": 1}} and node.pid == tree.pid
        first, second = psutil.Process(first), psutil.Process(second)
        node.crash(first.pid)
        wait_for(lambda: not running(first), 30, "the crashed process to die")
        assert node.poll() is None and running(second)
        node.preempt()
        assert node.poll() is not None
        wait_for(lambda: not running(second), 30, "the rest of the tree to die")  # SIGKILL is delivered, not awaited
        node.end()  # once only: the reaped PID may be another process's by now
    finally:
        if tree.poll() is None:
            tree.kill()
            tree.wait()
