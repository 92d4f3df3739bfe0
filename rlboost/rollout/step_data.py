"""What the step's state machine (`rlboost.rollout.step_state`) reads and writes: its config, its records
of workers and samples, its statistics, and the commands it issues. Plain data, torch-free and Ray-free:
both shells (the runtime's manager, the simulator) build and read these types."""

from __future__ import annotations

import enum
import math
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from rlboost.cluster.resources import PREEMPTIBLE, RESERVED
from rlboost.policies.dispatch import WorkerLoad
from rlboost.policies.profile import ThroughputProfile

MIGRATIONS = ("token", "recompute")
START_AHEAD = ("rollout_end", "tail")
"""When a batch starts ahead of its trainer (max_staleness >= 1): at the step's rollout end, or in its tail."""


class StepError(RuntimeError):
    """The step cannot go on: an invariant was broken, or no worker is left to finish it."""


class SampleState(enum.Enum):
    PENDING = "pending"
    RUNNING = "running"
    FINISHED = "finished"


class WorkerState(enum.Enum):
    """A worker's standing: the one enum of the runtime's worker table (`rlboost.hybrid.handles`) and of
    the step's view (`Worker.status`). It moves one way, except between SERVING and PULLING as versions
    are published:

        JOINING --pull verified--> SERVING <--publish / pull verified--> PULLING
           any alive state --notice--> NOTICED;  --release--> RETIRING;  --death or fence--> DEAD

    Only SERVING workers take work (reserved ones while they accept it: before the seeding hand-off,
    or after a fallback)."""

    JOINING = "joining"
    """Admitted, pulling its first weights: it has served nothing yet (to a step, a PULLING worker)."""
    PULLING = "pulling"
    """Not at a version the step admits yet (the step's, or within its max_staleness)."""
    SERVING = "serving"
    """Holds a version the step admits (`Worker.version`)."""
    NOTICED = "noticed"
    """A preemption notice came: no more work; what it holds is taken back before the kill."""
    RETIRING = "retiring"
    """Being given back (beyond the instance cap): no more work; ended once it holds nothing."""
    DEAD = "dead"
    """Declared dead (fenced): whatever it still sends is dropped."""

    @property
    def alive(self) -> bool:
        return self is not WorkerState.DEAD

    @property
    def draining(self) -> bool:
        """Noticed or being given back: it gets no more work."""
        return self in (WorkerState.NOTICED, WorkerState.RETIRING)


@dataclass
class StepConfig:
    """How the step decides (the runtime's `rollout.hybrid.*`, the simulator's `simulate.*`)."""

    share_with_pulling: bool = True
    """Preemptible workers pulling the step's weights get their share of its dispatch, held back
    until they serve (JSQDispatcher's `incoming`), for at most `share_grace_s` or twice the longest
    pull seen, whichever is longer: a pull that hangs gives its share back."""
    share_grace_s: float = 1.0
    """The shortest time a pulling worker keeps its share."""
    migration: str = "token"
    """What survives a death: `token` (every streamed token; the sample continues elsewhere) or
    `recompute` (the sample restarts from nothing: the baseline the paper compares with)."""
    handoff_check_s: float = 1.0
    """While the seeding hand-off is deferred (the instances would not end the step sooner), how often
    it is weighed again."""
    notice_keep: bool = True
    """A preemption notice that says when the kill comes leaves the samples expected to finish before
    it on the instance (`rlboost.policies.notice`; expected lengths from HistoPipe's history); False:
    every sample is taken back at the notice."""
    notice_margin_s: float = 2.0
    """What a noticed instance still holds this long before its kill is taken back then (an abort and
    its answer must land before the kill); a sample stays only if expected to finish before that."""
    max_staleness: int = 0
    """k: a sample is started or continued only on weights at most k versions behind the step's newest
    (`StepState.advance`); 0: every token comes from the step's one version (the synchronous step)."""

    def validate(self) -> None:
        if self.migration not in MIGRATIONS:
            raise ValueError(f"migration={self.migration!r}; valid: {', '.join(MIGRATIONS)}")
        if self.share_grace_s < 0:
            raise ValueError(f"share_grace_s must be >= 0, got {self.share_grace_s}")
        if not (self.handoff_check_s > 0 and math.isfinite(self.handoff_check_s)):
            raise ValueError(f"handoff_check_s must be a finite number > 0, got {self.handoff_check_s}")
        if not (self.notice_margin_s >= 0 and math.isfinite(self.notice_margin_s)):
            raise ValueError(f"notice_margin_s must be a finite number >= 0, got {self.notice_margin_s}")
        if self.max_staleness < 0:
            raise ValueError(f"max_staleness must be >= 0, got {self.max_staleness}")


# ---- commands ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Request:
    uid: str
    request_id: str
    """`uid#attempt`: what the worker calls it; anything about an older attempt is stale."""
    held: int
    """Response tokens the sample holds: the request is prompt + these, with max_tokens reduced by them."""


@dataclass(frozen=True)
class Submit:
    worker: str
    requests: list[Request]


@dataclass(frozen=True)
class Abort:
    """Take `request_ids` back from `worker`; answer with `StepState.aborted(id, partials)`."""

    id: int
    worker: str
    request_ids: list[str]
    reason: str
    then_sleep: bool = False
    """The seeding hand-off: the reserved worker frees its memory for training once idle."""
    then_load: int | None = None
    """A refresh (`StepState.ready` of a newer version on a busy worker): once the requests are taken
    back, the worker swaps in this version, which it holds fetched and verified, before the answer;
    the samples then continue on it with the new weights (each token keeps the version that made it)."""


@dataclass(frozen=True)
class Retire:
    """A worker given back holds nothing any more: end it (then report it `dead(..., released=True)`)."""

    worker: str


@dataclass(frozen=True)
class ReleaseReserved:
    """The reserved resources are the trainer's from now: the seeding window handed off (or there was
    none, or the rollout ended without a hand-off)."""


@dataclass(frozen=True)
class GroupDone:
    """Every sample of group `group` finished: hand it to the trainer."""

    group: int


Command = Submit | Abort | Retire | ReleaseReserved | GroupDone


@dataclass(frozen=True)
class Partial:
    """What an aborted attempt generated, streamed or not (the engine's PartialOutput, or a count)."""

    count: int
    version: int
    token_ids: Sequence[int] | None = None
    logprobs: Sequence[float] | None = None


# ---- state --------------------------------------------------------------------------------------------

@dataclass
class Worker:
    """The step's view of one worker."""

    name: str
    kind: str
    max_running: int
    profile: ThroughputProfile
    """Its decode throughput by batch size (kept by the shell across steps; the balancer reads B)."""
    status: WorkerState = WorkerState.SERVING
    """Never JOINING: to the step a worker pulling its first weights is PULLING."""
    accepting: bool = True
    """Reserved workers: False from the seeding hand-off until a fallback."""
    pull_since: float | None = None
    """When it started pulling the step's version (PULLING workers; None: not pulling it)."""
    version: int | None = None
    """The weight version it serves (SERVING workers: within the step's window, `StepState.admits`)."""
    swapping: int | None = None
    """A refresh to this version is under way (its samples are being taken back): it takes no work."""
    retired: bool = False
    """A RETIRING worker was found empty and `Retire` issued."""
    assigned: set[str] = field(default_factory=set)
    """Uids of the samples it runs or queues."""
    last_finish: float | None = None
    """When it last ran out of samples."""
    tokens: int = 0
    """Tokens accepted from it this step."""
    busy_since: float | None = None
    """When it last went from holding nothing to holding samples; None: it holds nothing."""
    busy_s: float = 0.0
    """Seconds it held samples this step, up to `busy_since`."""
    limit: int | None = None
    """The slots of `max_running` this step may use while another step's samples hold the rest (a batch
    filling the tail of the step before, `StepState.limit`); it queues nothing meanwhile. None: all."""
    notice_deadline: float | None = None
    """A NOTICED worker kept samples expected to finish before its kill at this time; what it still holds
    `StepConfig.notice_margin_s` before it is taken back then (None: nothing kept, or taken back)."""

    @property
    def alive(self) -> bool:
        return self.status.alive

    @property
    def slots(self) -> int:
        """The batch slots this step may use: its capacity, or its `limit`."""
        return self.max_running if self.limit is None else self.limit

    @property
    def running(self) -> int:
        """Samples it executes (at most its slots); the rest of `assigned` queue behind them."""
        return min(len(self.assigned), self.slots)

    @property
    def pending(self) -> int:
        return max(len(self.assigned) - self.slots, 0)

    def load(self) -> WorkerLoad:
        """What the dispatcher and the balancer see of it."""
        return WorkerLoad(self.name, self.running, self.pending, self.slots, queue=self.limit is None)

    def holding_changed(self, now: float) -> None:
        """Keep `busy_s` after a change of what it holds."""
        if self.assigned and self.busy_since is None:
            self.busy_since = now
        elif not self.assigned and self.busy_since is not None:
            self.busy_s += now - self.busy_since
            self.busy_since = None

    def busy_until(self, now: float) -> float:
        """Seconds it held samples this step, up to `now`."""
        return self.busy_s + (now - self.busy_since if self.busy_since is not None else 0.0)


def pullers(workers: Iterable[Worker], now: float, grace: float) -> tuple[float, list[WorkerLoad]]:
    """(the earliest pull start among them, the preemptible workers pulling the step's version for at
    most `grace` seconds): those owed a share of the dispatch."""
    pulling = [w for w in workers if w.kind == PREEMPTIBLE and w.status is WorkerState.PULLING
               and w.pull_since is not None and now - w.pull_since <= grace]
    return min((w.pull_since for w in pulling), default=math.inf), [
        WorkerLoad(w.name, 0, 0, w.max_running) for w in pulling]


@dataclass
class Tracked:
    uid: str
    group: int
    sample: object | None
    """The runtime's `Sample` (response_ids, logprobs, versions, finish_reason); None: counts only."""
    state: SampleState = SampleState.PENDING
    worker: str | None = None
    attempt: int = 0
    request_id: str = ""
    base: int = 0
    """Response tokens the sample held when its current attempt was dispatched."""
    tokens: int = 0
    """Response tokens it holds."""
    migrations: int = 0
    finish_reason: str | None = None
    oldest_version: int | None = None
    """The oldest weight version among the tokens it holds (None: it holds none)."""


@dataclass
class PendingAbort:
    worker: str
    requests: dict[str, str]
    """Request id -> uid."""
    reason: str
    target: str | None
    """Where the samples taken back go (a rebalance); None: back to the dispatcher."""
    sent: float
    load: int | None = None
    """A refresh: the version the worker serves once this abort is answered."""


@dataclass
class StepStats:
    """What happened in the step (the runtime's spot/*, migration/*, timing_s/* metrics; the
    simulator's StepRecord)."""

    deaths: list[tuple[float, str, str]] = field(default_factory=list)
    """(seconds into the step, worker, reason) of every worker declared dead."""
    preemptions: int = 0
    """Preemptible workers that died (not given back)."""
    in_flight_at_preemption: int = 0
    migrated: Counter = field(default_factory=Counter)
    """Samples moved, by reason: preempted, seed_handoff, rebalanced, noticed, released, seed_share (taken
    from the instances for the reserved workers of a step seeded late), refreshed (their
    worker swapped in a newer version: they continue there on it), fenced (their worker fell more than
    max_staleness versions behind), yielded (a batch started ahead gave the slots back to the step before,
    `StepState.limit`)."""
    wasted_tokens: int = 0
    """Generated on workers that died and never received."""
    recomputed_tokens: int = 0
    """Received, then thrown away at a death (migration=recompute)."""
    fenced_tokens_dropped: int = 0
    stale_chunks: int = 0
    overruns_moved: int = 0
    """Executing samples moved first because they ran far past their prompt's history (HistoPipe)."""
    kept_through_notice: int = 0
    """Samples left on an instance under a preemption notice, expected to finish before its kill."""
    received: Counter = field(default_factory=Counter)
    """Tokens accepted per request id."""
    tokens_by_kind: Counter = field(default_factory=Counter)
    tokens_by_worker: Counter = field(default_factory=Counter)
    seed_s: float = 0.0
    """How long the reserved workers generated in the seeding window: to the hand-off, or the whole
    rollout if none happened (0 without a window)."""
    rollout_s: float = 0.0
    """From the step's start to its last finished sample."""
    remote_start_s: float | None = None
    """From the step's start to the first work a preemptible worker got; None: none got any."""
    tail_s: float = 0.0
    """From the first to the last worker that generated to the end running out of samples."""
    fallback: bool = False
    """Every preemptible worker went away after the hand-off and the reserved ones took the work back."""
    busy_s_by_kind: Counter = field(default_factory=Counter)
    """Seconds workers held samples, summed by kind (an engine's share of the rollout): with
    `tokens_by_kind`, the sustained decode rate per worker, tail included."""
    handoff_deferred: bool = False
    """At the end of the window instances served the step, but handing them the rest would not have
    ended it sooner (`rlboost.policies.handoff`): the hand-off came later (`seed_s`) or never."""

    def close(self, workers: Iterable[Worker], rollout_s: float, seeded_all: bool, now: float) -> None:
        """The step's last sample finished `rollout_s` after its start, at `now`: its timings are final.
        `seeded_all`: no hand-off happened, the reserved workers generated it all."""
        self.rollout_s = rollout_s
        if seeded_all:
            self.seed_s = rollout_s
        workers = list(workers)
        # the tail: from the first to the last worker done, among those that generated to the end: the
        # instances, or the reserved workers when none was there
        finishers = ([w for w in workers if w.kind == PREEMPTIBLE and w.alive]
                     or [w for w in workers if w.kind == RESERVED and w.alive])
        done = [w.last_finish for w in finishers if w.last_finish is not None and w.tokens > 0]
        self.tail_s = max(done) - min(done) if done else 0.0
        for w in workers:
            self.busy_s_by_kind[w.kind] += w.busy_until(now)

    def remote_timings(self, t0: float, end: float) -> tuple[float, float]:
        """(t_remote, t_wait_remote) of a closed step that started at `t0` and whose training ended at
        `end` (`StepState.remote_timings`)."""
        remote = self.rollout_s - self.remote_start_s if self.remote_start_s is not None else 0.0
        waited = max(0.0, end - (t0 + self.rollout_s)) if self.tokens_by_kind[PREEMPTIBLE] > 0 else 0.0
        return remote, waited

    def worker_tokens_per_s(self, kind: str) -> float:
        """A worker's sustained decode rate in the step: its kind's tokens over the seconds its kind
        held samples (NaN: none of that kind held any)."""
        busy = self.busy_s_by_kind[kind]
        return self.tokens_by_kind[kind] / busy if busy > 0 else math.nan

    def offload_measurements(self) -> dict[str, float]:
        """The `StepTimings` fields the step itself measured, for the offload controller."""
        return {"seed_s": self.seed_s if self.handoff_deferred else math.nan,
                "tokens": sum(self.tokens_by_kind.values()),
                "reserved_worker_tokens_per_s": self.worker_tokens_per_s(RESERVED),
                "instance_worker_tokens_per_s": self.worker_tokens_per_s(PREEMPTIBLE)}


__all__ = ["MIGRATIONS", "PREEMPTIBLE", "RESERVED", "Abort", "Command", "GroupDone", "Partial", "PendingAbort",
           "ReleaseReserved", "Request", "Retire", "SampleState", "StepConfig", "StepError", "StepStats", "Submit",
           "Tracked", "Worker", "WorkerState", "pullers"]
