"""Colocated rollout: one engine on the reserved resources generates every sample of a step.

Requests are per sample (a group's `n` samples are independent requests), and a group is yielded
the moment its last sample finishes, so a consumer can score and train on groups in completion
order, exactly as it will when samples stream in from many workers.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Protocol

from rlboost.engine import SamplingParams
from rlboost.engine.protocol import EngineBackend, SpecStats
from rlboost.histospec import HistoryStore
from rlboost.histospec.metrics import spec_metrics
from rlboost.engine.rng import derive_seed
from rlboost.policies.histopipe import HistoPipe
from rlboost.rollout.sample import Group, RolloutProgress, Sample
from rlboost.rollout.step_memory import StepMemory


def sample_seed(run_seed: int, step: int, row_index: int, sample_index: int) -> int:
    """A sample's sampling seed: a pure function of where it sits in the run, so a resumed run (or a
    migrated sample) draws the same numbers."""
    return derive_seed(derive_seed(derive_seed(run_seed, step), row_index), sample_index)


def new_groups(step: int, prompts: Sequence[tuple[int, list[int], object]], n: int, run_seed: int) -> list[Group]:
    """Empty groups for `prompts` = [(row index, prompt ids, row)], `n` samples each."""
    groups = []
    for g, (row_index, prompt_ids, row) in enumerate(prompts):
        samples = [Sample(uid=f"{step}:{g}:{j}", prompt_ids=list(prompt_ids),
                          seed=sample_seed(run_seed, step, row_index, j)) for j in range(n)]
        groups.append(Group(index=g, row_index=row_index, data_source=row.data_source,
                            ground_truth=row.ground_truth, extra_info=dict(row.extra_info), samples=samples))
    return groups


@dataclasses.dataclass
class _Counts:
    done: int = 0
    tokens: int = 0


def run_colocated(engine: EngineBackend, groups: list[Group], params: SamplingParams,
                  order: list[str] | None = None, counts: _Counts | None = None) -> Iterator[Group]:
    """Generate every sample of `groups` on `engine`; yield each group as soon as it is complete.
    `order`: the sample uids in the order to admit them (HistoPipe's), when the batch exceeds the engine.
    `counts`: kept up to date with the samples finished and tokens generated (for the live view)."""
    counts = counts if counts is not None else _Counts()
    by_uid = {s.uid: s for g in groups for s in g.samples}
    group_of = {s.uid: g for g in groups for s in g.samples}
    remaining = {g.index: len(g.samples) for g in groups}
    for uid in order or by_uid:
        sample = by_uid[uid]
        engine.add(sample.uid, sample.prompt_ids, dataclasses.replace(params, seed=sample.seed))
    while engine.has_unfinished():
        for chunk in engine.step():
            sample = by_uid[chunk.request_id]
            if chunk.offset != len(sample.response_ids):
                raise RuntimeError(f"sample {sample.uid}: chunk at offset {chunk.offset} but "
                                   f"{len(sample.response_ids)} tokens received")
            sample.response_ids += chunk.token_ids
            sample.logprobs += chunk.logprobs
            sample.versions += [chunk.weight_version] * len(chunk.token_ids)
            counts.tokens += len(chunk.token_ids)
            if chunk.finished:
                counts.done += 1
                sample.finish_reason = chunk.finish_reason
                group = group_of[sample.uid]
                remaining[group.index] -= 1
                if remaining[group.index] == 0:
                    yield group



class RolloutBackend(Protocol):
    """Where a step's samples are generated (`rollout.mode`). The training loop depends on this only."""

    def generate(self, groups: list[Group], params: SamplingParams, version: int, training: bool,
                 next_batch: Callable[[], list[Group]] | None = None) -> Iterator[Group]:
        """Generate every sample of `groups` with weights `version`; yield each group once complete,
        when the trainer may consume it. `training` False: an evaluation pass. `next_batch`: the next
        step's groups, which a backend that runs ahead of the trainer asks for once this rollout is
        over (algorithm.max_staleness > 0: the hybrid backend; the others are never given one)."""

    def publish(self, weights, version: int) -> None:
        """Serve `weights` as `version` from now on (called between steps)."""

    def finish_step(self, train_s: float) -> dict[str, float]:
        """Close the last training step (the hybrid backend's offload loop learns from it) and return
        its metrics: `timing_s/gen` and `timing_s/update_actor` always, backend-specific ones besides
        (spot/*, migration/*, ...). `train_s`: the trainer's wall time from the return of `generate` to
        its last update (scoring excluded)."""

    def state_dict(self) -> dict:
        """What a checkpoint must keep for the run to resume exactly (e.g. HistoSpec's history)."""

    def load_state_dict(self, state: dict) -> None:
        """Restore `state_dict()`'s output; {} (a fresh start or an older checkpoint) changes nothing."""

    def live(self) -> RolloutProgress | None:
        """What the step's rollout is doing now (called from another thread, so it reads counters
        only); None: no rollout under way."""

    def close(self) -> None:
        """Release workers and processes."""


class ColocatedRollout:
    """Rollout backend of `rollout.mode=colocated`: the reserved engine generates the whole step, then
    sleeps so the same device can train (the veRL baseline). With a history store (HistoSpec), each
    training step's responses become the drafting history of their prompts from the next step on."""

    def __init__(self, engine: EngineBackend, history: HistoryStore | None = None, histopipe: HistoPipe | None = None):
        self.engine = engine
        self.memory = StepMemory(history, histopipe)
        """HistoPipe's lengths and HistoSpec's history, from one training step to the next."""
        self._live: tuple[int, float, _Counts] | None = None
        """(samples, start, counts) of the generation under way."""
        self._gen_s = 0.0
        """How long the last `generate` took."""

    def generate(self, groups: list[Group], params: SamplingParams, version: int, training: bool,
                 next_batch: Callable[[], list[Group]] | None = None) -> Iterator[Group]:
        """Every group of the step, in completion order; all generated before the first is handed out.
        Never runs ahead of the trainer (it shares its device): `next_batch` must be None."""
        if next_batch is not None:
            raise ValueError("colocated rollout never runs ahead of the trainer (algorithm.max_staleness needs hybrid)")
        if self.engine.weight_version != version:
            raise RuntimeError(f"the engine serves weight version {self.engine.weight_version}, not {version}")
        order = self.memory.plan(groups, version)[0] if training else None
        t0 = time.monotonic()
        self.engine.wake()
        counts = _Counts()
        self._live = (sum(len(g.samples) for g in groups), t0, counts)
        try:
            done = list(run_colocated(self.engine, groups, params, order, counts))
        finally:
            self._live = None
        self.engine.sleep()
        self._gen_s = time.monotonic() - t0
        if training:
            self.memory.remember(done)
        return iter(done)

    def publish(self, weights, version: int) -> None:
        self.engine.load_weights(weights, version)
        if self.memory.absorb():  # between steps: off the rollout's critical path
            self.engine.drafter.invalidate()

    def finish_step(self, train_s: float) -> dict[str, float]:
        stats, self.engine.spec_stats = self.engine.spec_stats, SpecStats()
        metrics = {"timing_s/gen": self._gen_s, "timing_s/update_actor": train_s}
        history = self.memory.history
        return metrics | (spec_metrics(stats, len(history)) if history is not None else {})

    def state_dict(self) -> dict:
        return self.memory.state_dict()

    def load_state_dict(self, state: dict) -> None:
        if self.memory.load_state_dict(state):
            self.engine.drafter.invalidate()

    def live(self) -> RolloutProgress | None:
        live = self._live
        if live is None:
            return None
        samples, start, counts = live
        return RolloutProgress("generating", counts.done, samples, counts.tokens, time.monotonic() - start)

    def close(self) -> None:
        pass
