"""The veRL baseline of the simulator: one colocated step (rollout on every engine of the node, then
training on every GPU), and whole runs of it for the calibration.

Contract: `colocated_step` composes `engine_rollout` (rlboost.sim.batching) and `TrainProfile`
(rlboost.sim.profile) into one veRL step; `colocated_run` averages it over steps of a workload. The
profile's defaults are fitted so that `colocated_run("qwen3-8b")` makes `CALIBRATION_TARGET`
tokens/s (`rlboost bench calibration` shows the fit). Pure: no clock, no torch, no Ray.
"""

from __future__ import annotations

from collections.abc import Sequence

from rlboost.sim.batching import engine_rollout
from rlboost.sim.profile import EngineProfile, ProfileConfig, TrainProfile, make_profiles
from rlboost.sim.specs import H100, GPUSpec
from rlboost.sim.workload import Workload, WorkloadConfig

CALIBRATION_TARGET = 10_000.0
"""veRL, Qwen3-8B, one 8xH100 node: generated tokens/s over whole steps (RLBoost artifact, ~1,300/GPU)."""


DISPATCHES = ("chunked", "round_robin")


def colocated_step(engine: EngineProfile, train: TrainProfile, lengths: Sequence[int], prompt_len: int,
                   engines: int, gpus: int, dispatch: str = "chunked") -> dict:
    """One veRL step on one node: rollout on `engines` engines, then training on the same `gpus` GPUs.

    `dispatch` says which samples each engine gets. "chunked" (veRL's synchronous SPMD rollout, what
    the RLBoost artifact's baseline runs): the batch, a prompt's samples next to each other, is cut
    into `engines` contiguous chunks, so one engine decodes every sample of its prompts (the last
    engine takes any remainder). "round_robin": sample i goes to engine i mod engines. Each engine
    decodes its share (`engine_rollout`); the rollout ends with the slowest engine. Training then covers every
    prompt and response token, with attention at the sequences' mean causal context. Returns
    rollout_s, train_s, step_s, tokens (generated), tokens_per_s (generated tokens per second of the
    whole step, all GPUs together) and preemptions (KV-full evictions, summed over the engines)."""
    if engines < 1 or gpus < 1:
        raise ValueError(f"colocated_step needs engines >= 1 and gpus >= 1, got {engines} and {gpus}")
    if not lengths:
        raise ValueError("colocated_step needs at least one response")
    if dispatch not in DISPATCHES:
        raise ValueError(f"colocated_step: dispatch={dispatch!r}; valid: {', '.join(DISPATCHES)}")
    lengths = list(lengths)
    if dispatch == "round_robin":
        shares = [lengths[e::engines] for e in range(engines)]
    else:
        size = len(lengths) // engines
        shares = [lengths[e * size:(e + 1) * size if e < engines - 1 else len(lengths)] for e in range(engines)]
    rollouts = [engine_rollout(engine, share, prompt_len) for share in shares if share]
    rollout_s = max(r.seconds for r in rollouts)
    preemptions = sum(r.preemptions for r in rollouts)
    train_s = train.sequences_s([prompt_len + length for length in lengths], gpus)
    tokens = sum(lengths)
    step_s = rollout_s + train_s
    return {"rollout_s": rollout_s, "train_s": train_s, "step_s": step_s, "tokens": tokens,
            "tokens_per_s": tokens / step_s, "preemptions": preemptions}


def colocated_run(model: str, workload: WorkloadConfig | None = None, cfg: ProfileConfig | None = None,
                  steps: int = 32, gpus: int = 8, gpu: GPUSpec = H100) -> dict:
    """veRL on one node of `gpus` GPUs for steps 0..steps-1 of a workload (default: the paper's; 32
    steps = one epoch of its 4096 prompts, so every prompt counts once).

    Returns the per-step means of rollout_s, train_s, step_s and preemptions, tokens_per_s (all
    generated tokens over all the time: the anchor's definition), tokens_per_gpu_s, and the engine
    layout (tp, engines)."""
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    engine, train = make_profiles(model, cfg, gpu)
    engines = gpus // engine.tp
    if engines < 1:
        raise ValueError(f"{model} needs tp={engine.tp} GPUs per engine, the node has {gpus}")
    work = Workload(workload if workload is not None else WorkloadConfig())
    totals = {"rollout_s": 0.0, "train_s": 0.0, "step_s": 0.0, "tokens": 0, "preemptions": 0}
    for s in range(steps):
        lengths = [length for group in work.step(s) for length in group]
        result = colocated_step(engine, train, lengths, work.cfg.prompt_len, engines, gpus)
        for key in totals:
            totals[key] += result[key]
    tokens_per_s = totals["tokens"] / totals["step_s"]
    return {"rollout_s": totals["rollout_s"] / steps, "train_s": totals["train_s"] / steps,
            "step_s": totals["step_s"] / steps, "preemptions": totals["preemptions"] / steps,
            "tokens_per_s": tokens_per_s, "tokens_per_gpu_s": tokens_per_s / gpus,
            "tp": engine.tp, "engines": engines}


__all__ = ["CALIBRATION_TARGET", "DISPATCHES", "colocated_run", "colocated_step"]
