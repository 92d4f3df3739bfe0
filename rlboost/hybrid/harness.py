"""Driving a fleet from outside a training run: a fleet on a Ray cluster of its own, one rollout step with
faults fired at exact events of it, hard kills, and the tokens a death lost as the workers' ledgers count
them. `rlboost bench hybrid`, `rlboost bench cluster` and the hybrid tests drive their fleets with it.

Contract:
- A fault is `(when, what)`: `what(run)` is done once, as soon as `when(run)` holds, from a thread of the
  caller's while the step's loop runs. The events are the step's own (a worker's token count, the
  hand-off, a worker's state), never a time: a run on a loaded machine meets the same events in the same
  order. Both read the step through `StepRun`'s public state and copy what they iterate
  (`list(d.items())`, made in one piece under the GIL).
- `run_step` ends the seeding window at an event too (`handoff`), and cancels a step that makes no
  progress for `patience(stall_s)`, so a hang ends in a failure instead of blocking its caller.
- Every limit on how long something may take is a `patience`: the seconds an idle machine needs,
  stretched by the load beside it.
- `lost_to_deaths` reads the dead workers' ledgers: per request, the tokens generated and never received.
"""

from __future__ import annotations

import contextlib
import math
import os
import threading
import time
from collections.abc import Callable

from rlboost.cluster.config import ClusterConfig
from rlboost.cluster.ray_cluster import Cluster
from rlboost.cluster.resources import PREEMPTIBLE, RESERVED
from rlboost.engine.sampling_params import SamplingParams
from rlboost.hybrid.config import HybridConfig
from rlboost.hybrid.fleet import Fleet
from rlboost.hybrid.manager import RolloutManager
from rlboost.hybrid.step_run import StepRun
from rlboost.hybrid.token_ledger import ledger_path, read_ledger
from rlboost.hybrid.worker import WorkerSpec
from rlboost.rollout.sample import Group

STALL_S = 60.0
"""A step that makes no progress (no token arrives) for this long, times the machine's load, is hung."""


def load_factor() -> float:
    """How much slower than an idle machine things may run now: the runnable processes per core over the
    last minute (at least 1)."""
    return max(1.0, os.getloadavg()[0] / (os.cpu_count() or 1))


def patience(seconds: float) -> float:
    """A limit of `seconds` on an idle machine, stretched by the load beside it (read now, when the
    limit is set, never when a module is imported)."""
    return seconds * 2 * load_factor()


def wait_for(predicate: Callable[[], bool], timeout_s: float, what: str) -> None:
    """Until `predicate()` holds; an AssertionError naming `what` after `patience(timeout_s)`."""
    deadline = time.monotonic() + patience(timeout_s)
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


class OwnClusterFleet(Fleet):
    """A fleet on a cluster of its own: its shutdown ends the cluster too. It remembers the tensors it
    published as each version (`published`), which a check can recompute samples with."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.published: dict[int, dict] = {}

    def publish(self, state, version: int):
        self.published[version] = state
        return super().publish(state, version)

    def served(self) -> dict:
        """The tensors of the version the fleet serves now."""
        return self.published[self.manifest.version]

    def shutdown(self) -> None:
        try:
            super().shutdown()
        finally:
            self.cluster.shutdown()


def start_fleet(hybrid: HybridConfig, spec: WorkerSpec, state: dict, cluster: ClusterConfig | None = None,
                preemptible: int | None = None, boot_s: float = 120.0) -> OwnClusterFleet:
    """A fleet of `hybrid.num_reserved` reserved and `preemptible` (default `hybrid.num_preemptible`)
    workers serving `state` as version 0, on a cluster of its own, each worker ready within
    `patience(boot_s)`. Shut down again, cluster included, if any part of it fails to start, so a failure
    never leaves Ray running for whatever comes next."""
    cluster_cfg = cluster or ClusterConfig()
    ray_cluster = Cluster(cluster_cfg, hybrid.instances)
    try:
        fleet = OwnClusterFleet(hybrid, spec, RolloutManager(hybrid, cluster_cfg.weights), ray_cluster)
    except BaseException:
        ray_cluster.shutdown()
        raise
    try:
        fleet.publish(state, version=0)
        fleet.start_pool({RESERVED: hybrid.num_reserved,
                          PREEMPTIBLE: hybrid.num_preemptible if preemptible is None else preemptible})
        fleet.wait_ready(timeout_s=patience(boot_s))
    except BaseException:
        fleet.shutdown()
        raise
    return fleet


# ---- the step's events ------------------------------------------------------------------------------------

Fault = tuple[Callable[[StepRun], bool], Callable[[StepRun], None]]
"""(when, what): `what(run)` is done once, as soon as `when(run)` holds."""

Pick = Callable[[StepRun], "str | None"]
"""Names a worker of the step once the step knows one (None until then)."""


def after_tokens(worker: Pick, tokens: int) -> Callable[[StepRun], bool]:
    """When the worker `worker(run)` names has streamed at least `tokens` tokens in the step."""
    return lambda run: (name := worker(run)) is not None and run.stats.tokens_by_worker[name] >= tokens


def preemptible(index: int) -> Pick:
    """The `index`-th preemptible worker of the step (by name), once the step knows it."""
    def name(run: StepRun) -> str | None:
        names = sorted(n for n, w in list(run.state.workers.items()) if w.kind == PREEMPTIBLE)
        return names[index] if index < len(names) else None
    return name


def first_preemptible_past(tokens: int, skip: Callable[[], set[str]] = set) -> Pick:
    """The first live preemptible worker (by name), not in `skip()`, that has streamed `tokens` tokens."""
    def name(run: StepRun) -> str | None:
        skipped = skip()
        return next((n for n, w in sorted(list(run.state.workers.items()))
                     if w.kind == PREEMPTIBLE and w.alive and n not in skipped
                     and run.stats.tokens_by_worker[n] >= tokens), None)
    return name


def reserved(run: StepRun) -> str | None:
    """The live reserved worker of the step, once the step knows it."""
    return next((n for n, w in list(run.state.workers.items()) if w.kind == RESERVED and w.alive), None)


def busiest(run: StepRun) -> str | None:
    """The live preemptible worker holding the most samples, once one holds any after the hand-off."""
    if not run.stats.migrated["seed_handoff"] and run.state.seeding:
        return None
    held = {n: len(w.assigned) for n, w in list(run.state.workers.items()) if w.kind == PREEMPTIBLE and w.alive}
    return max(sorted(held), key=held.get) if held and max(held.values()) > 0 else None


def handed_off(run: StepRun) -> bool:
    """When the seeding window has ended and the reserved workers' samples went to the instances."""
    return run.stats.migrated["seed_handoff"] > 0 and not run.state.seeding


def reserved_streamed(run: StepRun) -> bool:
    """When the reserved workers have streamed their first tokens: each of their samples then has nearly
    all of its budget to go, so a hand-off at this event finds every one of them still running."""
    return run.stats.tokens_by_kind[RESERVED] > 0


def kill(fleet: Fleet, worker: Pick, how: str | None = None) -> Callable[[StepRun], None]:
    """Hard-kill the instance `worker(run)` names, as its provider would (`Fleet.preempt`)."""
    def act(run: StepRun) -> None:
        fleet.preempt(fleet.worker(worker(run)), how)
    return act


@contextlib.contextmanager
def reports_held(fleet: Fleet, name: str, held: Callable[[], None] = lambda: None):
    """Inside: the manager's report relay skips worker `name`'s stream, as a reader fallen behind on it
    would (its reports wait unread in Ray, as many as backpressure lets it send); `held()` is called once
    a round of the relay's reader has started without it. Outside: read again, whatever happened."""
    with fleet.manager.reader.held(name):
        held()
        yield


# ---- one step ---------------------------------------------------------------------------------------------

def run_step(manager: RolloutManager, groups: list[Group], params: SamplingParams, version: int,
             handoff: Callable[[StepRun], bool] | float | None = reserved_streamed, faults: list[Fault] = (),
             stall_s: float = STALL_S, expected: Callable[[str], float | None] | None = None
             ) -> tuple[list[Group], StepRun]:
    """One rollout step of `groups` at `version` with `faults` fired at their events. The seeding window
    ends when `handoff(run)` holds (a predicate: the hand-off at an event of the step), after `handoff`
    seconds (a number: the run's own timed window, as a bench measures it), or never (None: every worker
    generates to the end, as in an evaluation). Returns (groups in arrival order, the StepRun, its loop
    ended). A step with no progress for `patience(stall_s)` is cancelled: its caller gets an error, not a
    hang."""
    timed = handoff is None or isinstance(handoff, (int, float))
    run = manager.start_step(groups, params, version=version, seed_window_s=handoff if timed else math.inf,
                             expected=expected)
    done = threading.Event()
    if not timed:
        faults = [(handoff, lambda run: run.end_seed_window()), *faults]

    def script():
        pending = list(faults)
        while pending and not done.is_set():
            for fault in [f for f in pending if f[0](run)]:
                pending.remove(fault)
                fault[1](run)
            time.sleep(0.002)

    def watchdog():
        seen, since = -1, time.monotonic()
        while not done.wait(0.5):
            progress = run.tokens()
            if progress != seen:
                seen, since = progress, time.monotonic()
            elif time.monotonic() - since > patience(stall_s):
                run.cancel()
                return

    threads = [threading.Thread(target=script, name="step-faults", daemon=True),
               threading.Thread(target=watchdog, name="step-watchdog", daemon=True)]
    for t in threads:
        t.start()
    try:
        out = list(run.groups())
    finally:
        done.set()
        for t in threads:
            t.join()
    run.wait()
    return out, run


# ---- what deaths lost -------------------------------------------------------------------------------------

def lost_to_deaths(run: StepRun, ledger_dir) -> dict[str, dict[str, int]]:
    """Per worker the step declared dead, per request of the step it served: the tokens it generated (in
    its engine, or in reports Ray carried) and the step never received, from its ledger
    (`rollout.hybrid.ledger_dir`). An abort's answer brings tokens never streamed: those are received."""
    lost: dict[str, dict[str, int]] = {}
    for _, name, _ in run.stats.deaths:
        ledger = read_ledger(ledger_path(ledger_dir, name))
        lost[name] = {request_id: generated - run.stats.received[request_id]
                      for request_id, generated in ledger.generated.items()
                      if request_id.rpartition("#")[0] in run.tracked}  # not a request of an earlier step
    return lost


__all__ = ["Fault", "OwnClusterFleet", "Pick", "STALL_S", "after_tokens", "busiest",
           "first_preemptible_past", "handed_off", "kill", "load_factor", "lost_to_deaths", "patience", "preemptible",
           "reports_held", "reserved", "reserved_streamed", "run_step", "start_fleet", "wait_for"]
