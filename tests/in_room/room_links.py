"""Inside a room (run by tests/test_hosts.py): hosts as namespaces behind real links. A host's link
is shaped, cut and restored without the host knowing; a vanished host takes all its processes with it
and resets no connection; a host's Ray node joins the room's cluster offering its own GPUs."""

from __future__ import annotations

import socket
import threading
import time

import numpy as np
import psutil
import pytest
import ray

from hybrid_util import patience
from rlboost.cluster.config import ClusterConfig
from rlboost.cluster.hosts import HostEntry, HostSpec, Room, in_room
from rlboost.cluster.ray_cluster import Cluster

ECHO = ("import socket,sys\n"
        "s=socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind((sys.argv[1], 7000)); s.listen()\n"
        "c,_=s.accept()\n"
        "while (d := c.recv(65536)): c.sendall(d)\n")


@pytest.fixture
def room():
    assert in_room(), "these tests run inside a room: tests/test_hosts.py starts them"
    room = Room()
    yield room
    room.close()


def connect(host, timeout_s: float = 30.0) -> socket.socket:
    deadline = time.monotonic() + patience(timeout_s)
    while True:
        try:
            return socket.create_connection((host.ip, 7000), timeout=patience(30))
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def start_echo(host):
    import sys

    return host.run([sys.executable, "-c", ECHO, host.ip])


def test_a_link_carries_no_more_than_its_rate(room):
    host = room.add_host(HostSpec("spot-0", "preemptible", 1, 0, 20e6))
    start_echo(host)
    conn = connect(host)
    payload = b"x" * (4 * 2**20)
    got = []

    def read_back():
        n = 0
        while n < len(payload):
            n += len(conn.recv(1 << 20))
        got.append(n)

    reader = threading.Thread(target=read_back)
    t0 = time.monotonic()
    reader.start()
    conn.sendall(payload)
    reader.join()
    elapsed = time.monotonic() - t0
    assert got == [len(payload)]
    assert len(payload) * 8 / elapsed <= 20e6 * 1.1, f"{len(payload) * 8 / elapsed / 1e6:.1f} Mbit/s over a 20 Mbit/s link"


def test_a_cut_link_drops_silently_and_comes_back(room):
    host = room.add_host(HostSpec("spot-0", "preemptible", 1, 0, None))
    start_echo(host)
    conn = connect(host)
    conn.sendall(b"ping")
    assert conn.recv(16) == b"ping"
    room.cut(host)
    conn.sendall(b"lost?")
    # a reset or a refusal would come at once; a busy machine can only delay an answer, never make one
    conn.settimeout(1.0)
    with pytest.raises(socket.timeout):  # dropped, not refused nor reset
        conn.recv(16)
    room.restore(host)
    conn.settimeout(patience(30))
    assert conn.recv(16) == b"lost?"  # TCP retransmitted it once the link was back


def test_a_vanished_host_takes_every_process_and_resets_nothing(room):
    host = room.add_host(HostSpec("spot-0", "preemptible", 1, 0, None))
    echo = start_echo(host)
    conn = connect(host)
    procs = [psutil.Process(pid) for pid in host.pids()]
    assert len(procs) >= 2, "the host's init and its echo server"
    room.vanish(host)
    assert echo.poll() is not None and not host.alive()
    assert not [p for p in procs if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    conn.sendall(b"anyone?")  # no reset came back: the peer looks alive until a timeout says otherwise
    conn.settimeout(1.0)
    with pytest.raises(socket.timeout):
        conn.recv(16)


def test_a_hosts_ray_node_joins_with_its_gpus_and_vanishes_whole():
    cfg = ClusterConfig(hosts=[HostEntry(kind="reserved", name="res-0", cpus=1),
                               HostEntry(kind="preemptible", count=1, gpus=2, link="100mbit")])
    cluster = Cluster(cfg, "hosts")
    try:
        node = cluster.start_node({"preemptible": 1, "instance-x": 1})
        with pytest.raises(RuntimeError, match="in use"):  # cluster.hosts has one preemptible host
            cluster.start_node({"preemptible": 1})
        deadline = time.monotonic() + patience(120)
        while not any(n["Alive"] and "instance-x" in n["Resources"] for n in ray.nodes()):
            assert node.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        [info] = [n for n in ray.nodes() if n["Alive"] and "instance-x" in n["Resources"]]
        assert info["NodeManagerAddress"] == node.host.ip and info["Resources"]["GPU"] == 2

        @ray.remote(num_cpus=0, num_gpus=1, resources={"instance-x": 0.5})
        def sees(array):
            import os
            return os.environ.get("CUDA_VISIBLE_DEVICES"), int(array.sum())

        seen = ray.get([sees.remote(np.ones(2**20, np.uint8)) for _ in range(2)])
        assert sorted(s[0] for s in seen) == ["0", "1"] and {s[1] for s in seen} == {2**20}
        tree = [psutil.Process(pid) for pid in node.host.pids()]
        assert len(tree) > 3  # the host's init, the node's raylet and its helpers, its workers
        node.end()
        assert node.poll() is not None
        assert not [p for p in tree if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
        again = cluster.start_node({"preemptible": 1})  # the host boots afresh for the next instance
        assert again.host is not node.host and again.host.spec == node.host.spec
    finally:
        cluster.shutdown()
