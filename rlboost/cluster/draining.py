"""Ray's node draining: how a cloud's preemption warning reaches a Ray cluster, read and issued from
a driver connected to it.

On a cloud, the autoscaler (or KubeRay) turns the provider's warning (AWS: 2 min, GCP: 30 s) into
the GCS's `DrainNode` call with reason `DRAIN_NODE_REASON_PREEMPTION` and a deadline, after which
the VM is gone. The GCS then lists the node as draining until it dies; the raylet keeps running
what it runs and Ray kills nothing at the deadline: the cloud does.

Contract:
- `draining_nodes()`: every node the GCS lists as draining, as (node id hex, deadline) pairs sorted
  by node id; the deadline in Unix seconds (the GCS keeps wall-clock milliseconds), None when the
  drain named none. Ray 2.60 hands a driver the deadline but not the reason (the same
  `GlobalState.get_draining_nodes` Ray Train's preemption watcher reads), so an idle-termination
  drain is listed too; either ends with the node's termination.
- `drain_node(node_id, notice_s)`: drain a node the way the autoscaler does on a preemption warning
  (`ray._raylet.GcsClient.drain_node`, as `ray drain-node` calls it) with a deadline `notice_s`
  seconds from now (None: no deadline); returns the deadline in Unix seconds. A refusal is a
  RuntimeError with Ray's message.
Both need this process connected to the cluster (`ray.init`, the run's `Cluster`); both are private
Ray APIs (none public exists in Ray 2.60), kept to this module.
"""

from __future__ import annotations

import time

PREEMPTION = "DRAIN_NODE_REASON_PREEMPTION"


def draining_nodes() -> list[tuple[str, float | None]]:
    """(node id, deadline in Unix seconds or None) of every node Ray lists as draining."""
    import ray

    deadlines_ms = ray._private.state.state.get_draining_nodes()
    return sorted((node_id, ms / 1000 if ms else None) for node_id, ms in deadlines_ms.items())


def drain_node(node_id: str, notice_s: float | None, message: str = "spot preemption warning") -> float | None:
    """Drain `node_id` for a preemption `notice_s` seconds ahead, through the GCS's own call."""
    import ray
    from ray.core.generated import autoscaler_pb2

    deadline_ms = 0 if notice_s is None else int(time.time() * 1000 + notice_s * 1000)
    gcs = ray._raylet.GcsClient(address=ray.get_runtime_context().gcs_address)
    accepted, refusal = gcs.drain_node(node_id, autoscaler_pb2.DrainNodeReason.Value(PREEMPTION), message,
                                       deadline_ms)
    if not accepted:
        raise RuntimeError(f"Ray refused to drain node {node_id}: {refusal}")
    return deadline_ms / 1000 if deadline_ms else None


__all__ = ["PREEMPTION", "drain_node", "draining_nodes"]
