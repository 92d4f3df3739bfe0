"""The manager's view of one rollout worker across steps: its actor, its lifecycle, its weights.

Contract: a `WorkerHandle` is changed only by the thread that owns the manager's state (see
`rlboost.hybrid.manager`); other threads read it. Its `lifecycle` moves one way, except between
SERVING and PULLING as versions are published:

    JOINING --pull verified--> SERVING <--publish / pull verified--> PULLING
       any alive state --notice--> NOTICED;  --release--> RETIRING;  --death or fence--> DEAD
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from rlboost.policies.profile import ThroughputProfile
from rlboost.cluster.resources import PREEMPTIBLE, RESERVED


class Lifecycle(enum.Enum):
    JOINING = "joining"
    """Admitted, pulling its first weights: it has served nothing yet."""
    SERVING = "serving"
    """Holds the version to serve."""
    PULLING = "pulling"
    """Holds an older version and pulls the current one."""
    NOTICED = "noticed"
    """A preemption notice came: no more work, its samples are taken back before the kill."""
    RETIRING = "retiring"
    """Being given back (beyond the instance cap): no more work, ended once it holds nothing."""
    DEAD = "dead"
    """Declared dead (fenced): whatever it still sends is dropped."""


@dataclass
class Call:
    """A control call in flight: a weight pull (of `version`) or a liveness ping."""

    ref: object
    sent: float
    version: int = -1


@dataclass
class WorkerHandle:
    name: str
    kind: str
    """RESERVED or PREEMPTIBLE."""
    actor: object
    pid: int
    node_id: str
    max_running: int
    version: int = -1
    """The weight version it serves (-1: none yet)."""
    fingerprint: str = ""
    checksum: str = ""
    launched: float = 0.0
    """Monotonic time the instance was asked for: provisioning runs from here to its first verified pull."""
    lifecycle: Lifecycle = Lifecycle.JOINING
    ready: float | None = None
    """When it first held the current weights."""
    pull: Call | None = None
    pull_failures: int = 0
    stream: object | None = None
    """Its report stream (a Ray streaming generator), read for its whole life."""
    fenced: str | None = None
    """Why it was declared dead; None while alive."""
    released: bool = False
    """Given back by us: its end is not a preemption."""
    generated: dict[str, int] = field(default_factory=dict)
    """Tokens each of its requests had generated at its last report, streamed or not."""
    last_report: float = 0.0
    """Last sign of life: a report on its stream, or an answered ping."""
    ping: Call | None = None
    """A liveness probe in flight (sent when the stream has been quiet for a heartbeat interval)."""
    profile: ThroughputProfile = field(default_factory=ThroughputProfile)
    """Its decode tokens/s by batch size: the balancer's plateau B."""

    @property
    def alive(self) -> bool:
        return self.lifecycle is not Lifecycle.DEAD

    @property
    def draining(self) -> bool:
        """Noticed or being given back: it gets no more work."""
        return self.lifecycle in (Lifecycle.NOTICED, Lifecycle.RETIRING)


def first_line(e: BaseException) -> str:
    """`Type: first line` of an error; for a Ray task error, of its cause (Ray's banner says nothing)."""
    cause = getattr(e, "cause", None)
    if isinstance(cause, BaseException):
        e = cause
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}"


__all__ = ["PREEMPTIBLE", "RESERVED", "Call", "Lifecycle", "WorkerHandle", "first_line"]
