"""The request book on its own: chunking to stream_interval, flush, abort to an exact partial, progress
and the idle check, with no engine (every backend's bookkeeping is this one)."""

from __future__ import annotations

import subprocess
import sys
from types import SimpleNamespace

import pytest

from rlboost.engine.protocol import EngineStateError
from rlboost.engine.request_book import RequestBook
from rlboost.engine.sequence import Request


def book(interval: int = 3, *ids: str) -> RequestBook:
    b = RequestBook(SimpleNamespace(stream_interval=interval))
    for i, rid in enumerate(ids):
        b.add(Request(rid, [1, 2], seed=i))
    return b


def emit(b: RequestBook, rid: str, tokens: list[int], reason: str | None = None) -> None:
    b.append(rid, tokens, [-float(t) for t in tokens], reason)


def test_a_chunk_leaves_once_stream_interval_tokens_wait():
    b = book(3, "a")
    emit(b, "a", [10, 11])
    assert b.take_chunks(7) == []
    emit(b, "a", [12, 13, 14, 15, 16])
    chunks = b.take_chunks(7)
    assert [(c.token_ids, c.offset, c.finished) for c in chunks] == [([10, 11, 12], 0, False), ([13, 14, 15], 3, False)]
    assert chunks[0].logprobs == [-10.0, -11.0, -12.0] and {c.weight_version for c in chunks} == {7}
    assert b.progress() == {"a": 7}, "progress counts tokens not chunked yet too"


def test_a_finished_request_hands_out_the_rest_and_leaves():
    b = book(3, "a", "b")
    emit(b, "a", [10, 11, 12, 13], "stop")
    emit(b, "b", [20])
    chunks = b.take_chunks(0)
    assert [(c.request_id, c.token_ids, c.finished, c.finish_reason) for c in chunks] == [
        ("a", [10, 11, 12], False, None), ("a", [13], True, "stop")]
    assert "a" not in b and list(b.progress()) == ["b"]
    with pytest.raises(KeyError):
        emit(b, "a", [1])


def test_take_chunks_follows_the_order_given_and_skips_ids_not_held():
    b = book(1, "a", "b")
    emit(b, "a", [10])
    emit(b, "b", [20])
    assert [c.request_id for c in b.take_chunks(0, ["b", "gone", "a"])] == ["b", "a"]


def test_flush_hands_out_every_unfinished_requests_remainder():
    b = book(4, "a", "b", "c")
    emit(b, "a", [10, 11])
    emit(b, "b", [20, 21, 22, 23, 24])
    assert [c.token_ids for c in b.take_chunks(0)] == [[20, 21, 22, 23]]
    chunks = b.flush(1)
    assert [(c.request_id, c.token_ids, c.offset, c.finished) for c in chunks] == [
        ("a", [10, 11], 0, False), ("b", [24], 4, False)]
    assert b.flush(1) == [] and len(b) == 3


def test_the_interval_is_read_from_the_config_at_each_chunking():
    limits = SimpleNamespace(stream_interval=4)
    b = RequestBook(limits)
    b.add(Request("a", [1], seed=0))
    emit(b, "a", [10, 11])
    assert b.take_chunks(0) == []
    limits.stream_interval = 2
    assert [c.token_ids for c in b.take_chunks(0)] == [[10, 11]]


def test_abort_returns_exactly_what_was_generated_streamed_or_not():
    b = book(2, "a", "b")
    emit(b, "a", [10, 11, 12])
    b.take_chunks(0)
    partials = b.abort(["a", "a", "never-added"], 5)
    assert list(partials) == ["a"]
    p = partials["a"]
    assert (p.prompt_token_ids, p.token_ids, p.logprobs, p.seed, p.weight_version) == (
        [1, 2], [10, 11, 12], [-10.0, -11.0, -12.0], 0, 5)
    assert "a" not in b and list(b.progress()) == ["b"]
    p.token_ids.append(99)
    assert b.abort(["a"], 5) == {}, "an aborted request is gone; the partial is a copy"


def test_held_keeps_the_order_given_once_each():
    b = book(2, "a", "b", "c")
    assert [r.request_id for r in b.held(["c", "x", "a", "c"])] == ["c", "a"]


def test_the_idle_check_refuses_while_requests_are_held():
    b = book(2, "a")
    with pytest.raises(EngineStateError, match=r"sleep\(\) needs an idle engine but 1 requests"):
        b.require_idle("sleep")
    b.abort(["a"], 0)
    b.require_idle("sleep")


def test_mismatched_log_probs_and_double_entries_are_refused():
    b = book(2, "a")
    with pytest.raises(ValueError, match="2 tokens but 1 log-probs"):
        b.append("a", [1, 2], [-1.0])
    with pytest.raises(ValueError, match="already in the book"):
        b.add(Request("a", [1], seed=0))
    b = book(2, "a")
    emit(b, "a", [1], "stop")
    with pytest.raises(ValueError, match="already finished"):
        emit(b, "a", [2])


def test_the_book_loads_no_torch():
    code = "import rlboost.engine.request_book, sys; print('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                          text=True).stdout.strip() == "False"
