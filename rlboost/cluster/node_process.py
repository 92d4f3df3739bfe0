"""A Ray worker node as a process of its own:
`python -m rlboost.cluster.node_process ADDRESS RESOURCES IP OBJECT_STORE_BYTES [CPUS GPUS]`.

What a spot VM is to the cluster, on one machine: this process starts a raylet and an object store
that join the cluster at ADDRESS (from its main thread, which Ray's node start-up needs), then waits.
Everything the node runs descends from it, in its own session, so one SIGKILL of the process group
ends the node and its workers at once, with no cleanup (`ray_setup.kill_node_process`). The token
and the loopback settings come from the environment, as for every Ray process of the run. A node
whose run's driver died without ending it (SIGKILL, the OOM killer) stops on its own: it outlives
nothing it was started for.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time

DRIVER = os.getppid()
"""The process that started this one, read at import, before Ray's: a driver that dies while this
process still imports is seen gone too."""
PARENT_POLL_S = 1.0
"""How often the node looks for its driver (the process that started it)."""
PR_SET_CHILD_SUBREAPER = 36
"""Linux prctl option: orphans among this process's descendants are re-parented to it, not to init."""


def _adopt_orphans() -> None:
    """Make this process the subreaper of everything the node starts: a process whose parent dies (a
    worker the raylet forked as it was being killed) stays among its descendants for the last kill
    to find, instead of running on under init. Best effort off Linux."""
    import ctypes

    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def main(address: str, resources: dict[str, float], ip: str, object_store_bytes: int, cpus: int = 0,
         gpus: int = 0) -> None:
    """`cpus`, `gpus`: the logical CPUs and GPUs the node offers (Ray hands GPUs to actors asking for
    them, setting their CUDA_VISIBLE_DEVICES)."""
    import ray
    from ray._private.node import Node
    from ray._private.parameter import RayParams

    from rlboost.cluster.ray_setup import with_raylet_retry

    def start() -> Node:  # fresh parameters per try: Node fills some in
        params = RayParams(gcs_address=address, node_ip_address=ip, num_cpus=cpus, num_gpus=gpus,
                           resources=resources, object_store_memory=object_store_bytes, min_worker_port=0,
                           max_worker_port=0, include_log_monitor=False, node_manager_port=0)
        params.dashboard_agent_listen_port = None  # any free port: the head's agent has the default one
        return Node(params, head=False, shutdown_at_exit=True, spawn_reaper=False)

    _adopt_orphans()
    # from the start: a driver may die while the node is still starting (or retrying a start), and
    # Ray's start-up then waits on the driver's GCS for minutes
    threading.Thread(target=_leave_with, args=(DRIVER,), name="driver-watch", daemon=True).start()
    with_raylet_retry(start, "a spot node's Ray")
    del ray
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    while not stop.wait(PARENT_POLL_S):  # a timed wait: the SIGTERM handler runs between its tries
        pass
    _end()


def _leave_with(driver: int) -> None:
    """Once the driver is gone (this process re-parented), end the node."""
    while os.getppid() == driver:
        time.sleep(PARENT_POLL_S)
    _end()


def _end() -> None:
    """Kill everything the node started (Ray's own agents outlive a dead raylet by minutes, trying to
    reach the GCS first) and leave at once: nothing is left to clean up, and a normal exit runs Ray's
    exit hook and joins threads of Ray's start-up that may wait on a GCS that is gone."""
    from rlboost.cluster.ray_setup import kill_tree

    kill_tree(os.getpid(), include_root=False)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main(sys.argv[1], json.loads(sys.argv[2]), sys.argv[3], int(sys.argv[4]), *map(int, sys.argv[5:7]))
