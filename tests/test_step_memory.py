"""The between-step memory both rollout backends hold (rlboost.rollout.step_memory): a training step's
groups become the next epoch's HistoPipe lengths and HistoSpec history only when absorbed between steps,
an evaluation leaves both alone, and a checkpoint keeps both under the keys the backends always used."""

from __future__ import annotations

import json

from conftest import random_prompts
from rlboost.histospec.history import HistoryStore
from rlboost.policies.histopipe import HistoPipe, HistoPipeConfig
from rlboost.rollout.sample import Group, Sample
from rlboost.rollout.step_memory import StepMemory

PROMPTS = random_prompts([4, 5, 6], seed=5)


def groups(step: int, lengths: dict[int, int] | None = None) -> list[Group]:
    out = [Group(index=g, row_index=g, data_source="t", ground_truth=None, extra_info={},
                 samples=[Sample(uid=f"{step}:{g}:{j}", prompt_ids=list(p), seed=j) for j in range(2)])
           for g, p in enumerate(PROMPTS)]
    for g in out:
        for s in g.samples:
            s.response_ids = [7] * (lengths or {}).get(g.index, 0)
    return out


def memory() -> StepMemory:
    return StepMemory(HistoryStore(max_tokens=10_000), HistoPipe(HistoPipeConfig(enabled=True)))


def test_a_step_becomes_history_only_when_absorbed():
    m = memory()
    first = groups(1)
    order, overruns, expected = m.plan(first, 1)
    assert order == [s.uid for g in first for s in g.samples] and overruns({}) == []  # nothing known yet
    assert expected(first[2].samples[0].uid) is None
    m.remember(first)
    for g in first:  # the groups fill in after they were remembered (the hybrid backend remembers at start)
        for s in g.samples:
            s.response_ids = [7] * (3 + 10 * g.index)
    assert len(m.history) == 0 and len(m.histopipe.history) == 0
    assert m.absorb()
    assert m.responses(PROMPTS[2]) == [[7] * 23, [7] * 23]
    order, _, expected = m.plan(groups(2), 2)
    assert order[:2] == ["2:2:0", "2:2:1"]  # the longest last epoch goes first
    assert expected("2:2:0") == 23 and expected("2:0:1") == 3  # what a notice may leave running expects
    state = m.state_dict()
    assert m.absorb() and m.state_dict() == state  # nothing remembered since: nothing changes


def test_an_evaluation_changes_nothing_and_without_histopipe_there_is_no_plan():
    m = memory()
    m.remember(groups(1, {0: 5, 1: 6, 2: 7}))
    m.absorb()
    before = json.dumps(m.state_dict())
    m.plan(groups(2, {0: 50, 1: 60, 2: 70}), 2)  # an evaluation plans nothing and remembers nothing
    m.absorb()
    assert json.dumps(m.state_dict()) == before
    bare = StepMemory()
    assert bare.plan(groups(1), 1) == (None, None, None) and bare.responses is None
    bare.remember(groups(1, {0: 5}))
    assert not bare.absorb() and bare.state_dict() == {}


def test_a_checkpoint_keeps_both_under_the_backends_keys():
    m = memory()
    m.remember(groups(1, {0: 5, 1: 6, 2: 7}))
    m.absorb()
    state = json.loads(json.dumps(m.state_dict()))  # what a checkpoint holds
    assert set(state) == {"history", "histopipe"}
    restored = memory()
    assert restored.load_state_dict(state)
    assert restored.state_dict() == m.state_dict()
    assert not memory().load_state_dict({}) and not StepMemory().load_state_dict(state)
