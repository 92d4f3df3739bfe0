"""Starting the local Ray of a run securely (`cluster.ray.*`), which its trainer ranks and rollout
workers share (`rlboost.cluster.ray_cluster.Cluster` calls these; nothing else starts Ray).

Three choices, all by default:

* Token authentication. Every gRPC server of Ray (GCS, raylets, object managers, workers) and the
  HTTP servers of its agents reject a call that does not carry the cluster's token. The token is
  handed to the driver and, through the environment they inherit, to every process Ray starts:
  `RAY_AUTH_MODE=token` plus `RAY_AUTH_TOKEN` (a fresh random token per run unless the
  environment already names one with `RAY_AUTH_TOKEN` or `RAY_AUTH_TOKEN_PATH`). No token file is
  written. If this Ray cannot authenticate, starting fails instead of running open.
* Loopback only. Ray picks between two bindings from the node's IP address alone: a node whose
  address is 127.0.0.1 has its servers listen on 127.0.0.1 (GCS, raylet, object manager, core
  workers, dashboard agent, metrics agent and exporter, runtime-env agent); any other address
  makes them listen on every interface. So the node is given 127.0.0.1, and this process's Ray is
  told that local Ray clusters are single-machine (`RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`), without
  which `ray.init(address="127.0.0.1:...")` rewrites the address to the machine's external IP
  and cannot reach the loopback-only GCS. The dashboard stays off and its (module-less) head
  process listens nowhere; Ray's usage-stats reporting is turned off.
* Quiet driver. Worker and raylet logs stay in Ray's session folder (`/tmp/ray/session_*/logs`)
  instead of being echoed to the console, and the messages Ray's raylets publish to the driver (a
  paragraph on every worker death, which is every preemption here) go to the `rlboost.ray` logger,
  that is the run's log file (`rlboost.run_log`), not stdout; what a failed call raised still
  reaches the driver with its exception.

Both start functions change this process's environment (`os.environ`) so that every Ray process
started later, including nodes added with `add_node`, gets the same settings.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import secrets
from typing import TYPE_CHECKING, Callable, TypeVar

import ray

from rlboost.cluster.config import LOOPBACK, RaySecurityConfig
from rlboost.run_log import RAY_MESSAGES

if TYPE_CHECKING:
    from ray.cluster_utils import Cluster

logger = logging.getLogger(__name__)

AUTH_MODE_ENV = "RAY_AUTH_MODE"
AUTH_TOKEN_ENV = "RAY_AUTH_TOKEN"
AUTH_TOKEN_PATH_ENV = "RAY_AUTH_TOKEN_PATH"
SINGLE_MACHINE_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
"""Ray's switch for multi-machine clusters; 0 makes it take 127.0.0.1 as this node's address."""
USAGE_STATS_ENV = "RAY_USAGE_STATS_ENABLED"
RAYLET_START_TRIES = 3
"""How many times a Ray node is started before its start-up timeout is final (`with_raylet_retry`)."""
RAYLET_TIMEOUT_MESSAGE = "timed out during startup"
"""What Ray's node start-up raises when its raylet has not registered with the GCS in time."""

T = TypeVar("T")


def route_ray_messages() -> None:
    """Send what Ray's raylets publish to this driver to the `rlboost.ray` logger instead of stdout.

    Ray prints them from a thread of the driver through `ray._private.worker.print_to_stdstream`
    (even with log_to_driver=False), a module global looked up at each call, so replacing it routes
    them; there is no public switch. Idempotent; a Ray without that function keeps printing (and the
    quiet-console test fails)."""
    from ray._private import worker as ray_worker

    printer = getattr(ray_worker, "print_to_stdstream", None)
    if printer is None or getattr(printer, "routed_by_rlboost", False):
        return

    def to_log(data: dict, ignore_prefix: bool = False) -> None:
        log = logging.getLogger(RAY_MESSAGES)
        for line in data.get("lines", ()):
            log.info("(%s) %s", data.get("pid", "ray"), line)

    to_log.routed_by_rlboost = True
    ray_worker.print_to_stdstream = to_log


def start_local_ray(security: RaySecurityConfig, resources: dict[str, float], num_cpus: int,
                    num_gpus: int | None = None) -> None:
    """Start a one-node local Ray and connect this process to it, per `security`: token auth on,
    servers on `bind_host`, dashboard off, only errors logged. `num_gpus`: the GPUs it offers (None:
    the ones Ray finds; more than that are logical, for tests)."""
    _prepare(security)
    route_ray_messages()

    def start() -> None:
        ray.init(address="local", num_cpus=num_cpus, num_gpus=num_gpus, resources=dict(resources),
                 include_dashboard=False, dashboard_host=LOOPBACK, _node_ip_address=security.bind_host,
                 logging_level="ERROR", log_to_driver=False,
                 _system_config={"worker_niceness": security.worker_niceness})

    with_raylet_retry(start, "the local Ray", reset=ray.shutdown)
    try:
        _verify_started(security)
    except BaseException:
        ray.shutdown()
        raise


def start_local_cluster(security: RaySecurityConfig, head_resources: dict[str, float], num_cpus: int,
                        system_config: dict, num_gpus: int = 0) -> "Cluster":
    """Start the head node of a local multi-node Ray cluster and connect this process to it, per
    `security`. Add nodes with `add_node(cluster, security, ...)`; remove them with
    `cluster.remove_node`; stop with `ray.shutdown()` then `cluster.shutdown()`."""
    _prepare(security)
    route_ray_messages()
    from ray.cluster_utils import Cluster

    cluster = with_raylet_retry(lambda: Cluster(initialize_head=True, head_node_args={
        "num_cpus": num_cpus, "num_gpus": num_gpus, "resources": dict(head_resources), "include_dashboard": False,
        "dashboard_host": LOOPBACK, "node_ip_address": security.bind_host,
        "_system_config": {"worker_niceness": security.worker_niceness} | dict(system_config)}),
        "the head of the local Ray cluster")
    try:
        ray.init(address=cluster.address, logging_level="ERROR", log_to_driver=False)
        _verify_started(security)
    except BaseException:
        ray.shutdown()
        cluster.shutdown()
        raise
    return cluster


def add_node(cluster: "Cluster", security: RaySecurityConfig, **node_args):
    """`cluster.add_node(**node_args)` with the node on `security.bind_host`. The node's processes
    inherit the token from this process's environment, set by `start_local_cluster`."""
    if security.auth_token and os.environ.get(AUTH_MODE_ENV) != "token":
        raise RuntimeError("add_node: token authentication is not set up in this process; "
                           "start the cluster with start_local_cluster")
    node_args.setdefault("node_ip_address", security.bind_host)
    if node_args["node_ip_address"] != security.bind_host:
        raise ValueError(f"add_node: node_ip_address={node_args['node_ip_address']!r} differs from "
                         f"cluster.ray.bind_host={security.bind_host!r}")
    return with_raylet_retry(lambda: cluster.add_node(**node_args), "a node of the local Ray cluster")


def with_raylet_retry(start: Callable[[], T], what: str, reset: Callable[[], None] | None = None) -> T:
    """`start()`, a Ray node start-up, tried up to RAYLET_START_TRIES times while it fails with Ray's
    raylet start-up timeout. Ray waits a fixed 30 s (not configurable) for a new raylet to register with
    the GCS; on a machine busy beside the run (a niced raylet under a CPU hog, a suite's other tests)
    it can miss that, and Ray raises with the node's processes still running and no handle on them. The
    node that failed is found in the exception's frames and its processes killed (nothing is left
    behind), `reset()` puts the caller's state back, and the start is tried again. Any other error, and
    the last timeout, is raised as it is."""
    for attempt in range(1, RAYLET_START_TRIES + 1):
        try:
            return start()
        except Exception as exc:
            if RAYLET_TIMEOUT_MESSAGE not in str(exc):
                raise
            _kill_failed_node(exc)
            if reset is not None:
                reset()
            if attempt == RAYLET_START_TRIES:
                raise
            logger.warning("%s: Ray's raylet did not register within Ray's 30 s start-up wait (try %d of %d; "
                           "is the machine overloaded?); starting it again", what, attempt, RAYLET_START_TRIES)
    raise AssertionError("unreachable")


def _kill_failed_node(exc: BaseException) -> None:
    """Kill the processes of the Ray node whose start-up raised `exc` (the `Node` whose __init__ is on
    the traceback): Ray leaves them running when its start-up wait runs out."""
    from ray._private.node import Node

    tb = exc.__traceback__
    while tb is not None:
        node = tb.tb_frame.f_locals.get("self")
        if isinstance(node, Node):
            node.kill_all_processes(check_alive=False, allow_graceful=False, wait=True)
            return
        tb = tb.tb_next


def start_node_process(security: RaySecurityConfig, gcs_address: str, resources: dict[str, float],
                       object_store_bytes: int = 2 * 2**30):
    """A Ray node of its own, as a process tree in a new session (`rlboost.cluster.node_process`): what
    a spot VM is to the cluster. Safe from any thread (`Cluster.add_node` installs signal handlers,
    so it only works from the main thread). It inherits the token and the loopback settings from this
    process's environment; end it whole with `kill_node_process`."""
    import subprocess

    proc = subprocess.Popen(node_process_argv(gcs_address, resources, security.bind_host, object_store_bytes),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    _node_processes.append(proc)
    return proc


def node_process_argv(gcs_address: str, resources: dict[str, float], ip: str, object_store_bytes: int,
                      cpus: int = 0, gpus: int = 0) -> list[str]:
    """The command line of `rlboost.cluster.node_process`: a Ray node at `ip` joining `gcs_address`."""
    import json
    import sys

    return [sys.executable, "-m", "rlboost.cluster.node_process", gcs_address, json.dumps(resources), ip,
            str(object_store_bytes), str(cpus), str(gpus)]


_node_processes: list = []
"""Every node process this process started: `kill_leftover_nodes` ends those still running."""


def kill_leftover_nodes() -> int:
    """Kill the node processes started here that are still running (a run, or a test, that failed
    before its shutdown); returns how many."""
    alive = [p for p in _node_processes if p.poll() is None]
    for proc in alive:
        kill_node_process(proc)
    _node_processes.clear()
    return len(alive)


def kill_node_process(proc) -> None:
    """SIGKILL a node's whole process tree (its raylet, agents, object store and workers, some of
    which sit in process groups of their own), with no cleanup."""
    kill_tree(proc.pid)
    proc.wait()


def kill_tree(pid: int, include_root: bool = True) -> None:
    """SIGKILL process `pid`'s descendants (all of them, whatever their process group) and, with
    `include_root`, `pid` itself."""
    import psutil

    try:
        root = psutil.Process(pid)
        tree = [*([root] if include_root else []), *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        tree = []
    for p in tree:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass


def listening_addresses(root_pid: int | None = None) -> list[tuple[str, int, str]]:
    """(ip, port, process name) of every TCP socket in LISTEN state owned by process `root_pid`
    (default: this one) or any of its descendants: the Ray processes this process started (GCS,
    raylets, agents, dashboard head, workers) and this process itself."""
    import psutil

    try:
        root = psutil.Process(root_pid or os.getpid())
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []
    found = set()
    for proc in procs:
        try:
            conns = proc.net_connections(kind="tcp") if hasattr(proc, "net_connections") \
                else proc.connections(kind="tcp")
            name = proc.name()
        except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
            continue
        for conn in conns:
            if conn.status == psutil.CONN_LISTEN and conn.laddr:
                found.add((conn.laddr.ip, conn.laddr.port, name))
    return sorted(found)


def non_loopback_listeners(root_pid: int | None = None) -> list[tuple[str, int, str]]:
    """The entries of `listening_addresses` that are reachable from outside this machine."""
    return [entry for entry in listening_addresses(root_pid) if not _is_loopback(entry[0])]


class ExposedListenerError(RuntimeError):
    """A process of a loopback-only run listens beyond loopback (one line naming each)."""


def check_listeners(security: RaySecurityConfig) -> None:
    """Startup check: with bind_host=127.0.0.1, raise ExposedListenerError if any process of this run
    listens on a non-loopback address. (Ray workers start lazily; this sees those running now.)"""
    if not security.loopback:
        return
    exposed = non_loopback_listeners()
    if exposed:
        listing = ", ".join(f"{name} on {ip}:{port}" for ip, port, name in exposed)
        raise ExposedListenerError(f"cluster.ray.bind_host={LOOPBACK} but these listen beyond loopback: {listing}")


def _is_loopback(ip: str) -> bool:
    try:
        addr = ipaddress.ip_address(ip.split("%")[0])
    except ValueError:
        return False
    # gRPC binding 127.0.0.1 on an IPv6 socket shows as ::ffff:127.0.0.1
    mapped = getattr(addr, "ipv4_mapped", None)
    return (mapped or addr).is_loopback


def _prepare(security: RaySecurityConfig) -> None:
    security.validate()
    if ray.is_initialized():
        raise RuntimeError("Ray is already initialized in this process; a run starts its own local Ray")
    _set_up_auth(security.auth_token)
    if security.loopback:
        # Workers and agents inherit the variable; this process's Ray read it at import, so the
        # constant it consults (ray._private.services.get_node_ip_address) is set too.
        os.environ[SINGLE_MACHINE_ENV] = "0"
        from ray._private import ray_constants
        ray_constants.ENABLE_RAY_CLUSTER = False
    os.environ[USAGE_STATS_ENV] = "0"


def _set_up_auth(enabled: bool) -> None:
    try:
        from ray._raylet import AuthenticationMode, AuthenticationTokenLoader, Config, get_authentication_mode
    except ImportError as e:
        if enabled:
            raise RuntimeError(
                f"Ray {ray.__version__} has no token authentication (ray._raylet lacks it), and "
                f"cluster.ray.auth_token=true; use a Ray that has it, or set auth_token=false "
                f"to run without authentication") from e
        return
    if enabled:
        os.environ[AUTH_MODE_ENV] = "token"
        if not os.environ.get(AUTH_TOKEN_ENV) and not os.environ.get(AUTH_TOKEN_PATH_ENV):
            os.environ[AUTH_TOKEN_ENV] = secrets.token_hex(32)
    else:
        os.environ[AUTH_MODE_ENV] = "disabled"
        logger.warning("cluster.ray.auth_token=false: Ray runs WITHOUT token authentication")
    # Ray caches its config and the token per process: reload both from the environment just set.
    Config.initialize("")
    loader = AuthenticationTokenLoader.instance()
    loader.reset_cache()
    if not enabled:
        return
    if get_authentication_mode() != AuthenticationMode.TOKEN:
        raise RuntimeError(f"Ray {ray.__version__} ignored {AUTH_MODE_ENV}=token; refusing to start Ray "
                           f"without token authentication (cluster.ray.auth_token=true)")
    try:
        has_token = loader.has_token()
    except Exception as e:  # e.g. RAY_AUTH_TOKEN_PATH names a missing or empty file
        raise RuntimeError(f"Ray token authentication: cannot load the token: {e}") from e
    if not has_token:
        raise RuntimeError("Ray token authentication: no token found (RAY_AUTH_TOKEN / RAY_AUTH_TOKEN_PATH)")


def _verify_started(security: RaySecurityConfig) -> None:
    """After ray.init: the GCS must refuse a call without the token (when auth is on)."""
    if not security.auth_token:
        return
    gcs_address = ray.get_runtime_context().gcs_address
    if not gcs_refuses_unauthenticated(gcs_address):
        raise RuntimeError(f"Ray's GCS at {gcs_address} accepted a call without the token: token "
                           f"authentication is not in force (Ray {ray.__version__})")


def gcs_refuses_unauthenticated(gcs_address: str, timeout_s: float = 10.0) -> bool:
    """True if the GCS at `gcs_address` rejects a call that carries no token as UNAUTHENTICATED."""
    import grpc
    from ray.core.generated import gcs_service_pb2, gcs_service_pb2_grpc

    with grpc.insecure_channel(gcs_address) as channel:
        stub = gcs_service_pb2_grpc.NodeInfoGcsServiceStub(channel)
        try:
            stub.GetClusterId(gcs_service_pb2.GetClusterIdRequest(), timeout=timeout_s)
        except grpc.RpcError as e:
            if e.code() == grpc.StatusCode.UNAUTHENTICATED:
                return True
            raise RuntimeError(f"probing Ray's GCS at {gcs_address} failed: {e.code()} {e.details()}") from None
    return False
