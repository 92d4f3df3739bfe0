"""`ReportReader` on real Ray streams (rlboost.hybrid.streams): every report of every stream taken exactly
once and in its stream's order, across pauses, drains and skipped streams; and while reports keep coming the reader
polls instead of waiting over every stream per report (counted, not timed)."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import pytest
import ray

from hybrid_util import local_ray, patience, receive_until, streams_ended, take_in_rounds
from rlboost.hybrid import streams
from rlboost.hybrid.streams import ReportReader

AHEAD = 2
"""Reports a stream may run ahead of the reader (the runtime's max_unacked_reports default)."""


@ray.remote(max_concurrency=256, num_cpus=0)
class Producer:
    """Streams of numbered reports; `gate` holds every stream of this actor before report `hold_at`."""

    def __init__(self):
        self.sent: dict[str, int] = {}
        self.gate = threading.Event()
        self.gate.set()
        self.hold_at = None

    def hold(self, at: int) -> None:
        self.hold_at = at
        self.gate.clear()

    def release(self) -> None:
        self.gate.set()

    def stream(self, name: str, count: int, interval_s: float):
        for i in range(count):
            if i == self.hold_at:
                self.gate.wait()
            time.sleep(interval_s)
            self.sent[name] = i + 1
            yield (name, i)

    def sent_by(self) -> dict[str, int]:
        return dict(self.sent)


@pytest.fixture(scope="module")
def cluster():
    with local_ray():
        yield


def open_streams(producer, count: int, reports: int, interval_s: float = 0.0) -> list[SimpleNamespace]:
    return [SimpleNamespace(name=f"w{i}", stream=producer.stream.options(
        num_returns="streaming", _generator_backpressure_num_objects=AHEAD).remote(f"w{i}", reports, interval_s))
        for i in range(count)]


def test_every_report_is_taken_once_in_order_across_pauses_and_drains(cluster):
    producer = Producer.remote()
    handles = open_streams(producer, 6, 40, interval_s=0.002)
    reader = ReportReader(lambda: handles, turn_s=0.0)
    got, rounds, _ = take_in_rounds(reader, handles)
    for h in handles:
        assert got[h.name] == [(h.name, i) for i in range(40)] + ["its stream ended"], h.name
        assert h.stream is None
    assert rounds > 2  # the pauses and drains did happen mid-stream


def test_a_skipped_stream_runs_ahead_only_as_far_as_backpressure_lets_it_then_is_read_whole(cluster):
    producer = Producer.remote()
    handles = open_streams(producer, 3, 30)
    skipped = handles[0]
    listed = [handles[1:]]
    reader = ReportReader(lambda: listed[0])
    reader.run()
    try:
        got = receive_until(reader, handles, lambda g: streams_ended({h.name: g[h.name] for h in handles[1:]}))
        assert got[skipped.name] == []
        # the worker stops at its yield once AHEAD reports wait unread (the one it blocks on is made, not sent)
        assert ray.get(producer.sent_by.remote()).get(skipped.name, 0) <= AHEAD + 1
        listed[0] = handles
        got = receive_until(reader, [skipped], streams_ended)
        assert got[skipped.name] == [(skipped.name, i) for i in range(30)] + ["its stream ended"]
    finally:
        reader.pause()


def test_while_reports_keep_coming_the_reader_polls_instead_of_waiting_over_every_stream(cluster, monkeypatch):
    """The reader's work per report, counted: its `ray.wait` calls over every stream (each costs about
    80 + 1.5 N microseconds over N streams). The first design woke on every report with such a wait and
    took in rounds of more (at 32 streams, 285 waits over 9,129 streams for 640 reports; at 64 instances
    two thirds of the manager's CPU in `rlboost bench control-plane`). Polling by peeks while reports keep
    coming leaves waits to the idle moments: only a poll that found nothing ready waits. Counted, not
    timed: how often the producer stalls (start-up, a busy machine) sets how many polls come up empty,
    not whether the reader waits after one that took something."""
    waits = []
    wait = ray.wait

    def counting_wait(refs, *args, **kwargs):
        if threading.current_thread().name == "report-reader":
            waits.append(len(refs))
        return wait(refs, *args, **kwargs)

    monkeypatch.setattr(ray, "wait", counting_wait)
    producer = Producer.remote()
    handles = open_streams(producer, 32, 60, interval_s=0.002)
    reader = ReportReader(lambda: handles)
    reader.run()
    try:
        got = receive_until(reader, handles, streams_ended)
    finally:
        reader.pause()
    reports = sum(len(items) - 1 for items in got.values())
    assert reports == 60 * 32 and all(items[:-1] == [(h.name, i) for i in range(60)] for h, items in
                                      zip(handles, got.values()))
    counts = reader.counts
    assert counts.waits == len(waits)  # the reader's own count is every wait it made
    assert len(waits) <= counts.empty_polls < reports, (len(waits), counts, reports)
