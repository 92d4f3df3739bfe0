"""The replay harness and its recordings (`rlboost.histospec.replay`, `.recording`): counts checked by
hand on small synthetic histories. Pure and deterministic."""

from __future__ import annotations

import json

import pytest

from rlboost.histospec import DraftConfig
from rlboost.histospec.recording import GroupRecorder, RecordedGroup, read_recording
from rlboost.histospec.replay import FORWARDED, VARIANTS, replay

PROMPT = (90, 91, 92)
RESPONSE = (10, 11, 12, 13, 14, 15, 16, 17)


def rows_by(rows, **where):
    return {(r["epoch"], r["drafter"]): r for r in rows if all(r[k] == v for k, v in where.items())}


def test_the_next_epoch_is_drafted_from_the_previous_one():
    rows = rows_by(replay([RecordedGroup("", 0, PROMPT, (RESPONSE,)), RecordedGroup("", 1, PROMPT, (RESPONSE,))]))
    for name in VARIANTS:  # epoch 0: no history, and the response never repeats itself
        assert rows[0, name]["steps"] == rows[0, name]["plain_steps"] == 7 and rows[0, name]["drafted"] == 0
    # ngram: first token from the prefill; a draft of 4 (all accepted) + its bonus token; then 1 of the
    # 2 tokens left (the other is the verify step's own) -> 2 steps instead of 7
    assert {k: rows[1, "ngram"][k] for k in ("steps", "verifications", "drafted", "accepted")} == dict(
        steps=2, verifications=2, drafted=5, accepted=5)
    assert rows[1, "ngram"]["accepted_per_verify"] == 2.5 and rows[1, "ngram"]["steps_saved"] == pytest.approx(5 / 7)
    # suffix from the history: a 4-token match (the prompt's 3 + 1) drafts 4, then the last token but one
    for name in ("suffix:history", "suffix"):
        assert (rows[1, name]["steps"], rows[1, name]["drafted"], rows[1, name]["accepted"]) == (2, 5, 5)
    for name in ("suffix:own", "suffix:siblings"):
        assert rows[1, name]["drafted"] == 0


def test_a_sibling_drafts_what_another_already_wrote_at_another_offset():
    a = (40, 41, 42, 43, 44, 45)
    b = (60, 61, 62, 63, 40, 41, 42, 43, 44, 45)
    rows = rows_by(replay([RecordedGroup("", 0, PROMPT, (a, b))], ["suffix:siblings", "suffix:own"],
                          DraftConfig(min_order=2)))
    # lockstep rounds: a is done after 5 steps; b reaches (40, 41) in round 6, a match of 2 tokens
    # drafts a's next 2 (42, 43), both accepted with the bonus 44, and 45 is its last step
    row = rows[0, "suffix:siblings"]
    assert (row["plain_steps"], row["steps"], row["verifications"], row["drafted"], row["accepted"]) == (14, 12, 1, 2, 2)
    assert row["steps_saved"] == pytest.approx(1 / 7) and row["accepted_per_verify"] == 2.0
    assert rows[0, "suffix:own"]["drafted"] == 0  # neither response repeats itself


def test_own_context_drafts_a_repetition():
    response = (5, 6, 7, 8, 5, 6, 7, 8, 9)
    row = rows_by(replay([RecordedGroup("", 0, PROMPT, (response,))], ["suffix:own"], DraftConfig(min_order=1)))[0, "suffix:own"]
    # steps at 1..4 find nothing earlier; at 5 (..., 8, 5) only (5,) recurs: 1 token (6), accepted with
    # the bonus 7; at 7 (5, 6, 7) recurs: 3 tokens (8, 5, 6) cut to the 1 the response has before its last
    assert (row["steps"], row["plain_steps"], row["verifications"], row["drafted"], row["accepted"]) == (6, 8, 2, 2, 2)


def test_epochs_count_a_prompts_appearances_and_runs_are_separate():
    other = (80, 81)
    groups = [RecordedGroup("T=1", 5, PROMPT, (RESPONSE,)), RecordedGroup("T=1", 2, PROMPT, (RESPONSE,)),
              RecordedGroup("T=1", 5, other, ((1, 2, 3),)), RecordedGroup("T=0.6", 9, PROMPT, (RESPONSE,))]
    rows = replay(groups, ["ngram"])
    assert [(r["run"], r["epoch"], r["responses"]) for r in rows] == [("T=1", 0, 2), ("T=1", 1, 1), ("T=0.6", 0, 1)]
    assert rows[1]["accepted"] == 5 and rows[2]["drafted"] == 0  # step 2 wrote the history of step 5


def test_recording_round_trip_and_bad_lines_are_named(tmp_path):
    path = tmp_path / "histories.jsonl"
    recorder = GroupRecorder(path, run="T=0.6")
    recorder.record(1, [([1, 2], [[3, 4], [5]]), ([7], [[]])])
    recorder.record(2, [([1, 2], [[3]])])
    assert read_recording(path) == [RecordedGroup("T=0.6", 1, (1, 2), ((3, 4), (5,))),
                                    RecordedGroup("T=0.6", 1, (7,), ((),)),
                                    RecordedGroup("T=0.6", 2, (1, 2), ((3,),))]
    assert json.loads(path.read_text().splitlines()[0]) == {"run": "T=0.6", "step": 1, "prompt": [1, 2],
                                                             "responses": [[3, 4], [5]]}
    for line, message in [("{", "not JSON"), ('{"step": 1, "prompt": [1], "responses": [], "x": 1}', "unknown keys"),
                          ('{"step": -1, "prompt": [1], "responses": []}', "`step`"),
                          ('{"step": 0, "prompt": [], "responses": []}', "`prompt` is empty"),
                          ('{"step": 0, "prompt": [1], "responses": [[1, "a"]]}', r"`responses\[0\]` must be a list")]:
        bad = tmp_path / "bad.jsonl"
        bad.write_text(path.read_text() + line + "\n")
        with pytest.raises(ValueError, match=rf"bad.jsonl:4: {message}"):
            read_recording(bad)
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(ValueError, match="no groups"):
        read_recording(tmp_path / "empty.jsonl")


def counts(row):
    return row["plain_steps"], row["steps"], row["verifications"], row["drafted"], row["accepted"]


def test_siblings_on_other_instances_draft_only_when_forwarded_within_the_budget():
    a = (40, 41, 42, 43, 44, 45)
    b = (60, 61, 62, 63, 40, 41, 42, 43, 44, 45)
    groups, cfg = [RecordedGroup("", 0, PROMPT, (a, b))], DraftConfig(min_order=2)
    one_engine = rows_by(replay(groups, ["suffix:siblings"], cfg))[0, "suffix:siblings"]
    assert counts(one_engine) == (14, 12, 1, 2, 2)  # as in the test above: b drafts a's 42 43
    split = rows_by(replay(groups, None, cfg, instances=2))
    assert {d for _, d in split} == set(VARIANTS + FORWARDED)  # the forwarded variants come with instances
    # a on one instance, b on the other: b's instance never sees a unless the manager forwards it
    assert counts(split[0, "suffix:siblings"]) == (14, 14, 0, 0, 0)
    assert counts(split[0, "suffix:siblings+forwarded"]) == counts(one_engine)  # a had finished and reported
    # a budget of 1 token per instance forwards a's first token only: nothing to match (40, 41) on
    starved = rows_by(replay(groups, ["suffix:siblings+forwarded"], cfg, instances=2, sibling_tokens_per_step=1))
    assert counts(starved[0, "suffix:siblings+forwarded"]) == (14, 14, 0, 0, 0)


def test_a_forwarded_sibling_is_seen_a_report_late():
    a = tuple(range(10, 30))
    b = (99,) + a[:-1]  # b writes what a wrote, a token later: a running a is ahead of it
    groups, cfg = [RecordedGroup("", 0, PROMPT, (a, b))], DraftConfig(min_order=1)
    name = "suffix:siblings+forwarded"
    per_token = rows_by(replay(groups, [name], cfg, instances=2, stream_interval=1))[0, name]
    at_the_end = rows_by(replay(groups, [name], cfg, instances=2, stream_interval=1000))[0, name]
    # reported every token, a's lead reaches b a round later: one draft token, accepted; reported only
    # when a finishes (as b does), never in time
    assert counts(per_token) == (38, 37, 1, 1, 1)
    assert counts(at_the_end) == (38, 38, 0, 0, 0)
    with pytest.raises(ValueError, match="instances"):
        replay(groups, [name], cfg, instances=0)


def test_a_draft_tree_accepts_the_branch_a_path_would_have_missed():
    """Epoch 0 went 10 11 12 ... twice and 10 11 20 ... once; epoch 1 takes the rarer branch. The path
    drafter drafts the likelier branch (11 12 13 14: 11 accepted, then 20 drawn) and needs a second
    verify step; the tree holds both branches (7 nodes: 11, 12 and 20 under it, ...) and its one
    verify step accepts 11 20 21 22, its bonus token the last: 1 step instead of 5."""
    a, b = (10, 11, 12, 13, 14, 15), (10, 11, 20, 21, 22, 23)
    rows = rows_by(replay([RecordedGroup("", 0, PROMPT, (a, a, b)), RecordedGroup("", 1, PROMPT, (b,))],
                          ["suffix", "suffix_tree"]))
    assert {k: rows[1, "suffix"][k] for k in ("steps", "verifications", "accepted")} == dict(
        steps=2, verifications=2, accepted=3)
    assert {k: rows[1, "suffix_tree"][k] for k in ("steps", "verifications", "drafted", "accepted")} == dict(
        steps=1, verifications=1, drafted=7, accepted=4)


# ---- a replay's acceptance projected through a verify curve ---------------------------------------------

def test_the_projection_prices_the_widest_draft_of_a_batch_and_the_tokens_each_step_advances():
    from rlboost.histospec.projection import projected_speedup, step_cost
    from rlboost.policies.verify_curve import VerifyCurve

    flat = VerifyCurve.from_rows([{"batch": 1, "positions": [1, 9], "relative": [1.0, 1.0]}])  # verifying is free
    steep = VerifyCurve.from_rows([{"batch": 1, "positions": [1, 9], "relative": [1.0, 5.0]}])  # 0.5 a position
    half = {0: 5, 4: 5}  # half the rounds draft 4 tokens, half none
    assert step_cost(half, 1, flat) == 1.0
    assert step_cost(half, 1, steep) == pytest.approx(0.5 * 1.0 + 0.5 * 3.0)  # n = 5: 1 + 0.5 x 4
    assert step_cost(half, 2, steep) == pytest.approx(0.25 * 1.0 + 0.75 * 3.0)  # one of two drafts is enough
    assert step_cost({}, 8, steep) == 1.0
    # 10 rounds, 6 accepted tokens: 1.6 tokens a step; free verification makes that the speed-up
    row = {"steps": 10, "accepted": 6, "draft_sizes": half}
    assert projected_speedup(row, 1, flat) == pytest.approx(1.6)
    assert projected_speedup(row, 1, steep) == pytest.approx(1.6 / 2.0)
    assert projected_speedup({"steps": 0, "accepted": 0, "draft_sizes": {}}, 1, steep) == 1.0


def test_a_replay_counts_every_round_by_its_draft_size():
    groups = [RecordedGroup("r", 1, (1, 2, 3), [[4, 5, 6, 7, 8]] * 2), RecordedGroup("r", 2, (1, 2, 3), [[4, 5, 6, 7, 8]] * 2)]
    for row in replay(groups, variants=["ngram", "suffix"]):
        assert sum(row["draft_sizes"].values()) == row["steps"]
        assert sum(size * n for size, n in row["draft_sizes"].items()) == row["drafted"]
