"""How a rollout worker reports (rlboost.hybrid.worker.RolloutWorker.stream), in-process on a tiny
engine: a report leaves the moment a request has a full chunk and carries everyone's tokens, so its
requests stay in step and it reports about once per stream_interval decode steps however many run;
at no moment does a request hold more than stream_interval tokens the manager has not received
(invariant 4); finished requests' last chunks may wait for the next report, and nothing is lost."""

from __future__ import annotations

import pytest

from rlboost.engine import EngineConfig, SamplingParams
from rlboost.hybrid.worker import RolloutWorker, WorkerSpec
from rlboost.models import ModelConfig

INTERVAL = 4


def worker(report_delay_s: float) -> RolloutWorker:
    spec = WorkerSpec(ModelConfig(path="tiny:qwen2"), EngineConfig(device="cpu", max_num_seqs=16,
                      stream_interval=INTERVAL), eos_token_ids=[], heartbeat_interval_s=60.0,
                      report_delay_s=report_delay_s)
    w = RolloutWorker(spec)
    w.engine.load_weights({n: p.detach().clone() for n, p in w.engine.model.named_parameters()}, 0)
    return w


@pytest.mark.parametrize("report_delay_s", [0.0, 60.0])
def test_reports_keep_requests_in_step_and_never_leave_more_than_an_interval_unreceived(report_delay_s):
    w = worker(report_delay_s)
    received: dict[str, int] = {}
    worst = {"unreceived": 0, "steps": 0}
    step = w.engine.step

    def checked_step():
        chunks = step()
        worst["steps"] += 1
        for rid, generated in w.engine.progress().items():  # after every engine step, not just at reports
            worst["unreceived"] = max(worst["unreceived"], generated - received.get(rid, 0))
        return chunks

    w.engine.step = checked_step
    # requests of different lengths, added at different moments: their chunks fall out of phase
    lengths = {f"r{i}": 10 + 7 * i for i in range(8)}
    stream = w.stream()
    reports = []
    for i, (rid, n) in enumerate(lengths.items()):
        w.submit([(rid, [3 + i, 5, 7], SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True), 3)])
        if i % 3 == 2:
            reports.append(next(stream))
            for c in reports[-1].chunks:
                received[c.request_id] = c.offset + len(c.token_ids)
    finished: dict[str, str] = {}
    while len(finished) < len(lengths):
        report = next(stream)
        reports.append(report)
        for c in report.chunks:
            assert c.offset == received.get(c.request_id, 0), "a gap or a repeat in a request's chunks"
            received[c.request_id] = c.offset + len(c.token_ids)
            if c.finished:
                finished[c.request_id] = c.finish_reason
    assert received == lengths  # every token arrived, exactly once
    assert worst["unreceived"] <= INTERVAL
    assert sum(r.steps for r in reports) == worst["steps"]
    # in step: about one report per interval decode steps, not one per step
    assert len(reports) <= worst["steps"] / INTERVAL + len(lengths) + 3, (len(reports), worst["steps"])


@pytest.mark.parametrize("drafter", ["ngram", "suffix"])
def test_a_hybrid_worker_drafts_with_the_configured_drafter(drafter):
    """`rollout.histospec.drafter` reaches the hybrid workers (they built the n-gram drafter whatever it said)."""
    from rlboost.histospec.config import HistoSpecConfig
    from rlboost.histospec.drafter import Drafter
    from rlboost.histospec.suffix_drafter import SuffixDrafter

    spec = WorkerSpec(ModelConfig(path="tiny:qwen2"), EngineConfig(device="cpu"), eos_token_ids=[],
                      histospec=HistoSpecConfig(enabled=True, drafter=drafter))
    assert type(RolloutWorker(spec).engine.drafter) is {"ngram": Drafter, "suffix": SuffixDrafter}[drafter]


def test_a_reports_chunks_cross_the_wire_as_columns_and_come_back_the_same():
    # A report carries its chunks as columns (ChunkColumns): pickled and unpickled, as Ray moves it,
    # iterating it gives every chunk back, in order, with its tokens, log-probs, offset and finish.
    import pickle

    from rlboost.engine.sequence import ChunkColumns, StreamChunk

    w = worker(0.0)
    w.submit([(f"r{i}", [3 + i, 5, 7], SamplingParams(temperature=1.0, max_tokens=5 + 3 * i, ignore_eos=True, seed=i),
               3) for i in range(3)])
    stream, sent = w.stream(), []
    while not any(c.finished and c.request_id == "r2" for c in sent):
        report = next(stream)
        assert isinstance(report.chunks, ChunkColumns)
        got = pickle.loads(pickle.dumps(report))
        assert list(got.chunks) == list(report.chunks) and got.chunks.ends() == report.chunks.ends()
        sent += list(got.chunks)
    for i in range(3):
        mine = [c for c in sent if c.request_id == f"r{i}"]
        assert [c.offset for c in mine] == [sum(len(m.token_ids) for m in mine[:k]) for k in range(len(mine))]
        assert sum(len(c.token_ids) for c in mine) == 5 + 3 * i and mine[-1].finish_reason == "length"
        assert all(len(c.logprobs) == len(c.token_ids) and c.weight_version == 0 for c in mine)
    empty = ChunkColumns.of([])
    assert not empty and list(pickle.loads(pickle.dumps(empty))) == [] and empty.ends() == {}
    one = StreamChunk("x#1", [4, 5], [-0.5, -0.25], 6, True, "stop", 2)
    assert list(ChunkColumns.of([one])) == [one] and ChunkColumns.of([one]).ends() == {"x#1": 8}


def test_a_reports_objects_to_unpickle_do_not_grow_with_its_chunks():
    # The manager's guard, counted rather than timed: a report of 10 chunks and one of 100 unpickle into
    # the same number of objects (lists, dicts, calls); only the data (ids, tokens, log-probs) grows.
    # An object or a list per chunk was a third of the manager's loop at 256 instances.
    import pickle
    import pickletools

    from rlboost.engine.sequence import ChunkColumns, StreamChunk
    from rlboost.hybrid.wire import WorkerReport

    builders = {"EMPTY_LIST", "EMPTY_DICT", "EMPTY_TUPLE", "REDUCE", "NEWOBJ", "NEWOBJ_EX", "BUILD", "EMPTY_SET"}

    def objects(n: int) -> int:
        chunks = [StreamChunk(f"u{i}#1", [7] * 8, [-0.5] * 8, 16, i % 3 == 0, "stop" if i % 3 == 0 else None, 2)
                  for i in range(n)]
        report = WorkerReport(ChunkColumns.of(chunks), n, 0, {}, n, 0.01, 8)
        return sum(op.name in builders for op, _, _ in pickletools.genops(pickle.dumps(report, protocol=5)))

    assert objects(100) == objects(10) <= 16
