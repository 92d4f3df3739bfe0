"""How much of an engine the next batch may take in a step's tail (bounded staleness with
`algorithm.start_ahead=tail`, docs/staleness.md, "The tail"). Pure: the runtime's step loop
(`rlboost.hybrid.step_succession`) and the simulator (`rlboost.sim.cluster`) call the same rule.

In a step's tail its last, longest samples run on a few engines; the next batch fills what they leave
free. The step's samples are the run's critical path, so the batch ahead may take only what they can
never need:
- sequences: the engine's `max_num_seqs` less the step's samples there;
- KV cache (where the engine's is bounded in tokens, as vLLM's blocks are): `KV_SHARE` of it, less
  each of the step's samples counted at its longest (prompt + the sampling's max_tokens: they are the
  step's longest and still growing), in samples of the batch ahead counted at what one is expected to
  reach (prompt + the mean response of the samples the step has finished).

Counted in sequences alone, the batch ahead filled the KV cache of engines whose cache binds before
their sequence limit (the simulator's 14B and 32B), and the engines evicted and recomputed samples,
the step's included: the tail then cost throughput instead of adding it (docs/staleness.md).
"""

from __future__ import annotations

import math

KV_SHARE = 0.95
"""Share of an engine's KV cache the two batches plan on together. The rest is headroom for the
estimate's error: the batch ahead's samples reach the mean response only on average, and the long
ones come late."""


def tail_contexts(prompt_tokens: float, ahead_prompt_tokens: float, max_tokens: int,
                  mean_response: float | None) -> tuple[float, float]:
    """(held_context, ahead_context) for `ahead_slots`: one of the step's samples at its longest (its
    prompt + `max_tokens`), one of the batch ahead's at what it is expected to reach (its prompt + the
    mean response of the samples the step has finished; `max_tokens` while none has)."""
    expected = max_tokens if mean_response is None else mean_response
    return prompt_tokens + max_tokens, ahead_prompt_tokens + expected


def ahead_slots(max_running: int, held: int, kv_tokens: int | None = None, held_context: float = 0.0,
                ahead_context: float = 0.0) -> int:
    """Samples a batch started ahead may hold on one engine in a step's tail.

    `max_running`: the engine's batch capacity (`max_num_seqs`); `held`: the step's samples there;
    `kv_tokens`: its KV cache in tokens (None: the sequence limit binds first, as on the CPU engine,
    whose cache grows per sequence up to max_model_len); `held_context`: tokens of context one of the
    step's samples may reach; `ahead_context`: tokens one of the batch ahead's is expected to reach."""
    if max_running < 0 or held < 0:
        raise ValueError(f"ahead_slots: max_running ({max_running}) and held ({held}) must be >= 0")
    free = max(0, max_running - held)
    if kv_tokens is None or free == 0:
        return free
    if held_context <= 0 or ahead_context <= 0:
        raise ValueError(f"ahead_slots: a bounded KV cache needs the samples' contexts, got held_context="
                         f"{held_context} and ahead_context={ahead_context}")
    room = KV_SHARE * kv_tokens - held * held_context
    return max(0, min(free, math.floor(room / ahead_context)))


__all__ = ["KV_SHARE", "ahead_slots", "tail_contexts"]
