"""HistoPipe applied to a step's groups: the dispatch order, the overrun check, and the lengths kept
for the next epoch. Glue between the pure policy (`rlboost.policies.histopipe`) and both rollout
backends; a prompt is known by the hash of its token ids, as in HistoSpec's history."""

from __future__ import annotations

from collections.abc import Callable

from rlboost.histospec.history import prompt_key
from rlboost.policies.histopipe import HistoPipe, SampleInfo
from rlboost.rollout.sample import Group


def _keys(groups: list[Group]) -> dict[int, str]:
    """Group index -> its prompt's key, hashed once per group (its samples share the prompt)."""
    return {g.index: prompt_key(g.samples[0].prompt_ids) for g in groups}


def _uid_keys(groups: list[Group]) -> dict[str, str]:
    """Sample uid -> its prompt's key."""
    keys = _keys(groups)
    return {s.uid: keys[g.index] for g in groups for s in g.samples}


def dispatch_order(pipe: HistoPipe, groups: list[Group], step: int) -> list[str]:
    """Sample uids in the order to dispatch them this step (the given order in the first epoch)."""
    keys = _keys(groups)
    return pipe.order(step, [SampleInfo(s.uid, keys[g.index], g.index) for g in groups for s in g.samples])


def overrun_check(pipe: HistoPipe, groups: list[Group]) -> Callable[[dict[str, int]], list[str]]:
    """uid -> tokens so far  =>  the uids far past their prompt's history, most overrun first."""
    return overruns_of(pipe, _uid_keys(groups))


def length_expectation(pipe: HistoPipe, groups: list[Group]) -> Callable[[str], float | None]:
    """uid -> the response length its prompt's history expects (None: none), for a preemption notice."""
    return expected_of(pipe, _uid_keys(groups))


def overruns_of(pipe: HistoPipe, keys: dict[str, str]) -> Callable[[dict[str, int]], list[str]]:
    """`overrun_check` for samples known by their prompt's key (uid -> key): the StepState's `overruns`."""
    return lambda progress: pipe.flag_overruns({uid: (keys[uid], n) for uid, n in progress.items()})


def expected_of(pipe: HistoPipe, keys: dict[str, str]) -> Callable[[str], float | None]:
    """uid -> the response length its prompt's history expects (None: no history): the StepState's
    `expected`, for what a preemption notice may leave running."""
    return lambda uid: pipe.history.expected(keys[uid])


def record_lengths(pipe: HistoPipe, groups: list[Group]) -> None:
    """After a training step, off the critical path: these lengths are the next epoch's history."""
    pipe.observe_step({prompt_key(g.samples[0].prompt_ids): [len(s.response_ids) for s in g.samples]
                       for g in groups})
