"""`rlboost bench spec --backends`: the timed bench on a tiny model, rlboost's engine alone and beside
vLLM (HistoSpec's drafts verified by vLLM, and vLLM's own n-gram method), on the same histories."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rlboost.cli import main

REPO = Path(__file__).resolve().parents[1]

TINY = ["--model", "tiny:qwen3", "--prompts", "2", "--max-tokens", "8", "--batches", "1,2", "--temperatures", "0",
        "--history-samples", "2", "--batch1-requests", "1", "--train-steps", "0", "--drafters", "ngram"]


def bench(tmp_path, monkeypatch, *flags):
    monkeypatch.chdir(tmp_path)  # the bench's log goes to outputs/bench/ under the working directory
    monkeypatch.setenv("RLBOOST_CACHE", str(tmp_path / "cache"))
    path = tmp_path / "out.json"
    assert main(["bench", "spec", *TINY, *flags, "--json", str(path)]) == 0
    return json.loads(path.read_text())["results"]


def assert_verified_drafts_accepted(rows: list[dict]) -> None:
    """HistoSpec's rows, greedy with the history of the same weights. The first batch after the budget is
    made fresh always verifies (whole drafts, before any verify step is timed), so batch 1 must, and its
    drafts, the response itself, are accepted. Past it, whether a row verifies is the budget's call from
    step times a loaded machine moves, and a late draft need not be the response: a clean-clone run saw
    batch 2 verify once and accept none (not seen again in three reruns; the likely cause, not proven: a
    random tiny model's greedy choice between near-tied logits differing between batch sizes, so that
    the history parts from the response). There only losslessness (`identical`, above) is asked."""
    histospec = [r for r in rows if r["drafter"] == "ngram"]
    assert histospec
    for r in histospec:
        if r["batch"] == 1:
            assert r["spec_step_fraction"] > 0 and r["accepted_per_verify"] > 0, r


def test_rlboost_alone_keeps_its_rows(tmp_path, monkeypatch):
    rows = bench(tmp_path, monkeypatch)
    assert [(r["condition"], r["batch"], r["backend"], r["drafter"]) for r in rows] == [
        ("same_weights", 1, "rlboost", "ngram"), ("same_weights", 2, "rlboost", "ngram")]
    for r in rows:
        assert r["identical"] == 1.0 and r["speedup"] > 0, r
    assert_verified_drafts_accepted(rows)


def test_unknown_backend_or_unavailable_vllm_method_is_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["bench", "spec", *TINY, "--backends", "rlboost,sglang"]) == 2
    assert capsys.readouterr().out == "error: --backends: unknown ['sglang']; valid: rlboost, vllm\n"
    assert main(["bench", "spec", *TINY, "--backends", "vllm", "--vllm-methods", "eagle"]) == 2
    out = capsys.readouterr().out.splitlines()
    assert out in (["error: --vllm-methods: unknown 'eagle'; valid: ngram, suffix"],
                   ["error: --backends vllm needs vLLM installed (make test-vllm installs its CPU build in .venv-vllm)"])


@pytest.mark.vllm
def test_both_backends_side_by_side_with_vllms_own_ngram(tmp_path):
    # in a process of its own: vLLM 0.32's n-gram proposer imports numba, and once llvmlite is loaded
    # vLLM's kernel-override registry (run at every engine build on a CPU) fails on its objects, so no
    # vLLM engine could be built in this process after it (the bench builds its n-gram engine last)
    path = tmp_path / "out.json"
    argv = [sys.executable, "-m", "rlboost.cli", "bench", "spec", *TINY, "--backends", "rlboost,vllm",
            "--vllm-methods", "ngram", "--json", str(path)]
    env = os.environ | {"PYTHONPATH": str(REPO), "RLBOOST_CACHE": str(tmp_path / "cache")}
    done = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    rows = json.loads(path.read_text())["results"]
    assert [(r["batch"], r["backend"], r["drafter"]) for r in rows] == [
        (b, backend, drafter) for b in (1, 2)
        for backend, drafter in (("rlboost", "ngram"), ("vllm", "ngram"), ("vllm", "vllm:ngram"))]
    for r in rows:
        assert r["identical"] == 1.0 and r["speedup"] > 0, r  # greedy: every backend and method is lossless
    assert_verified_drafts_accepted(rows)  # HistoSpec's drafts, on rlboost's engine and verified by vLLM


def test_each_turn_draws_seeds_of_its_own_the_same_for_both_engines():
    """A turn repeating the last one's seeds would repeat its sample: on vLLM, whose speculating samples
    differ from the plain ones, a row would set one sample's lengths against another's every turn."""
    from rlboost.bench.spec import _timed
    from rlboost.engine import SamplingParams

    class SeedRecorder:  # an engine that only records the seeds it is given
        def __init__(self):
            self.seeds = []

        def add(self, request_id, prompt, params):
            self.seeds.append(params.seed)

        def has_unfinished(self):
            return False

    def seeds(turn):
        engine = SeedRecorder()
        _timed(engine, [[1, 2], [3, 4]], SamplingParams(temperature=0.6, seed=11), turn)
        return engine.seeds
    assert len(set(seeds(0))) == 2 and seeds(0) == seeds(0)  # a wave's requests differ; a turn repeats
    assert not set(seeds(0)) & set(seeds(1)) and not set(seeds(1)) & set(seeds(2))


def test_turns_alternate_wave_by_wave_and_a_row_is_over_all_of_them(tmp_path, monkeypatch, capsys):
    from rlboost.bench.spec import _turns
    calls = []

    def turn(name, seconds):
        return lambda index, wave: calls.append((name, index, wave)) or (seconds, [[len(calls)]])
    base, spec = _turns(3, 1, turn("plain", 2.0), turn("spec", 1.0))
    # side by side (a slow spell of the machine hits both), each pair on its own seeds (the turn's index),
    # counterbalanced: a drift of the machine's speed across a row falls on both sides alike
    assert calls == [("plain", 0, 0), ("spec", 0, 0), ("spec", 1, 0), ("plain", 1, 0), ("plain", 2, 0), ("spec", 2, 0)]
    assert base == (6.0, [[1], [4], [5]]) and spec == (3.0, [[2], [3], [6]])
    calls.clear()  # batch 1: the sides alternate request by request, within a turn as across turns
    _turns(2, 2, turn("plain", 2.0), turn("spec", 1.0))
    assert calls == [("plain", 0, 0), ("spec", 0, 0), ("spec", 0, 1), ("plain", 0, 1),
                     ("spec", 1, 0), ("plain", 1, 0), ("plain", 1, 1), ("spec", 1, 1)]
    drift = iter(range(1, 9))  # each call 1 s slower than the one before it: ABBA cancels it
    base, spec = _turns(2, 2, lambda i, w: (next(drift), [[0]]), lambda i, w: (next(drift), [[0]]))
    assert base[0] == spec[0] == 18
    monkeypatch.chdir(tmp_path)
    assert main(["bench", "spec", *TINY, "--turns", "0"]) == 2
    assert capsys.readouterr().out == "error: --turns must be >= 1, got 0\n"
    rows = bench(tmp_path, monkeypatch, "--turns", "2")
    assert len(rows) == 2 and all(r["identical"] == 1.0 for r in rows)
