"""The manager's view of one rollout worker across steps: its actor, its standing, its weights.

Contract: a `WorkerHandle` is changed only by the thread that owns the worker table (see
`rlboost.hybrid.worker_table`); other threads read it. Its `state` is the one worker-state enum the
step uses too (`rlboost.rollout.step_data.WorkerState`, whose docstring draws the transitions).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rlboost.policies.profile import ThroughputProfile
from rlboost.cluster.resources import PREEMPTIBLE, RESERVED
from rlboost.rollout.step_data import WorkerState


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
    """Its Ray actor, or a `HostedActor` (a worker sharing a process, `rlboost.hybrid.worker_host`):
    called the same way; ended by `end_actor`."""
    pid: int
    node_id: str
    max_running: int
    version: int = -1
    """The weight version it serves (-1: none yet)."""
    fingerprint: str = ""
    checksum: str = ""
    launched: float = 0.0
    """Monotonic time the instance was asked for: provisioning runs from here to its first verified pull."""
    state: WorkerState = WorkerState.JOINING
    ready: float | None = None
    """When it first held the current weights."""
    pull: Call | None = None
    pull_failures: int = 0
    streaming: bool = False
    """Its report stream is open: the manager's report relay reads it for the worker's whole life
    (`rlboost.hybrid.report_relay`), until it ends or fails."""
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
    kv_tokens: int | None = None
    """Its engine's KV cache in tokens where that binds before max_running (vLLM's); None: it does not."""

    @property
    def alive(self) -> bool:
        return self.state.alive

    @property
    def draining(self) -> bool:
        """Noticed or being given back: it gets no more work."""
        return self.state.draining


def first_line(e: BaseException) -> str:
    """`Type: first line` of an error; for a Ray task error, of its cause (Ray's banner says nothing);
    for an actor that died raising in its constructor, the `Type: message` line its traceback ends
    with (Ray keeps only the text of that error, after a banner naming the actor's pid and ids)."""
    cause = getattr(e, "cause", None)
    if isinstance(cause, BaseException):
        e = cause
    text = str(e).strip().splitlines()
    if getattr(e, "actor_init_failed", False):
        frames = [i for i, line in enumerate(text) if line.startswith('  File "')]
        raised = next((line for line in text[frames[-1] + 1:] if line and not line[0].isspace()), None) if frames else None
        if raised:
            return raised
    return f"{type(e).__name__}: {text[0] if text else ''}"


class _HostedMethod:
    """`host.<method>` of one hosted worker, as an actor method: `.remote(...)`, `.options(...)`."""

    def __init__(self, host, name: str, method: str, options: dict):
        self._host, self._name, self._method, self._options = host, name, method, options

    def options(self, **options) -> _HostedMethod:
        return _HostedMethod(self._host, self._name, self._method, self._options | options)

    def remote(self, *args, **kwargs):
        if self._method == "stream":
            target, call_args = self._host.stream, (self._name, *args)
        else:
            target, call_args = self._host.call, (self._name, self._method, args, kwargs)
        return (target.options(**self._options) if self._options else target).remote(*call_args)


@dataclass(frozen=True)
class HostedActor:
    """A hosted worker, addressed as its own actor would be (picklable: it travels to the relay)."""

    host: object
    """The WorkerHost's Ray actor handle."""
    name: str

    def __getattr__(self, method: str) -> _HostedMethod:
        if method.startswith("_"):  # pickling and copying ask for dunders: never a worker's call
            raise AttributeError(method)
        return _HostedMethod(self.host, self.name, method, {})


def end_actor(actor) -> None:
    """End a worker's actor: kill its process, or drop it from its host (a hosted one)."""
    import ray

    if isinstance(actor, HostedActor):
        actor.host.drop.remote(actor.name)
    else:
        ray.kill(actor, no_restart=True)


__all__ = ["PREEMPTIBLE", "RESERVED", "Call", "HostedActor", "WorkerHandle", "WorkerState", "end_actor", "first_line"]
