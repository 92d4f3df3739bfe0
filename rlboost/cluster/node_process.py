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


PARENT_POLL_S = 1.0
"""How often the node looks for its driver (the process that started it)."""


def main(address: str, resources: dict[str, float], ip: str, object_store_bytes: int, cpus: int = 0,
         gpus: int = 0) -> None:
    """`cpus`, `gpus`: the logical CPUs and GPUs the node offers (Ray hands GPUs to actors asking for
    them, setting their CUDA_VISIBLE_DEVICES)."""
    import ray
    from ray._private.node import Node
    from ray._private.parameter import RayParams

    from rlboost.cluster.ray_setup import kill_tree, with_raylet_retry

    def start() -> Node:  # fresh parameters per try: Node fills some in
        params = RayParams(gcs_address=address, node_ip_address=ip, num_cpus=cpus, num_gpus=gpus,
                           resources=resources, object_store_memory=object_store_bytes, min_worker_port=0,
                           max_worker_port=0, include_log_monitor=False, node_manager_port=0)
        params.dashboard_agent_listen_port = None  # any free port: the head's agent has the default one
        return Node(params, head=False, shutdown_at_exit=True, spawn_reaper=False)

    driver = os.getppid()
    with_raylet_retry(start, "a spot node's Ray")
    del ray
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    # the driver gone, this process is re-parented: leave, ending everything the node started (Ray's
    # own agents outlive a dead raylet by minutes, trying to reach the GCS first)
    while not stop.wait(PARENT_POLL_S) and os.getppid() == driver:
        pass
    kill_tree(os.getpid(), include_root=False)


if __name__ == "__main__":
    main(sys.argv[1], json.loads(sys.argv[2]), sys.argv[3], int(sys.argv[4]), *map(int, sys.argv[5:7]))
