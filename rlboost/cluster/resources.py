"""The names of a run's two kinds of resources, one name for each kind everywhere.

They are Ray custom resources (a reserved worker or a trainer rank asks for `reserved`, a preemptible
instance is a node or a process offering `preemptible`) and the worker kinds the step's state
machine tells apart (`rlboost.rollout.step_data` takes them from here). Plain strings: importing this
loads nothing."""

RESERVED, PREEMPTIBLE = "reserved", "preemptible"

INSTANCE_KINDS = ("processes", "nodes", "hosts")
"""How a local cluster stands up preemptible instances: worker processes of its own node, a Ray node
of their own each on this machine, or a Ray node each on a host of its own behind a link
(`cluster.hosts`, `rlboost.cluster.hosts`) (`rollout.hybrid.instances`)."""

MANY = 10_000
"""Units of a kind a local node offers: enough that the custom resources never limit how many
workers or ranks fit (CPUs and GPUs do)."""

__all__ = ["INSTANCE_KINDS", "MANY", "PREEMPTIBLE", "RESERVED"]
