"""`Liveness` across watches (a step, a wait between steps), on real Ray actors and an explicit clock:
a worker's silence counts from the watch's start, except that of a worker whose ping is still
unanswered, which counts from that ping. Without the exception a worker gone silent while it had no work
(noticed, or idle) is found only by a watch longer than the heartbeat timeout, and a run of short steps
never finds it (the room's drain scenario: 20 steps, the vanished host still counted alive)."""

from __future__ import annotations

import threading

import pytest
import ray

from rlboost.hybrid.handles import PREEMPTIBLE, WorkerHandle
from rlboost.hybrid.liveness import Liveness
from hybrid_util import patience

INTERVAL_S, TIMEOUT_S = 1.0, 5.0


@ray.remote(max_concurrency=2)
class Worker:
    """Answers pings, or none once silenced (a frozen or vanished worker, as the manager sees it)."""

    def __init__(self):
        self.quiet = threading.Event()

    def silence(self) -> None:
        self.quiet.set()

    def ping(self) -> int:
        if self.quiet.is_set():
            threading.Event().wait()  # never answers
        return 1


@pytest.fixture(scope="module", autouse=True)
def local_ray():
    # a local Ray of this module's own (ray.init() without an address joins whatever cluster is current)
    ray.init(address="local", num_cpus=1, include_dashboard=False, logging_level="ERROR")
    yield
    ray.shutdown()


def handle(name: str) -> WorkerHandle:
    actor = Worker.remote()
    ray.get(actor.ping.remote())  # up
    return WorkerHandle(name, PREEMPTIBLE, actor, pid=0, node_id="", max_running=1)


def watch(handles, start: float, until: float) -> list[str]:
    """A watch from `start` to `until` checked every half second of the explicit clock; the names it
    declares dead. Between the checks, the pings it sent get the time to come back."""
    liveness = Liveness(INTERVAL_S, TIMEOUT_S)
    liveness.watch_from(handles, start)
    dead, now = [], start
    while now <= until:
        dead += [h.name for h, _ in liveness.check([h for h in handles if h.name not in dead], now)]
        pings = [h.ping.ref for h in handles if h.ping is not None]
        ray.wait(pings, num_returns=len(pings), timeout=0.2)
        now += 0.5
    return dead


def answered_all(handles) -> None:
    pings = [h.ping.ref for h in handles if h.ping is not None and h.name != "silent"]
    ray.wait(pings, num_returns=len(pings), timeout=patience(10))


def test_a_worker_silent_across_short_watches_is_found_and_a_live_one_is_not():
    live, silent = handle("live"), handle("silent")
    ray.get(silent.actor.silence.remote())
    now, alive = 100.0, [live, silent]
    dead: list[str] = []
    for _ in range(4):  # watches of 3 s, each shorter than the 5 s timeout, 60 s apart (training between)
        dead += watch(alive, now, now + 3.0)
        alive = [h for h in alive if h.name not in dead]  # declared dead: out of the table's alive ones
        answered_all(alive)
        now += 60.0
    assert dead == ["silent"]  # found in the second watch: silent since its ping in the first
    assert live.last_report >= now - 60.0  # a ping answered between the watches counts from the next one


def test_silence_counts_from_the_watchs_start_for_a_worker_with_no_ping_in_flight():
    idle = handle("idle")
    idle.last_report = 0.0  # its last report was long ago: no step read its stream since
    assert watch([idle], 100.0, 103.0) == []  # and it answers the watch's ping: alive


def test_an_idle_worker_is_pinged_only_once_silent_past_the_heartbeat_it_sends_anyway():
    """An idle worker's heartbeat comes every interval by its own clock and reaches the manager a relay's
    hop and a turn later: pinged at one interval, every idle worker (64 reserved engines in a step's
    rollout) would cost the manager's loop an actor call a second each. Past two intervals it is asked."""
    h = handle("idle")
    liveness = Liveness(INTERVAL_S, TIMEOUT_S, node_check_s=float("inf"))
    h.last_report = 100.0
    assert liveness.check([h], 101.3) == [] and h.ping is None  # a heartbeat late by a hop and a turn
    h.last_report = 101.4  # ... which came
    assert liveness.check([h], 103.0) == [] and h.ping is None
    assert liveness.check([h], 103.5) == [] and h.ping is not None  # silent for two intervals: asked
    assert Liveness(1.0, 2.0).ping_after_s == 1.5  # and always before the timeout declares it dead
