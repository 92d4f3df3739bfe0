"""The rollout manager: the workers of a hybrid run across steps, and the steps they serve.

Contract (docs/hybrid.md, "The step"; docs/elastic.md, "Weights: published once, pulled, verified"; and
the invariants of docs/hybrid.md, "Invariants and the tests that check them"):
- `add_worker` admits a started worker, mid-step included; one serving another model, or claiming the
  current version with other bytes, is refused (and killed). It then pulls the current weights and
  joins the dispatch only once they verify (`rlboost.hybrid.pulls`).
- `publish(manifest)` makes a version the one to serve: reserved workers load it before this returns
  (the next step starts with them), the others pull it in the background.
- `start_step(...)` runs one step's rollout (`rlboost.hybrid.step_run.StepRun`): a thread drives the
  step's `StepState` (rlboost.rollout.step_state), which takes every decision; the Ray side only turns
  reports, answers and deaths into its events and carries out its commands. That thread takes the
  table's `owner` itself and releases it itself; `cancel_step` (a stop, `shutdown`) ends it.
- `table.notice` (a preemption warning), `table.release` (an instance given back beyond the cap) and
  `table.fence` (declare dead) may come from any thread; a worker declared dead never contributes again
  (invariant 6).

Its workers live in a `WorkerTable` (rlboost.hybrid.worker_table: handles, inbox, deaths, retirement,
and the threads that may change them); the manager adds what serves them across steps: the weight
version and its pulls, and the dispatch policies every step uses. It never sees a step's state: a step
listens to the table while it runs, and ends in a `StepReport`.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from rlboost.cluster.config import WeightsConfig
from rlboost.cluster.manifest import WeightManifest
from rlboost.engine.sampling_params import SamplingParams
from rlboost.hybrid.config import HybridConfig
from rlboost.hybrid.handles import PREEMPTIBLE, RESERVED, WorkerHandle, WorkerState, end_actor
from rlboost.hybrid.liveness import Liveness
from rlboost.hybrid.pulls import PullTracker
from rlboost.hybrid.report_relay import RelayedReports
from rlboost.hybrid.worker_table import WorkerTable
from rlboost.policies.handoff import StepOutlook
from rlboost.policies import Balancer, JSQDispatcher, ThroughputProfile
from rlboost.rollout.sample import Group


class RolloutManager:
    def __init__(self, cfg: HybridConfig, weights: WeightsConfig, max_staleness: int = 0):
        """`max_staleness` k: a step admits tokens of versions up to k behind its own, and workers swap
        a new version in between tokens (docs/staleness.md); 0: the synchronous step."""
        self.cfg = cfg
        self.max_staleness = max_staleness
        self.table = WorkerTable()
        self.reader = RelayedReports(self.table.get)
        """The workers' reports, taken the moment they arrive by a relay process on this machine while a
        step runs, handed to the step in batches (`rlboost.hybrid.report_relay`)."""
        self.dispatcher = JSQDispatcher(cfg.max_pending)
        self.balancer = Balancer()
        self.pulls = PullTracker(weights.pull_timeout_s, weights.pull_retries, cfg.call_timeout_s,
                                 stage=max_staleness > 0)
        self.current = None
        """The last step started (a `StepRun`), until `cancel_step`."""

    @property
    def manifest(self) -> WeightManifest | None:
        return self.pulls.manifest

    def add_worker(self, handle: WorkerHandle) -> bool:
        """Admit a started worker (from any thread, mid-step too). It pulls the current weights and
        becomes eligible once they verify. One serving another model is refused (False)."""
        why = self.pulls.refusal(handle)
        if why:
            self.pulls.stats.refused.append((handle.name, why))
            end_actor(handle.actor)
            return False
        # at most max_unacked_reports ahead of the relay (Ray's backpressure; 0: none)
        self.reader.watch(handle, self.cfg.max_unacked_reports)
        handle.last_report = time.monotonic()
        handle.profile = ThroughputProfile(tolerance=self.cfg.plateau_tolerance)
        handle.state = WorkerState.SERVING if self._holds_current(handle) else WorkerState.JOINING
        self.pulls.start(handle, time.monotonic())  # nobody else sees the handle yet: ours to change
        self.table.admit(handle)
        return True

    # ---- the driver's calls between steps ------------------------------------------------------------

    def publish(self, manifest: WeightManifest) -> None:
        """Make `manifest` the version to serve. Reserved workers load it before this returns (the next
        step starts with them); the others pull in the background. Never waits on a preemptible one.
        While a run ahead of its trainer owns the workers (bounded staleness), its loop does this."""
        run = self.current
        if run is not None and run.call(lambda: self._publish_held(manifest)):
            return
        with self.table.owner:
            self._publish_held(manifest)

    def _publish_held(self, manifest: WeightManifest) -> None:
        """`publish`, by the thread that holds the table's `owner`."""
        import ray

        table = self.table
        self.pulls.publish(manifest)
        table.apply_inbox(time.monotonic())
        for h in table.alive():
            self.pulls.start(h, time.monotonic())
        deadline = time.monotonic() + self.pulls.timeout_s
        while time.monotonic() < deadline:
            reserved = [h for h in table.alive(RESERVED) if h.version != manifest.version]
            if not reserved:
                break
            refs = [h.pull.ref for h in reserved if h.pull is not None]
            if refs:
                ray.wait(refs, num_returns=len(refs), timeout=max(0.0, deadline - time.monotonic()))
            self.pulls.settle(table, time.monotonic())

    def wait_ready(self, timeout_s: float | None = None) -> None:
        """Until every live worker serves the current version (or was dropped). A worker that shows no
        sign of life for `heartbeat_timeout_s` is dropped as a step would drop it (`Liveness`): a host
        that vanished mid-pull holds the wait no longer than that, not until Ray finds its node gone."""
        limit = timeout_s or self.pulls.timeout_s
        start = time.monotonic()
        deadline = start + limit
        liveness = Liveness(self.cfg.heartbeat_interval_s, self.cfg.heartbeat_timeout_s)
        table = self.table
        with table.owner:
            table.apply_inbox(start)
            liveness.watch_from(table.alive(), start)
            while True:
                now = time.monotonic()
                table.apply_inbox(now)
                for h, reason in liveness.check(table.alive(), now):
                    table.declare_dead(h, reason, now)
                self.pulls.settle(table, now)
                if all(h.version == self.manifest.version and h.pull is None for h in table.alive()):
                    return
                if now > deadline:
                    raise TimeoutError(f"workers not at weight version {self.manifest.version} after {limit}s")
                time.sleep(0.01)

    def start_step(self, *args, **kwargs):
        """`make_step(*args, **kwargs)`, started (`begin`): its thread owns the workers from before this
        returns until the step ends, and releases them itself."""
        return self.begin(self.make_step(*args, **kwargs))

    def make_step(self, groups: list[Group], params: SamplingParams, version: int, seed_window_s: float | None,
                  order: list[str] | None = None, overruns: Callable[[dict[str, int]], list[str]] | None = None,
                  history: Callable[[list[int]], list[list[int]]] | None = None, outlook: StepOutlook | None = None,
                  sibling_tokens_per_step: int = 0, expected: Callable[[str], float | None] | None = None,
                  ahead: bool = False, on_done: Callable[[], None] | None = None, exact: bool = False,
                  make_successor: Callable[[], object] | None = None):
        """The run that generates every sample of `groups` at weight `version` (see StepRun), not started:
        building it changes nothing of the table's (`begin` starts it). `seed_window_s=None`:
        every worker generates to the end (evaluation). `outlook`: the offload controller's, for the
        no-regret hand-off (None: at the window's end).
        `sibling_tokens_per_step`: HistoSpec's sibling progress across workers (0: off). `expected`: uid ->
        the length its prompt's history expects (HistoPipe's), for what a preemption notice leaves running.
        `ahead`: a run started before its trainer comes (`StepRun.adopt`), `version` the one that will
        train it; `on_done`: called from the run's thread once its rollout is over (bounded staleness).
        `exact`: every token of `version`, whatever the run's max_staleness (an evaluation).
        `make_successor`: builds the next step's run in this one's tail (`rlboost.hybrid.step_succession`)."""
        from rlboost.hybrid.step_run import StepPolicies, StepRun

        policies = StepPolicies(self.dispatcher, self.balancer, order, overruns, outlook, expected)
        return StepRun(self.table, self.reader, self.pulls, policies, self.cfg, groups, params, version, seed_window_s,
                       history, sibling_tokens_per_step, 0 if exact else self.max_staleness, ahead, on_done,
                       make_successor)

    def begin(self, run):
        """Start `run` (a `make_step`'s); it is the step under way from now."""
        self.current = run  # before it starts: whoever ends the run (`cancel_step`) finds it, however this returns
        run.start()
        return run

    def cancel_step(self) -> None:
        """End the step under way, if any, and wait for its loop (a stop, a shutdown): the loop releases
        the workers itself. Any thread; a second call does nothing."""
        run, self.current = self.current, None
        if run is not None:
            run.cancel()

    def shutdown(self) -> None:
        self.cancel_step()
        self.reader.pause()
        self.table.shutdown()
        self.reader.close()

    def _holds_current(self, h: WorkerHandle) -> bool:
        m = self.pulls.manifest
        return m is not None and h.version == m.version and h.checksum == m.checksum


__all__ = ["PREEMPTIBLE", "RESERVED", "RolloutManager"]
