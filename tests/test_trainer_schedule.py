"""The trainer's batch schedule (rlboost/trainer/schedule.py): where micro-batches and optimizer steps
fall as groups arrive, at world size 1 and dealt to N ranks. Pure: no torch, no model."""

from __future__ import annotations

import pytest

from rlboost.rollout.sample import Group, Sample
from rlboost.trainer.schedule import BatchSchedule, MicroBatch, OptimizerStep


def group(index: int, finished: bool = True) -> Group:
    sample = Sample(uid=f"{index}:0", prompt_ids=[1], finish_reason="stop" if finished else None)
    return Group(index=index, row_index=index, data_source="test", ground_truth=None, extra_info={},
                 samples=[sample])


def events_of(schedule: BatchSchedule, count: int) -> list:
    """What the schedule says for `count` arriving groups, as (kind, group indices per rank)."""
    out = []
    for i in range(count):
        for event in schedule.add(group(i)):
            if isinstance(event, MicroBatch):
                out.append(("pass", [None if gs is None else [g.index for g in gs] for gs in event.per_rank]))
            else:
                assert isinstance(event, OptimizerStep)
                out.append(("step", event.index))
        if schedule.done:
            break
    schedule.finish()
    return out


def test_world_one_runs_micro_batches_and_steps_at_mini_batch_boundaries():
    # 7 groups, micro-batches of 2, mini-batches of 5: the mini-batch's remainder and the step's last
    # (partial) mini-batch each run as one more micro-batch
    assert events_of(BatchSchedule(7, 2, 5), 7) == [
        ("pass", [[0, 1]]), ("pass", [[2, 3]]), ("pass", [[4]]), ("step", 0),
        ("pass", [[5, 6]]), ("step", 1)]


def test_mini_batch_zero_is_the_whole_step():
    assert events_of(BatchSchedule(3, 1, 0), 3) == [("pass", [[0]]), ("pass", [[1]]), ("pass", [[2]]), ("step", 0)]


def test_ranks_run_together_and_a_rank_with_nothing_left_runs_a_dummy_pass():
    # round-robin over 2 ranks, mini-batches of 3: the third group of a mini-batch runs alone on rank 0
    assert events_of(BatchSchedule(6, 1, 3, world_size=2), 6) == [
        ("pass", [[0], [1]]), ("pass", [[2], None]), ("step", 0),
        ("pass", [[3], [4]]), ("pass", [[5], None]), ("step", 1)]


def test_a_pass_waits_until_every_rank_has_a_micro_batch():
    # every group to rank 1 until the boundary: rank 0 runs dummies while rank 1 drains its queue
    schedule = BatchSchedule(4, 2, 0, world_size=2, deal=lambda i: 1)
    assert events_of(schedule, 4) == [("pass", [None, [0, 1]]), ("pass", [None, [2, 3]]), ("step", 0)]


def test_the_deal_restarts_with_each_mini_batch():
    seen = []
    schedule = BatchSchedule(4, 1, 2, world_size=2, deal=lambda i: seen.append(i) or i % 2)
    events_of(schedule, 4)
    assert seen == [0, 1, 0, 1]


def test_the_schedule_is_done_after_the_step_s_groups():
    schedule = BatchSchedule(2, 1, 0)
    schedule.add(group(0))
    assert not schedule.done
    schedule.add(group(1))
    assert schedule.done
    schedule.finish()


def test_a_short_stream_is_an_error_naming_both_counts():
    schedule = BatchSchedule(3, 1, 0)
    schedule.add(group(0))
    with pytest.raises(RuntimeError, match="delivered 1 groups, the step expected 3"):
        schedule.finish()


def test_an_unfinished_group_is_refused_naming_it():
    with pytest.raises(ValueError, match="group 4 reached the trainer with unfinished samples"):
        BatchSchedule(5, 1, 0).add(group(4, finished=False))


def test_a_deal_outside_the_world_is_refused():
    with pytest.raises(ValueError, match="dealt group 0 to rank 2 of 2"):
        BatchSchedule(2, 1, 0, world_size=2, deal=lambda i: 2).add(group(0))


def test_tis_needs_one_optimizer_step_per_step():
    with pytest.raises(ValueError, match="trainer.tis_cap needs one optimizer step per RL step"):
        BatchSchedule(4, 1, 2, tis_cap=2.0)
    BatchSchedule(4, 1, 0, tis_cap=2.0)
    BatchSchedule(4, 1, 4, tis_cap=2.0)


def test_the_run_counts_optimizer_steps_as_the_schedule_takes_them():
    from rlboost.trainer.schedule import optimizer_steps

    for groups, mini in [(8, 0), (8, 3), (8, 4), (1, 1), (5, 2)]:
        schedule = BatchSchedule(groups, 1, mini)
        steps = sum(isinstance(e, OptimizerStep) for i in range(groups) for e in schedule.add(group(i)))
        assert optimizer_steps(groups, mini) == steps
