"""The workers of a hybrid run across steps: their handles, the inbox other threads write to, their
deaths and retirement, and the one listener told of every change of membership.

Contract:
- `admit` inserts a started worker (any thread); `notice`, `release` and `fence` put a message in the
  inbox (any thread); `alive`, `handles` and `get` read (any thread).
- The thread that holds `owner` applies the inbox (`apply_inbox`), declares deaths (`declare_dead`),
  ends given-back workers (`retire`) and reports verified pulls (`ready`). Each of these tells the
  `listener` (`Membership`): during a step the step under way (`rlboost.hybrid.step_run.StepRun`), which
  turns them into its StepState's events; between steps the table's own `BetweenSteps` recorder. A
  worker declared dead never contributes again (invariant 6): the listener is told before its handle is
  marked dead, so what it sent until then still counts, and nothing after.

Threads, and who may change what:

    driver thread                     provider and boot threads           the step's loop thread
    (HybridRollout, tests)            (providers, Fleet.launch)           (one per step)
    ----------------------            -------------------------           ----------------------
    publish, wait_ready, reap,        admit, notice, release, fence:      owns the workers while the
    start_step: own the workers       put a message in the inbox;         step runs: applies the inbox,
    between steps                     never change a handle               reads reports, polls pulls and
                                                                          liveness, drives the StepState
           \\____________ whoever holds `owner` applies the inbox _______________/

`owner` is held by the driver's calls between steps (each in a `with`) and taken by the step's loop
thread itself for the whole step, which releases it when the step ends, however it ends: each holder
takes it and releases it in one place, so exactly one thread changes handles at any time and a stop
landing anywhere cannot release it twice. The `workers` dict itself is guarded by `lock`.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Protocol

from rlboost.hybrid.handles import PREEMPTIBLE, RESERVED, WorkerHandle, WorkerState, end_actor
from rlboost.run_log import event


class Membership(Protocol):
    """Who hears of the table's changes; called by the owner thread only."""

    def joined(self, h: WorkerHandle, now: float) -> None:
        """`h` was admitted (pulling, or already holding the current version)."""

    def ready(self, h: WorkerHandle, pull_s: float, now: float) -> None:
        """`h` verified the current version in a pull of `pull_s` seconds."""

    def noticed(self, h: WorkerHandle, now: float, deadline: float | None) -> None:
        """`h` got a preemption notice of a kill at `deadline` (monotonic; None: unknown): no more work,
        what it holds is taken back before the kill."""

    def retiring(self, h: WorkerHandle, now: float) -> None:
        """`h` is being given back: no more work; `table.retire(h)` once it holds nothing."""

    def dying(self, h: WorkerHandle, now: float) -> None:
        """`h` is about to be declared dead: what it sent until now still counts."""

    def died(self, h: WorkerHandle, reason: str, cause: str, now: float) -> None:
        """`h` was declared dead for `reason` (`cause`: who ended it, for the console), or ended after
        it was given back (`h.released`)."""

    def replacing(self, count: int, failed: str | None, now: float) -> None:
        """`count` replacements of dead reserved workers are booting now; `failed`: why one did not start."""


class BetweenSteps:
    """The listener while no step runs: a worker given back holds nothing and is ended at once; deaths
    are recorded for the next step's report."""

    def __init__(self, table: WorkerTable):
        self.table = table
        self.deaths: list[tuple[str, str, bool]] = []
        """(worker, reason, preempted) of the workers declared dead while no step ran."""

    def joined(self, h: WorkerHandle, now: float) -> None:
        pass

    def ready(self, h: WorkerHandle, pull_s: float, now: float) -> None:
        pass

    def noticed(self, h: WorkerHandle, now: float, deadline: float | None) -> None:
        pass

    def retiring(self, h: WorkerHandle, now: float) -> None:
        self.table.retire(h, now)

    def dying(self, h: WorkerHandle, now: float) -> None:
        pass

    def died(self, h: WorkerHandle, reason: str, cause: str, now: float) -> None:
        self.deaths.append((h.name, reason, h.kind == PREEMPTIBLE and not h.released))
        if not h.released:
            event("%s %s %s between steps: no samples in flight", describe(h), h.name, cause)

    def replacing(self, count: int, failed: str | None, now: float) -> None:
        if failed is not None:
            event("a reserved worker's replacement failed to start: %s", failed)

    def take(self) -> list[tuple[str, str, bool]]:
        deaths, self.deaths = self.deaths, []
        return deaths


class WorkerTable:
    def __init__(self):
        self.workers: dict[str, WorkerHandle] = {}
        self.lock = threading.Lock()
        self.owner = threading.Lock()
        self.inbox: queue.SimpleQueue[tuple[str, str, object]] = queue.SimpleQueue()
        self.between_steps = BetweenSteps(self)
        self.listener: Membership = self.between_steps
        self.on_retire: Callable[[WorkerHandle], None] | None = None
        """Ends an instance given back (the fleet kills its actor and node); None: kill the actor."""
        self.on_dead: Callable[[WorkerHandle], bool] | None = None
        """Told of every death that is not a give-back (owner thread; must not block): True when it
        started a replacement (the fleet does for reserved workers), which `admit` or
        `replacement_failed` settles."""
        self.replacing = 0
        """Replacements of dead reserved workers booting (changed by the owner only)."""
        self.causes: dict[str, str] = {}
        """Worker -> who ended it ("preempted by the trace"), told by whoever killed it, for the
        console's line when its death is found; never an input to a decision."""

    def listen(self, listener: Membership | None) -> None:
        """Tell `listener` of every change from now on (the owner's call); None: the recorder again."""
        self.listener = listener if listener is not None else self.between_steps

    # ---- any thread ----------------------------------------------------------------------------------

    def admit(self, h: WorkerHandle) -> None:
        """A started worker joins the table; the owner tells the listener."""
        with self.lock:
            self.workers[h.name] = h
        self.inbox.put(("join", h.name, None))

    def notice(self, name: str, seconds: float) -> None:
        """A preemption notice: the instance goes away in about `seconds`."""
        self.inbox.put(("notice", name, seconds))

    def release(self, name: str) -> None:
        """Give an instance back (beyond the instance cap): no more work, its samples are taken back
        exactly, then it is ended (`on_retire`). Not a preemption."""
        self.inbox.put(("release", name, None))

    def fence(self, name: str, reason: str) -> None:
        """Declare a worker dead; from then on everything it sends is dropped."""
        self.inbox.put(("fence", name, reason))

    def replacement_failed(self, reason: str) -> None:
        """A replacement started by `on_dead` will not join, for `reason`."""
        self.inbox.put(("replacement_failed", "", reason))

    def get(self, name: str) -> WorkerHandle | None:
        return self.workers.get(name)

    def alive(self, kind: str | None = None) -> list[WorkerHandle]:
        with self.lock:
            return [h for h in self.workers.values() if h.alive and kind in (None, h.kind)]

    def handles(self) -> list[WorkerHandle]:
        """Every worker not reaped yet, dead ones included (their streams are still read)."""
        with self.lock:
            return list(self.workers.values())

    # ---- the owner -----------------------------------------------------------------------------------

    def apply_inbox(self, now: float) -> None:
        """Carry out what other threads asked for."""
        while True:
            try:
                what, name, arg = self.inbox.get_nowait()
            except queue.Empty:
                return
            if what == "replacement_failed":
                self._replaced(str(arg), now)
                continue
            h = self.workers.get(name)
            if h is None or not h.alive:
                continue
            if what == "join":
                self.listener.joined(h, now)
                if h.kind == RESERVED and self.replacing:
                    self._replaced(None, now)
            elif what == "fence":
                self.declare_dead(h, str(arg), now)
            elif what == "notice" and not h.draining:
                h.state = WorkerState.NOTICED
                self.listener.noticed(h, now, None if arg is None else now + float(arg))
            elif what == "release" and h.state is not WorkerState.RETIRING:
                h.state = WorkerState.RETIRING
                self.listener.retiring(h, now)

    def ready(self, h: WorkerHandle, pull_s: float, now: float) -> None:
        """`h` verified the current version."""
        self.listener.ready(h, pull_s, now)

    def declare_dead(self, h: WorkerHandle, reason: str, now: float, released: bool = False) -> None:
        if not h.alive:
            return
        self.listener.dying(h, now)  # its stream may be closed with reports taken and not yet handled
        h.state, h.fenced, h.released = WorkerState.DEAD, reason, released
        cause = self.causes.pop(h.name, None) or f"lost ({reason})"
        if released:
            event("instance %s given back (beyond the instance cap)", h.name)
        self.listener.died(h, reason, cause, now)
        if not released and self.on_dead is not None and self.on_dead(h):
            self.replacing += 1
            self.listener.replacing(self.replacing, None, now)

    def _replaced(self, failed: str | None, now: float) -> None:
        """A replacement joined (`failed` None) or will not."""
        self.replacing = max(0, self.replacing - 1)
        self.listener.replacing(self.replacing, failed, now)

    def retire(self, h: WorkerHandle, now: float) -> None:
        """End a worker given back: it holds nothing any more."""
        self.declare_dead(h, "released (beyond the instance cap)", now, released=True)
        if self.on_retire is not None:
            self.on_retire(h)
        else:
            end_actor(h.actor)

    def reap(self) -> list[WorkerHandle]:
        """Kill and forget workers declared dead (a fenced worker may still be running). Any thread."""
        with self.lock:
            dead = [h for h in self.workers.values() if not h.alive]
            for h in dead:
                del self.workers[h.name]
        for h in dead:
            end_actor(h.actor)
        return dead

    def shutdown(self) -> None:
        with self.lock:
            handles, self.workers = list(self.workers.values()), {}
        for h in handles:
            end_actor(h.actor)


def describe(h: WorkerHandle) -> str:
    """What the console calls the worker."""
    return "instance" if h.kind == PREEMPTIBLE else "reserved worker"


__all__ = ["BetweenSteps", "Membership", "WorkerTable", "describe"]
