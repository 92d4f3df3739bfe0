"""The rollout manager: the workers of a hybrid run across steps, and the steps they serve.

Contract (DESIGN.md 2.3, 2.5 and the invariants of section 3):
- `add_worker` admits a started worker, mid-step included; one serving another model, or claiming the
  current version with other bytes, is refused (and killed). It then pulls the current weights and
  joins the dispatch only once they verify (`rlboost.hybrid.pulls`).
- `publish(manifest)` makes a version the one to serve: reserved workers load it before this returns
  (the next step starts with them), the others pull it in the background.
- `start_step(...)` runs one step's rollout (`rlboost.hybrid.step_run.StepRun`): a thread drives the
  step's `StepState` (rlboost.rollout.step_state), which takes every decision; the Ray side only turns
  reports, answers and deaths into its events and carries out its commands.
- `notice` (a preemption warning), `release` (an instance given back beyond the cap) and `fence` (declare
  dead) may come from any thread; a worker declared dead never contributes again (invariant 6).

Threads, and who may change what:

    driver thread                     provider and boot threads           the step's loop thread
    (HybridRollout, tests)            (providers, Fleet.launch)           (one per step)
    ----------------------            -------------------------           ----------------------
    publish, wait_ready, reap,        add_worker, notice, release,        owns the workers while the
    start_step: own the workers       fence: put a message in the         step runs: applies the inbox,
    between steps                     inbox; never change a handle        reads reports, polls pulls and
                                                                          liveness, drives the StepState
           \\____________ whoever holds `owner` applies the inbox _______________/

    inbox messages:  join -> the step under way takes it in           notice  -> NOTICED (the step takes its
                     fence -> DEAD (the step requeues its samples)             samples back)
                     release -> RETIRING (the step takes its samples back, then it is ended)

`owner` is held by the driver's calls between steps and handed to the loop thread for a whole step
(start_step takes it, the loop thread gives it back when the step ends), so exactly one thread changes
handles at any time. The `workers` dict itself is guarded by `lock`: add_worker inserts, reap removes
dead workers, alive() reads a snapshot; any thread may read a handle.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable

from rlboost.cluster.config import WeightsConfig
from rlboost.cluster.manifest import WeightManifest
from rlboost.engine.sampling_params import SamplingParams
from rlboost.hybrid.config import HybridConfig
from rlboost.hybrid.handles import PREEMPTIBLE, RESERVED, Lifecycle, WorkerHandle
from rlboost.hybrid.pulls import PullTracker
from rlboost.policies.handoff import StepOutlook
from rlboost.policies import Balancer, JSQDispatcher, ThroughputProfile
from rlboost.rollout.sample import Group
from rlboost.run_log import event


class RolloutManager:
    def __init__(self, cfg: HybridConfig, weights: WeightsConfig):
        self.cfg = cfg
        self.workers: dict[str, WorkerHandle] = {}
        self.lock = threading.Lock()
        self.owner = threading.Lock()
        self.inbox: queue.SimpleQueue[tuple[str, str, object]] = queue.SimpleQueue()
        self.dispatcher = JSQDispatcher(cfg.max_pending)
        self.balancer = Balancer()
        self.pulls = PullTracker(weights.pull_timeout_s, weights.pull_retries, cfg.call_timeout_s)
        self.run = None
        """The step under way (a StepRun), None between steps."""
        self.on_retire: Callable[[WorkerHandle], None] | None = None
        """Ends an instance given back (the fleet kills its actor and node); None: kill the actor."""
        self.deaths_between_steps: list[tuple[str, str, bool]] = []
        """(worker, reason, preempted) of workers declared dead while no step ran."""
        self.causes: dict[str, str] = {}
        """Worker -> who ended it ("preempted by the trace"), told by whoever killed it, for the
        console's line when its death is found; never an input to a decision."""

    @property
    def manifest(self) -> WeightManifest | None:
        return self.pulls.manifest

    # ---- inputs from any thread ----------------------------------------------------------------------

    def add_worker(self, handle: WorkerHandle) -> bool:
        """Admit a started worker (from any thread, mid-step too). It pulls the current weights and
        becomes eligible once they verify. One serving another model is refused (False)."""
        import ray

        why = self.pulls.refusal(handle)
        if why:
            self.pulls.stats.refused.append((handle.name, why))
            ray.kill(handle.actor, no_restart=True)
            return False
        handle.stream = handle.actor.stream.options(num_returns="streaming").remote()
        handle.last_report = time.monotonic()
        handle.profile = ThroughputProfile(tolerance=self.cfg.plateau_tolerance)
        handle.lifecycle = Lifecycle.SERVING if self._holds_current(handle) else Lifecycle.JOINING
        self.pulls.start(handle, time.monotonic())  # nobody else sees the handle yet: ours to change
        with self.lock:
            self.workers[handle.name] = handle
        self.inbox.put(("join", handle.name, None))  # the owner tells the step under way, if any
        return True

    def notice(self, name: str, seconds: float) -> None:
        """A preemption notice: the instance goes away in about `seconds`. It gets no more work, and
        its samples are taken back before the kill."""
        self.inbox.put(("notice", name, seconds))

    def release(self, name: str) -> None:
        """Give an instance back (beyond the instance cap): no more work, its samples are taken back
        exactly, then it is ended (`on_retire`). Not a preemption."""
        self.inbox.put(("release", name, None))

    def fence(self, name: str, reason: str) -> None:
        """Declare a worker dead; from then on everything it sends is dropped."""
        self.inbox.put(("fence", name, reason))

    def alive(self, kind: str | None = None) -> list[WorkerHandle]:
        with self.lock:
            return [h for h in self.workers.values() if h.alive and kind in (None, h.kind)]

    def handles(self) -> list[WorkerHandle]:
        """Every worker not reaped yet, dead ones included (their streams are still read)."""
        with self.lock:
            return list(self.workers.values())

    # ---- the driver's calls between steps ------------------------------------------------------------

    def publish(self, manifest: WeightManifest) -> None:
        """Make `manifest` the version to serve. Reserved workers load it before this returns (the next
        step starts with them); the others pull in the background. Never waits on a preemptible one."""
        import ray

        with self.owner:
            self.pulls.publish(manifest)
            self.apply_inbox(time.monotonic())
            for h in self.alive():
                self.pulls.start(h, time.monotonic())
            deadline = time.monotonic() + self.pulls.timeout_s
            while time.monotonic() < deadline:
                reserved = [h for h in self.alive(RESERVED) if h.version != manifest.version]
                if not reserved:
                    break
                refs = [h.pull.ref for h in reserved if h.pull is not None]
                if refs:
                    ray.wait(refs, num_returns=len(refs), timeout=max(0.0, deadline - time.monotonic()))
                self._poll_pulls(time.monotonic())

    def wait_ready(self, timeout_s: float | None = None) -> None:
        """Until every live worker serves the current version (or was dropped)."""
        limit = timeout_s or self.pulls.timeout_s
        deadline = time.monotonic() + limit
        with self.owner:
            while True:
                now = time.monotonic()
                self.apply_inbox(now)
                self._poll_pulls(now)
                if all(h.version == self.manifest.version and h.pull is None for h in self.alive()):
                    return
                if now > deadline:
                    raise TimeoutError(f"workers not at weight version {self.manifest.version} after {limit}s")
                time.sleep(0.01)

    def reap(self) -> list[WorkerHandle]:
        """Kill and forget workers declared dead (a fenced worker may still be running). Any thread."""
        import ray

        with self.lock:
            dead = [h for h in self.workers.values() if not h.alive]
            for h in dead:
                del self.workers[h.name]
        for h in dead:
            ray.kill(h.actor, no_restart=True)
        return dead

    def start_step(self, groups: list[Group], params: SamplingParams, version: int, seed_window_s: float | None,
                   order: list[str] | None = None, overruns: Callable[[dict[str, int]], list[str]] | None = None,
                   history: Callable[[list[int]], list[list[int]]] | None = None, outlook: StepOutlook | None = None):
        """Generate every sample of `groups` at weight `version` (see StepRun); its thread owns the workers
        until the step ends. `seed_window_s=None`: every worker generates to the end (evaluation).
        `outlook`: the offload controller's, for the no-regret hand-off (None: at the window's end)."""
        from rlboost.hybrid.step_run import StepRun

        self.owner.acquire()
        try:
            self.apply_inbox(time.monotonic())
            self.run = StepRun(self, groups, params, version, seed_window_s, order, overruns, history, outlook)
            self.run.thread.start()
        except BaseException:
            self.run = None
            self.owner.release()
            raise
        return self.run

    def shutdown(self) -> None:
        import ray

        with self.lock:
            handles, self.workers = list(self.workers.values()), {}
        for h in handles:
            ray.kill(h.actor, no_restart=True)

    # ---- applied by the owner ------------------------------------------------------------------------

    def apply_inbox(self, now: float) -> None:
        """Carry out what other threads asked for (the owner's part of their calls)."""
        while True:
            try:
                what, name, arg = self.inbox.get_nowait()
            except queue.Empty:
                return
            h = self.workers.get(name)
            if h is None or not h.alive:
                continue
            run = self.run
            if what == "join":
                if run is not None:
                    run.joined(h)
            elif what == "fence":
                self.declare_dead(h, str(arg), now)
            elif what == "notice" and not h.draining:
                h.lifecycle = Lifecycle.NOTICED
                if run is not None:
                    run.state.notice(name, now)
            elif what == "release" and h.lifecycle is not Lifecycle.RETIRING:
                h.lifecycle = Lifecycle.RETIRING
                if run is not None:
                    run.state.retire(name, now)  # the step gives it back once it holds nothing
                else:
                    self.retire(h, now)

    def declare_dead(self, h: WorkerHandle, reason: str, now: float, released: bool = False) -> None:
        if not h.alive:
            return
        if self.run is not None and h.stream is not None:
            self.run.drain(h, now)  # what it sent before the death counts; after it, it is fenced
        h.lifecycle, h.fenced, h.released = Lifecycle.DEAD, reason, released
        what = "instance" if h.kind == PREEMPTIBLE else "reserved worker"
        cause = self.causes.pop(h.name, None) or f"lost ({reason})"
        if released:
            event("instance %s given back (beyond the instance cap)", h.name)
        if self.run is None:
            self.deaths_between_steps.append((h.name, reason, h.kind == PREEMPTIBLE and not released))
            if not released:
                event("%s %s %s between steps: no samples in flight", what, h.name, cause)
            return
        state = self.run.state
        worker = state.workers.get(h.name)
        held, wasted = (len(worker.assigned) if worker is not None else 0), state.stats.wasted_tokens
        state.dead(h.name, reason, now, released)
        if not released:
            event("%s %s %s: %d samples migrated, %d tokens lost", what, h.name, cause, held,
                  state.stats.wasted_tokens - wasted)

    def retire(self, h: WorkerHandle, now: float) -> None:
        """End a worker given back: it holds nothing any more."""
        import ray

        self.declare_dead(h, "released (beyond the instance cap)", now, released=True)
        if self.on_retire is not None:
            self.on_retire(h)
        else:
            ray.kill(h.actor, no_restart=True)

    def _poll_pulls(self, now: float) -> None:
        for event in self.pulls.poll(self.alive(), now):
            if event.ready:
                if self.run is not None:
                    self.run.ready(event.handle, event.seconds)
            else:
                self.declare_dead(event.handle, event.reason, now)

    def _holds_current(self, h: WorkerHandle) -> bool:
        m = self.pulls.manifest
        return m is not None and h.version == m.version and h.checksum == m.checksum


__all__ = ["PREEMPTIBLE", "RESERVED", "RolloutManager"]
