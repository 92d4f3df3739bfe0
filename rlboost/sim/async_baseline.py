"""veRL's fully-async mode as a baseline of the simulator (`policy=verl-async`): the reserved GPUs split
into rollout engines and trainers, the rollout running up to `max_staleness` versions ahead of the
trainer, with partial rollout (a sample in flight at a weight update continues on the new weights).

The model, per batch i (one RL step's worth of samples, the workload's step i):
- The rollout may generate batch i once version i - k is published (k = `max_staleness`): the trainer
  has finished batch i - k - 1 and the weights reached the engines (`sync_s` later).
- k >= 1: partial rollout keeps the engines full across batches and the trainer takes the first
  samples to finish, whatever batch they were started in, so a sample's long tail straggles into a
  later batch instead of holding its own: the rollout is a stream at the engines' saturated rate,
  measured once on a long stream of the workload (`saturated_rate`), paused while the bound holds it
  back (the in-flight samples it would still finish then are not counted: a pessimistic edge).
- k = 0 is the synchronous split: each batch waits for the previous update and then for its own
  slowest sample, as one engine's continuous batching of its share
  (`rlboost.sim.batching.engine_rollout`, the slowest engine).
- The trainer takes batch i once it is generated and batch i - 1 is trained, and trains it on its GPUs
  (`TrainProfile.sequences_s`, as every policy of the simulator).
A step (`StepRecord`) is the trainer's: from the end of the previous update to the end of its own, so
steps tile the run and its throughput counts each token once. Pure: no clock, no torch, no Ray.
"""

from __future__ import annotations

from collections.abc import Sequence

from rlboost.sim.batching import engine_rollout
from rlboost.sim.profile import EngineProfile, TrainProfile
from rlboost.sim.records import StepRecord
from rlboost.sim.workload import Workload
from rlboost.spot.cost import CostMeter

RATE_STEPS = 4
"""Steps of the workload streamed through one engine to measure its saturated rate."""


def shares(lengths: Sequence[int], engines: int) -> list[list[int]]:
    """A batch dealt to the engines from one queue: sample i to engine i mod engines."""
    return [list(lengths[e::engines]) for e in range(engines)]


def saturated_rate(engine: EngineProfile, work: Workload, engines: int) -> float:
    """Decode tokens per second of one engine kept full: RATE_STEPS batches' share streamed through it,
    their long tail amortised over the stream (the tail of the last batch is all it pays)."""
    stream = [length for step in range(RATE_STEPS)
              for length in shares([x for group in work.step(step) for x in group], engines)[0]]
    return sum(stream) / engine_rollout(engine, stream, work.cfg.prompt_len).seconds


def async_steps(engine: EngineProfile, train: TrainProfile, work: Workload, meter: CostMeter, *,
                rollout_gpus: int, train_gpus: int, max_staleness: int, sync_s: float, duration_s: float,
                max_steps: int | None = None) -> list[StepRecord]:
    """The trainer's steps of a fully-async run (module docstring) until `duration_s` or `max_steps`."""
    engines = rollout_gpus // engine.tp
    if engines < 1 or train_gpus < 1:
        raise ValueError(f"verl-async needs a whole engine (tp={engine.tp}) and a trainer GPU; got "
                         f"{rollout_gpus} rollout and {train_gpus} training GPUs")
    prompt_len = work.cfg.prompt_len
    rate = saturated_rate(engine, work, engines) * engines
    generated = 0.0
    """When the rollout finished the last batch it generated."""
    trained: list[float] = []
    """When each batch's update is done (its weights then take sync_s to reach the engines)."""
    steps: list[StepRecord] = []

    def published(version: int) -> float:
        """When version `version` (trained on batches 0..version-1) reaches the engines."""
        return 0.0 if version <= 0 else trained[version - 1] + sync_s

    i = 0
    while (max_steps is None or i < max_steps) and (not trained or trained[-1] < duration_s):
        start = max(generated, published(i - max_staleness))
        lengths = [x for group in work.step(i) for x in group]
        if max_staleness:
            end = start + sum(lengths) / rate
        else:
            end = start + max(engine_rollout(engine, share, prompt_len).seconds
                              for share in shares(lengths, engines) if share)
        generated = end
        previous = trained[-1] if trained else 0.0
        train_s = train.sequences_s([prompt_len + x for x in lengths], train_gpus)
        trained.append(max(end, previous) + train_s)
        wall = trained[-1] - previous
        usd = meter.charge_step(wall, 0.0, sum(lengths))["cost/usd"]
        steps.append(StepRecord(
            step=i, start_s=previous, end_s=trained[-1], rollout_s=end - start, train_s=train_s, seed_s=0.0,
            reserved_rollout_s=end - start, tokens_generated=sum(lengths), tokens_trained=sum(lengths),
            instances_start=0, instances_end=0, preemptions=0, migrations=0, wasted_tokens=0,
            recomputed_tokens=0, wait_train_s=max(0.0, end - previous), wait_remote_s=0.0, usd=usd,
            rollout_window=(start, end)))
        i += 1
    return steps


__all__ = ["RATE_STEPS", "async_steps", "saturated_rate", "shares"]
