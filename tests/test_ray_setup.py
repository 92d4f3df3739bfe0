"""Ray started by rlboost.cluster.ray_setup: token authentication on, every server on loopback.

Ray runs in this process (one instance at a time: a class-scoped fixture each); clients that try to
join it run as subprocesses with a controlled environment. Every fixture puts os.environ and the Ray
state it touched back as they were.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import re
import subprocess
import sys

import pytest
import ray

from hybrid_util import patience, wait_for
from rlboost.cluster import ray_setup
from rlboost.cluster.address import check_joinable
from rlboost.cluster.config import ClusterConfig, RaySecurityConfig
from rlboost.cluster.ray_cluster import FAST_NODE_HEALTH
from rlboost.cluster.ray_setup import (
    add_node,
    gcs_refuses_unauthenticated,
    listening_addresses,
    start_local_cluster,
    start_local_ray,
)

CLIENT = """
import sys, ray
try:
    ray.init(address=sys.argv[1], logging_level="ERROR")
    @ray.remote(num_cpus=0)
    def f():
        return 41 + 1
    print("RESULT", ray.get(f.remote(), timeout=float(sys.argv[2])), flush=True)
except Exception as e:
    print("FAILED", type(e).__name__, str(e)[:500], flush=True)
    sys.exit(3)
"""


def _is_loopback(ip: str) -> bool:
    addr = ipaddress.ip_address(ip.split("%")[0])
    mapped = getattr(addr, "ipv4_mapped", None)  # ::ffff:127.0.0.1 is gRPC's IPv4 bind on a v6 socket
    return (mapped or addr).is_loopback


def _restore_env(saved: dict[str, str]) -> None:
    for key in set(os.environ) - set(saved):
        del os.environ[key]
    for key, value in saved.items():
        if os.environ.get(key) != value:
            os.environ[key] = value


class _RayState:
    """Snapshot of what starting Ray changes in this process: os.environ and Ray's cached config."""

    def __init__(self):
        from ray._private import ray_constants
        self.env = dict(os.environ)
        self.enable_cluster = ray_constants.ENABLE_RAY_CLUSTER

    def restore(self) -> None:
        from ray._private import ray_constants
        from ray._raylet import AuthenticationTokenLoader, Config
        _restore_env(self.env)
        ray_constants.ENABLE_RAY_CLUSTER = self.enable_cluster
        Config.initialize("")  # config first, then the token cache (see ray's authentication_test_utils)
        AuthenticationTokenLoader.instance().reset_cache()


@pytest.fixture
def ray_state():
    state = _RayState()
    yield state
    state.restore()


def _assert_loopback_only(entries):
    exposed = [e for e in entries if not _is_loopback(e[0])]
    assert not exposed, f"listening beyond loopback: {exposed}"
    assert not [e for e in entries if e[0] in ("0.0.0.0", "::")]


def _client_env(tmp_home, **extra) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")}
    env.pop("RAY_ADDRESS", None)
    # RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0: as in the driver, so the client can reach a loopback GCS
    # at all (otherwise Ray rewrites 127.0.0.1 to the external IP) and the only difference between
    # clients is the token. Few GCS retries: a refused client gives up in seconds, not 20.
    env.update(HOME=str(tmp_home), RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0", RAY_USAGE_STATS_ENABLED="0",
               RAY_NUM_REDIS_GET_RETRIES="3")
    env.update(extra)
    return env


@pytest.fixture(scope="class")
def local_ray():
    """A local Ray started by start_local_ray with a fresh per-run token, for the tests of one class."""
    state = _RayState()
    os.environ.pop("RAY_AUTH_TOKEN", None)
    os.environ.pop("RAY_AUTH_TOKEN_PATH", None)
    try:
        start_local_ray(RaySecurityConfig(), {"reserved": 10, "preemptible": 10}, num_cpus=1)
        yield ray.get_runtime_context().gcs_address
    finally:
        ray.shutdown()
        state.restore()


@pytest.mark.e2e
class TestLocalRay:
    def test_actor_works_and_everything_listens_on_loopback(self, local_ray):
        @ray.remote(num_cpus=0)
        def inner(x):
            return x * 2

        @ray.remote(num_cpus=0, resources={"preemptible": 1})
        class Echo:
            def call(self, x):
                # worker -> raylet -> another worker: authenticated calls between Ray processes
                return ray.get(inner.remote(x)), os.environ.get("RAY_AUTH_TOKEN"), os.nice(0)

        actor = Echo.remote()
        doubled, token, niceness = ray.get(actor.call.remote(21), timeout=patience(30))
        assert doubled == 42
        assert niceness == os.nice(0)  # a worker runs at the driver's priority, not Ray's nice 15
        assert token and token == os.environ["RAY_AUTH_TOKEN"]  # per-run token reached the workers
        assert len(token) == 64
        assert ray.get_runtime_context().gcs_address.startswith("127.0.0.1:")

        entries = listening_addresses()
        names = {name for _, _, name in entries}
        assert "gcs_server" in names and "raylet" in names, entries
        assert any(name.startswith("ray::Echo") for name in names), entries
        _assert_loopback_only(entries)
        ray_setup.check_listeners(RaySecurityConfig())  # the startup check agrees
        ray.kill(actor)

    def test_gcs_rejects_calls_without_the_token(self, local_ray):
        import grpc
        from ray.core.generated import gcs_service_pb2, gcs_service_pb2_grpc

        assert gcs_refuses_unauthenticated(local_ray)
        with grpc.insecure_channel(local_ray) as channel:  # the same call with the token goes through
            reply = gcs_service_pb2_grpc.NodeInfoGcsServiceStub(channel).GetClusterId(
                gcs_service_pb2.GetClusterIdRequest(), timeout=patience(5),
                metadata=[("authorization", f"Bearer {os.environ['RAY_AUTH_TOKEN']}")])
        assert reply.cluster_id

    def test_joining_it_passes_the_address_check(self, local_ray):
        check_joinable(ClusterConfig(ray_address=local_ray))  # answers, and refuses calls without the token

    def test_only_a_client_with_the_token_can_join(self, local_ray, tmp_path):
        token = os.environ["RAY_AUTH_TOKEN"]
        envs = {
            "no token": _client_env(tmp_path),
            "token mode, no token": _client_env(tmp_path, RAY_AUTH_MODE="token"),
            "wrong token": _client_env(tmp_path, RAY_AUTH_MODE="token", RAY_AUTH_TOKEN="0" * 64),
            "right token": _client_env(tmp_path, RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=token),
        }
        procs = {label: subprocess.Popen([sys.executable, "-c", CLIENT, local_ray, str(patience(15))], env=env, text=True,
                                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
                 for label, env in envs.items()}
        outputs = {}
        try:
            for label, proc in procs.items():
                out, _ = proc.communicate(timeout=patience(45))
                outputs[label] = (proc.returncode, out)
        finally:
            for proc in procs.values():
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
        code, out = outputs.pop("right token")
        assert code == 0 and "RESULT 42" in out, out[-2000:]
        for label, (code, out) in outputs.items():
            assert code != 0 and "RESULT" not in out, f"{label}: {out[-2000:]}"
            assert "FAILED" in out, f"{label}: {out[-2000:]}"
            # refused for the token, not for an unreachable address
            assert "Unauthenticated" in out or "AuthenticationError" in out or "token" in out.lower(), \
                f"{label}: {out[-2000:]}"


PRESET_TOKEN = "f" * 16 + "preset-token-from-the-environment"


@pytest.fixture(scope="class")
def cluster():
    """start_local_cluster plus one node added with add_node, under a token preset in the environment."""
    state = _RayState()
    os.environ["RAY_AUTH_TOKEN"] = PRESET_TOKEN  # an operator's token is kept, not replaced
    cluster, node = None, None
    security = RaySecurityConfig(worker_niceness=3)
    try:
        cluster = start_local_cluster(security, {"reserved": 10}, num_cpus=1, system_config=FAST_NODE_HEALTH)
        node = add_node(cluster, security, num_cpus=0, resources={"preemptible": 10})
        yield cluster, node
    finally:
        ray.shutdown()
        if cluster is not None:
            if node is not None:
                cluster.remove_node(node, allow_graceful=False)
            cluster.shutdown()
        state.restore()


@pytest.mark.e2e
class TestLocalCluster:

    def test_added_node_runs_an_actor_and_listens_on_loopback(self, cluster):
        cluster, node = cluster
        assert os.environ["RAY_AUTH_TOKEN"] == PRESET_TOKEN
        assert node.node_ip_address == "127.0.0.1"

        @ray.remote(num_cpus=0, resources={"preemptible": 1})
        class Where:
            def where(self):
                return (ray.get_runtime_context().get_node_id(), os.getpid(), os.environ.get("RAY_AUTH_TOKEN"),
                        os.nice(0))

        actor = Where.remote()
        node_id, pid, token, niceness = ray.get(actor.where.remote(), timeout=patience(30))
        assert node_id == node.node_id
        assert niceness == min(19, os.nice(0) + 3)  # as configured, on an added node too
        assert token == PRESET_TOKEN

        raylet_pid = node.all_processes["raylet"][0].process.pid
        node_entries = listening_addresses(raylet_pid)  # the added node's raylet, agents and workers
        assert {name for _, _, name in node_entries} >= {"raylet"}, node_entries
        actor_entries = listening_addresses(pid)
        assert actor_entries, "the actor's core worker serves gRPC"
        _assert_loopback_only(node_entries)
        _assert_loopback_only(actor_entries)
        _assert_loopback_only(listening_addresses())  # and the head node's processes
        assert gcs_refuses_unauthenticated(cluster.address)
        ray.kill(actor)


@pytest.mark.parametrize("kwargs, field", [
    (dict(bind_host="0.0.0.0"), "bind_host"),
    (dict(bind_host="::"), "bind_host"),
    (dict(bind_host="localhost"), "bind_host"),
    (dict(bind_host="127.0.0.2"), "bind_host"),
    (dict(bind_host="not an ip"), "bind_host"),
    (dict(auth_token="yes"), "auth_token"),
])
def test_validate_rejects(kwargs, field):
    with pytest.raises(ValueError, match=rf"cluster\.ray\.{field}"):
        RaySecurityConfig(**kwargs).validate()


def test_validate_accepts():
    RaySecurityConfig().validate()
    RaySecurityConfig(auth_token=False, bind_host="10.1.2.3").validate()
    RaySecurityConfig(bind_host="fd00::5").validate()


def test_no_token_auth_in_ray_is_an_error_not_an_open_cluster(ray_state, monkeypatch):
    import ray._raylet

    monkeypatch.delattr(ray._raylet, "AuthenticationTokenLoader")
    with pytest.raises(RuntimeError, match="token authentication"):
        start_local_ray(RaySecurityConfig(), {}, num_cpus=1)
    assert not ray.is_initialized()


@pytest.mark.e2e
def test_joining_a_cluster_without_token_auth_takes_auth_token_false(ray_state):
    """The address check asks a real GCS: one started without authentication is refused unless the
    user says `cluster.ray.auth_token=false`."""
    start_local_ray(RaySecurityConfig(auth_token=False), {}, num_cpus=1)
    try:
        address = ray.get_runtime_context().gcs_address
        with pytest.raises(ValueError, match=re.escape(f"cluster.ray_address={address}: this Ray cluster accepts "
                                                       "calls without a token")):
            check_joinable(ClusterConfig(ray_address=address))
        check_joinable(ClusterConfig(ray_address=address, ray=RaySecurityConfig(auth_token=False)))
    finally:
        ray.shutdown()


class _RayletTimeouts:
    """Ray's raylet start-up wait running out, `times` times, without waiting its 30 s: the node's
    registration check fails once and the node's clock then reads 31 s later (a constant offset from
    then on, so every other wait of Ray's keeps its length)."""

    def __init__(self, monkeypatch, times: int):
        import time as real_time

        import ray._private.node
        import ray._private.services

        self.left, self.offset = times, 0.0
        get_node = ray._private.services.get_node

        def flaky_get_node(*args, **kwargs):
            if self.left > 0:
                self.left -= 1
                self.offset += 31.0
                raise RuntimeError("node info not available (a raylet that has not registered)")
            return get_node(*args, **kwargs)

        class Clock:
            def __getattr__(_, name):
                return getattr(real_time, name)

            def monotonic(_):
                return real_time.monotonic() + self.offset

        monkeypatch.setattr(ray._private.services, "get_node", flaky_get_node)
        monkeypatch.setattr(ray._private.node, "time", Clock())


def _ray_daemons() -> list[str]:
    """The GCS servers and raylets this process started (the start-ups' leftovers would show here)."""
    import psutil

    names = []
    for proc in psutil.Process().children(recursive=True):
        try:
            names += [n for n in ("gcs_server", "raylet") if n in proc.name()]
        except psutil.NoSuchProcess:
            pass
    return sorted(names)


@pytest.mark.e2e
def test_a_raylet_missing_rays_start_up_wait_is_started_again_and_the_first_try_killed(ray_state, monkeypatch):
    """Under a loaded machine a niced raylet can miss Ray's fixed 30 s start-up wait; Ray then raises
    with the node's processes running. The start is tried again and the first try's GCS and raylet
    are gone: one of each serves the run."""
    faults = _RayletTimeouts(monkeypatch, times=1)
    start_local_ray(RaySecurityConfig(), {"reserved": 1}, num_cpus=1)
    try:
        assert faults.left == 0
        assert _ray_daemons() == ["gcs_server", "raylet"]

        @ray.remote(num_cpus=0)
        def f():
            return 42

        assert ray.get(f.remote(), timeout=patience(60)) == 42
    finally:
        ray.shutdown()
    assert _ray_daemons() == []


@pytest.mark.e2e
def test_the_last_raylet_timeout_is_raised_with_nothing_left_running(ray_state, monkeypatch):
    monkeypatch.setattr(ray_setup, "RAYLET_START_TRIES", 2)
    _RayletTimeouts(monkeypatch, times=2)
    with pytest.raises(Exception, match="timed out during startup"):
        start_local_ray(RaySecurityConfig(), {}, num_cpus=1)
    assert not ray.is_initialized()
    assert _ray_daemons() == []


@pytest.mark.e2e
def test_a_cluster_node_missing_the_wait_is_added_again(ray_state, monkeypatch):
    cluster = start_local_cluster(RaySecurityConfig(), {"head": 1}, num_cpus=0, system_config={})
    try:
        faults = _RayletTimeouts(monkeypatch, times=1)
        add_node(cluster, RaySecurityConfig(), num_cpus=0, resources={"spot": 1})
        assert faults.left == 0
        assert _ray_daemons() == ["gcs_server", "raylet", "raylet"]
        assert ray.get(ray.remote(num_cpus=0, resources={"spot": 1})(lambda: 7).remote(),
                       timeout=patience(60)) == 7
    finally:
        ray.shutdown()
        cluster.shutdown()
    assert _ray_daemons() == []


DRIVER = """
import sys, time, ray
from rlboost.cluster.config import RaySecurityConfig
from rlboost.cluster.ray_setup import start_local_cluster, start_node_process
security = RaySecurityConfig()
cluster = start_local_cluster(security, {"head": 1}, num_cpus=0, system_config={})
node = start_node_process(security, cluster.address, {"spot": 1})
ray.get(ray.remote(num_cpus=0, resources={"spot": 1})(lambda: 0).remote(), timeout=float(sys.argv[1]))
print("NODE", node.pid, flush=True)
time.sleep(3600)
"""


STARTING_DRIVER = """
import socket, sys, time
from rlboost.cluster.config import RaySecurityConfig
from rlboost.cluster.ray_setup import start_node_process
with socket.socket() as s:  # a port nothing listens on: the node's start waits for a GCS there
    s.bind(("127.0.0.1", 0))
    address = f"127.0.0.1:{s.getsockname()[1]}"
node = start_node_process(RaySecurityConfig(), address, {"spot": 1})
print("NODE", node.pid, flush=True)
time.sleep(3600)
"""


@contextlib.contextmanager
def driver_of_a_node(tmp_path, script: str, *args: str, env: dict | None = None):
    """A driver process running `script`, which starts a node process and prints `NODE <pid>`; yields
    (the driver's Popen, the node's psutil.Process). Both are ended afterwards, whatever the test did."""
    import psutil

    path = tmp_path / "driver.py"
    path.write_text(script)
    driver = subprocess.Popen([sys.executable, str(path), *args], stdout=subprocess.PIPE, text=True, env=env)
    node = None
    try:
        line = driver.stdout.readline()
        assert line.startswith("NODE"), f"the driver did not start its node: {line!r}"
        node = psutil.Process(int(line.split()[1]))
        yield driver, node
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait()
        if node is not None and node.is_running():
            ray_setup.kill_node_process(node)


@pytest.mark.e2e
def test_a_node_process_ends_with_a_driver_killed_while_it_starts(tmp_path):
    """The driver can die before its node has joined (here the node waits for a GCS that never
    answers, as it does for minutes when the driver's GCS died with it): the node process leaves
    within seconds all the same, instead of waiting out Ray's start-up."""
    import psutil

    with driver_of_a_node(tmp_path, STARTING_DRIVER) as (driver, node):
        # once Ray's library is loaded, the node process is in its start (which waits on the GCS)
        wait_for(lambda: any("_raylet" in m.path for m in node.memory_maps()), 60, "the node process's start")
        driver.kill()
        driver.wait()
        gone, alive = psutil.wait_procs([node], timeout=patience(5))
        assert not alive, "the node process waited on for its GCS after its driver's death"


@pytest.mark.e2e
def test_a_node_process_ends_with_a_driver_killed_without_cleanup(tmp_path):
    """A run's driver SIGKILLed (or taken by the OOM killer) cannot end the spot nodes it started:
    each node process, in a session of its own, notices its driver is gone and ends its raylet."""
    import psutil

    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")}
    with driver_of_a_node(tmp_path, DRIVER, str(patience(120)), env=env) as (driver, node):
        tree = [node, *node.children(recursive=True)]
        assert any("raylet" in p.name() for p in tree)
        driver.kill()
        driver.wait()
        gone, alive = psutil.wait_procs(tree, timeout=patience(30))
        assert not alive, f"left running after the driver's death: {[p.name() for p in alive]}"
