"""HistoPipe wired into both rollout backends: the order samples are dispatched in comes from the
previous epoch's lengths, the lengths are recorded after a training step and checkpointed, and the
manager dispatches exactly the order it is given."""

from __future__ import annotations

import json

import pytest

from conftest import make_engine, random_prompts
from rlboost.cluster.config import WeightsConfig
from rlboost.engine import SamplingParams
from rlboost.histospec.history import prompt_key
from rlboost.hybrid.config import HybridConfig
from rlboost.hybrid.manager import RolloutManager
from rlboost.hybrid.step_run import StepPolicies, StepRun
from rlboost.policies.histopipe import HistoPipe, HistoPipeConfig
from rlboost.rollout.colocated import ColocatedRollout
from rlboost.rollout.sample import Group, Sample
from rlboost.rollout.scheduling import dispatch_order, overrun_check, record_lengths


def make_groups(step: int, prompts: list[list[int]], n: int = 2) -> list[Group]:
    return [Group(index=g, row_index=g, data_source="t", ground_truth=None, extra_info={},
                  samples=[Sample(uid=f"{step}:{g}:{j}", prompt_ids=list(p), seed=100 * g + j) for j in range(n)])
            for g, p in enumerate(prompts)]


def finish(groups: list[Group], lengths: dict[int, int]) -> None:
    for g in groups:
        for s in g.samples:
            s.response_ids = [5] * lengths[g.index]


PROMPTS = random_prompts([4, 5, 6, 7], seed=3)


def test_the_first_epoch_keeps_the_default_order_then_longest_groups_go_first():
    pipe = HistoPipe(HistoPipeConfig(enabled=True))
    first = make_groups(1, PROMPTS)
    assert dispatch_order(pipe, first, step=2) == [s.uid for g in first for s in g.samples]
    finish(first, {0: 3, 1: 30, 2: 10, 3: 20})
    record_lengths(pipe, first)

    again = make_groups(2, PROMPTS)  # the same prompts come back (next epoch)
    assert dispatch_order(pipe, again, step=2) == ["2:1:0", "2:1:1", "2:3:0", "2:3:1",
                                                   "2:2:0", "2:2:1", "2:0:0", "2:0:1"]
    assert dispatch_order(pipe, again, step=3)[:2] == ["2:1:0", "2:1:1"]  # every step (alternate is off)
    pipe.cfg.alternate = True
    assert dispatch_order(pipe, again, step=3)[:2] == ["2:0:0", "2:0:1"]


def test_overruns_are_named_by_uid_against_their_own_prompt():
    pipe = HistoPipe(HistoPipeConfig(enabled=True, overrun_factor=1.5, overrun_min_tokens=4))
    old = make_groups(1, PROMPTS[:2])
    finish(old, {0: 10, 1: 40})
    record_lengths(pipe, old)
    check = overrun_check(pipe, make_groups(2, PROMPTS[:2]))
    # 16 tokens is past 1.5 x 10 for prompt 0 but well within prompt 1's 40
    assert check({"2:0:0": 16, "2:0:1": 15, "2:1:0": 16}) == ["2:0:0"]


def test_colocated_rollout_admits_samples_in_histopipe_order_and_checkpoints_the_lengths():
    engine = make_engine("qwen2", max_num_seqs=2)
    pipe = HistoPipe(HistoPipeConfig(enabled=True))
    rollout = ColocatedRollout(engine, histopipe=pipe)
    params = SamplingParams(temperature=1.0, max_tokens=4)
    added = []
    real_add = engine.add
    engine.add = lambda rid, *a, **k: (added.append(rid), real_add(rid, *a, **k))[1]

    list(rollout.generate(make_groups(1, PROMPTS), params, version=0, training=True))
    assert added == [f"1:{g}:{j}" for g in range(4) for j in range(2)]  # no history yet
    rollout.publish(engine.model.state_dict(), version=2)
    assert len(pipe.history) == 4

    # every response had 4 tokens, so expected lengths tie; say prompt 0's were short last epoch
    pipe.history.record(prompt_key(PROMPTS[0]), [1])
    state = json.loads(json.dumps(rollout.state_dict()))  # what a checkpoint holds
    restored = HistoPipe(HistoPipeConfig(enabled=True))
    ColocatedRollout(engine, histopipe=restored).load_state_dict(state)
    assert restored.state_dict() == pipe.state_dict()

    added.clear()
    list(rollout.generate(make_groups(2, PROMPTS), params, version=2, training=True))
    assert added[-2:] == ["2:0:0", "2:0:1"]  # the prompt whose history is shortest goes last
    added.clear()
    list(rollout.generate(make_groups(3, PROMPTS), params, version=2, training=False))
    assert added == [f"3:{g}:{j}" for g in range(4) for j in range(2)]  # evaluation: default order


def test_the_manager_dispatches_the_given_order_and_rejects_a_partial_one():
    manager = RolloutManager(HybridConfig(), WeightsConfig())
    groups = make_groups(1, PROMPTS)
    order = ["1:3:1", "1:0:0", "1:2:0", "1:1:1", "1:3:0", "1:0:1", "1:2:1", "1:1:0"]

    def run_in(order):
        policies = StepPolicies(manager.dispatcher, manager.balancer, order=order)
        return StepRun(manager.table, manager.reader, manager.pulls, policies, manager.cfg, groups, SamplingParams(),
                       version=0, seed_window_s=None)

    assert list(run_in(order).state.pending) == order
    with pytest.raises(ValueError, match="every sample of the step exactly once"):
        run_in(order[:-1])
