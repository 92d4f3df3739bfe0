"""Sibling progress across instances, the pure decisions (`rlboost.histospec.sibling_share`): which
siblings' new tokens go to which worker, under the per-step budget. No Ray, no clock."""

from __future__ import annotations

import pytest

from rlboost.histospec.sibling_share import Forward, Sibling, SiblingShare, fair_shares


def test_fair_shares_are_max_min_fair_and_spend_exactly_the_budget():
    assert fair_shares([10, 10, 10], 5) == [1, 2, 2]
    assert fair_shares([1, 10, 10], 9) == [1, 4, 4]  # the small need takes what it needs, the rest share
    assert fair_shares([3, 5], 100) == [3, 5]
    assert fair_shares([3, 5], 0) == [0, 0]
    assert sum(fair_shares([7, 2, 9, 4], 13)) == 13


def group(a=4, b=6, c=10, a_at="w1", a_req="a#1"):
    return {0: [Sibling("a", a_at, a_req, a), Sibling("b", "w2", "b#1", b), Sibling("c", None, None, c)]}


def test_each_worker_gets_the_new_tokens_of_the_siblings_it_does_not_run():
    share = SiblingShare(1000)
    plan, deferred = share.plan(group())
    assert deferred == set()
    # the finished sibling c goes to both; each running one to the other's worker
    assert plan == {"w1": [Forward("a#1", "b", "b", 0, 6), Forward("a#1", "c", "c", 0, 10)],
                    "w2": [Forward("b#1", "a", "a", 0, 4), Forward("b#1", "c", "c", 0, 10)]}
    plan, _ = share.plan(group(a=9))  # only what is new since
    assert plan == {"w2": [Forward("b#1", "a", "a", 4, 9)]}
    assert share.plan(group(a=9))[0] == {}
    assert share.sent == {"w1": 16, "w2": 19}


def test_the_budget_caps_each_worker_per_step_shared_fairly():
    share = SiblingShare(8)
    plan, _ = share.plan(group())
    assert plan["w1"] == [Forward("a#1", "b", "b", 0, 4), Forward("a#1", "c", "c", 0, 4)]
    assert [(f.uid, f.end - f.start) for f in plan["w2"]] == [("a", 4), ("c", 4)]
    assert share.plan(group(a=20, b=20, c=30))[0] == {}  # spent: nothing more this step
    assert share.sent == {"w1": 8, "w2": 8} and share.left("w1") == 0
    assert SiblingShare(0).plan(group())[0] == {}  # 0: off
    with pytest.raises(ValueError, match="tokens_per_step"):
        SiblingShare(-1)


def test_only_acknowledged_requests_receive_and_busy_workers_wait():
    share = SiblingShare(1000)
    # w1's submission is not acknowledged yet (its drafter may not know the request); w2 has a call in flight
    plan, deferred = share.plan(group(a_req=None), busy={"w2"})
    assert plan == {} and deferred == {0}  # group 0 is planned again once w2 answered
    plan, deferred = share.plan(group())
    assert set(plan) == {"w1", "w2"} and deferred == set()


def test_tokens_generated_on_a_worker_are_not_sent_back_to_it():
    share = SiblingShare(1000)
    share.plan(group(a=4))
    # a moves from w1 to w2 (its 4 tokens go with it); w1 keeps a receiver of the group (d)
    moved = {0: [Sibling("a", "w2", "a#2", 6), Sibling("b", "w2", "b#1", 6), Sibling("c", None, None, 10),
                 Sibling("d", "w1", "d#1", 0)]}
    plan, _ = share.plan(moved)
    # w1 made a's first 4 tokens itself: only the 2 made on w2 since; w2 now makes a itself
    assert plan == {"w1": [Forward("d#1", "a", "a", 4, 6)]}


def test_a_worker_that_dropped_the_group_gets_everything_again_and_a_restart_gets_a_new_key():
    share = SiblingShare(1000)
    share.plan(group())
    # w1's last request of the group finished: its drafter dropped the group
    gone = {0: [Sibling("a", None, None, 4), Sibling("b", "w2", "b#1", 6), Sibling("c", None, None, 10)]}
    assert share.plan(gone)[0] == {}
    back = {0: gone[0] + [Sibling("e", "w1", "e#1", 0)]}
    plan, _ = share.plan(back)
    assert [(f.uid, f.start, f.end) for f in plan["w1"]] == [("a", 0, 4), ("b", 0, 6), ("c", 0, 10)]
    # b's tokens were thrown away (migration=recompute): from its start again, under a new key
    restarted = {0: [Sibling("a", None, None, 4), Sibling("b", "w2", "b#2", 2), Sibling("c", None, None, 10),
                     Sibling("e", "w1", "e#1", 0)]}
    plan, _ = share.plan(restarted)
    assert plan == {"w1": [Forward("e#1", "b~1", "b", 0, 2)]}
