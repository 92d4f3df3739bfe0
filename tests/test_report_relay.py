"""The report relay (rlboost.hybrid.report_relay) on real Ray streams, its own process between the workers and the
manager: every report handed over exactly once and in its stream's order, across steps (run / pause), drains and
held streams; a held stream runs ahead only as far as backpressure lets it; a worker killed mid-stream ends its
stream with a reason; a dead relay fails the step in one line; `close` ends the relay's process."""

from __future__ import annotations

import os
import threading
import time
from types import SimpleNamespace

import pytest
import ray

from hybrid_util import local_ray, patience, receive_until, streams_ended, take_in_rounds
from rlboost.hybrid.report_relay import RelayedReports

AHEAD = 2
"""Reports a stream may run ahead of the relay (the runtime's max_unacked_reports default)."""


@ray.remote(num_cpus=0, max_concurrency=4)
class Streamer:
    """A worker's stand-in: `stream()` yields `count` numbered reports; `hold_at` holds it before that one."""

    def __init__(self, name: str, count: int, interval_s: float = 0.0, hold_at: int | None = None):
        self.name, self.count, self.interval_s, self.hold_at = name, count, interval_s, hold_at
        self.sent = 0
        self.gate = threading.Event()

    def stream(self):
        for i in range(self.count):
            if i == self.hold_at:
                self.gate.wait()
            time.sleep(self.interval_s)
            self.sent = i + 1
            yield (self.name, i)

    def release(self) -> None:
        self.gate.set()

    def sent_so_far(self) -> int:
        return self.sent

    def pid(self) -> int:
        return os.getpid()


@pytest.fixture(scope="module")
def cluster():
    with local_ray():
        yield


@pytest.fixture
def relayed(cluster):
    """A `RelayedReports` over handles by name (a dict the test may empty, as a table reaps), closed after."""
    table: dict[str, SimpleNamespace] = {}
    reader = RelayedReports(table.get, turn_s=0.0)
    reader.start()
    try:
        yield reader, table
    finally:
        reader.close()


def workers(reader, table, count: int, reports: int, interval_s: float = 0.0, **kwargs) -> list[SimpleNamespace]:
    handles = []
    for i in range(count):
        name = f"w{len(table)}"
        h = table[name] = SimpleNamespace(name=name, actor=Streamer.remote(name, reports, interval_s, **kwargs),
                                          streaming=False)
        reader.watch(h, AHEAD)
        handles.append(h)
    return handles


def test_every_report_is_handed_over_once_in_order_across_steps_and_drains(relayed):
    reader, table = relayed
    handles = workers(reader, table, 4, 40, interval_s=0.002)
    assert all(h.streaming for h in handles)
    got, rounds, paused = take_in_rounds(reader, handles)  # what the relay took stays for the next round
    cpu = sum(paused)  # each pause returns the relay's CPU seconds since its round's run()
    for h in handles:
        assert got[h.name] == [(h.name, i) for i in range(40)] + ["its stream ended"], h.name
        assert not h.streaming
    assert rounds > 2  # the pauses and drains did happen mid-stream
    assert cpu > 0  # what relaying cost, measured in the relay's process
    assert reader.drain(handles[0]) == []  # an ended stream, handed over, is forgotten


def test_a_held_stream_runs_ahead_only_as_far_as_backpressure_lets_it_then_is_read_whole(relayed):
    reader, table = relayed
    handles = workers(reader, table, 3, 30)
    held, others = handles[0], handles[1:]
    try:
        with reader.held(held.name):  # from before the relay reads anything
            reader.run()
            got = receive_until(reader, handles, lambda g: streams_ended({h.name: g[h.name] for h in others}))
            assert got[held.name] == []
            # it stops at its yield once AHEAD reports wait unread (the one it blocks on is made, not sent)
            assert ray.get(held.actor.sent_so_far.remote()) <= AHEAD + 1
        got = receive_until(reader, [held], streams_ended)
        assert got[held.name] == [(held.name, i) for i in range(30)] + ["its stream ended"]
    finally:
        reader.pause()


def test_a_worker_killed_mid_stream_closes_its_stream_and_a_reaped_ones_items_are_dropped(relayed):
    reader, table = relayed
    victim, reaped, kept = workers(reader, table, 3, 20, hold_at=10)
    reader.run()
    try:
        got = receive_until(reader, [victim, reaped, kept], lambda g: all(len(items) >= 10 for items in g.values()))
        ray.kill(victim.actor, no_restart=True)
        del table[reaped.name]  # the table forgot it: whatever still comes of it is nobody's
        ray.get(reaped.actor.release.remote())
        ray.get(kept.actor.release.remote())
        got = receive_until(reader, [victim, kept], lambda g: g[victim.name][-1:] != [] and isinstance(
            g[victim.name][-1], str) and streams_ended({kept.name: g[kept.name]}), got)
    finally:
        reader.pause()
    assert got[victim.name][:10] == [(victim.name, i) for i in range(10)]
    # Ray ends a killed actor's stream, or fails it: either closes it, with the reason
    assert got[victim.name][-1] == "its stream ended" or got[victim.name][-1].startswith("it died"), got[victim.name]
    assert not victim.streaming
    assert got[reaped.name] == [(reaped.name, i) for i in range(10)]  # nothing after it was reaped
    assert got[kept.name] == [(kept.name, i) for i in range(20)] + ["its stream ended"]


def test_a_dead_relay_fails_the_step_in_one_line(relayed):
    reader, table = relayed
    workers(reader, table, 1, 5)
    reader.run()
    ray.kill(reader._relay, no_restart=True)
    with pytest.raises(RuntimeError, match=r"^the report relay failed in take: \S+") as e:
        for _ in range(100):  # what was taken before the kill may still come back first
            reader.receive(0.05)
    assert "\n" not in str(e.value)


def test_close_ends_the_relays_process(cluster):
    reader = RelayedReports(lambda name: None)
    reader.start()
    pid = ray.get(reader._relay.pid.remote())
    assert _alive(pid)
    reader.close()
    deadline = time.monotonic() + patience(30)
    while _alive(pid):
        assert time.monotonic() < deadline, f"the relay's process {pid} outlived close()"
        time.sleep(0.1)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie has ended
        return f.read().rsplit(")", 1)[1].split()[0] != "Z"
