"""The rollout engine a config names: the one place that reads `engine.backend`.

Contract: `make_engine(model, engine, eos_token_ids, weights=CHECKPOINT, version=0, num_threads=None,
draft_tokens=0)`
builds an `rlboost.engine.protocol.EngineBackend` in this process:
- The engine holds its weights in `engine.dtype` (`auto`: `model.dtype`).
- `engine.backend=rlboost`: rlboost's `LLMEngine` on `model`'s architecture; `vllm`: `VllmEngine`
  (`rlboost.engine.vllm_backend`) on the model's HF folder (the bundled SmolLM2 and `tiny:*` models are
  written out as one first), its log lines routed to the run's log.
- `weights`: `CHECKPOINT`, what `model.path` holds; None, no trained weights yet (a rollout worker
  before its first pull: rlboost's engine gets the architecture only, vLLM the checkpoint, unserved);
  or a state dict (parameter name -> tensor) swapped in and checked as every `load_weights` is. In each
  case the engine says it serves `version` (`weight_version`).
- `draft_tokens`: the longest draft a `drafter` set on the engine may have verified per step
  (HistoSpec's `max_draft`; 0: no drafter will be set). vLLM fixes it when it starts, rlboost's engine
  takes any draft and ignores it.
- `num_threads`: CPU threads the engine computes with (a worker's share of its machine). None keeps
  this process's torch setting for rlboost's engine and gives vLLM one (`OMP_NUM_THREADS`, when set,
  wins there).
Imports neither torch nor vLLM until called: a worker process whose engine is another (the emulated
one) never loads them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Final, Literal

from rlboost.engine.config import EngineConfig
from rlboost.engine.protocol import EngineBackend
from rlboost.models.config import ModelConfig

CHECKPOINT: Final = "checkpoint"
"""`make_engine(weights=CHECKPOINT)`: serve the weights `model.path` holds."""


def engine_gpus(engine: EngineConfig) -> tuple[int, str]:
    """GPUs one engine of `engine.backend` spans, and the key that sets it: vLLM's tensor-parallel
    size, or 1 for rlboost's engine (a rollout worker owns exactly these, or none)."""
    if engine.backend == "vllm":
        return engine.vllm_tensor_parallel_size, "engine.vllm_tensor_parallel_size"
    return 1, "rlboost's engine"


def missing_backend(engine: EngineConfig) -> str | None:
    """What `engine.backend` needs that this Python lacks, as one line with the command that installs
    it; None when nothing is missing (rlboost's engine needs nothing more)."""
    import importlib.util

    if engine.backend == "vllm" and importlib.util.find_spec("vllm") is None:
        from rlboost.engine.vllm_backend import INSTALL_HINT

        return f"engine.backend=vllm needs vLLM, which is not installed here: {INSTALL_HINT}"
    return None


def make_engine(model: ModelConfig, engine: EngineConfig, eos_token_ids: Iterable[int] = (), *,
                weights: Mapping[str, object] | Literal["checkpoint"] | None = CHECKPOINT, version: int = 0,
                num_threads: int | None = None, draft_tokens: int = 0) -> EngineBackend:
    """See the module docstring."""
    engine.validate()
    model = dataclasses.replace(model, dtype=engine.serving_dtype(model.dtype))
    state = weights if isinstance(weights, Mapping) else None
    if engine.backend == "vllm":
        from rlboost.engine.vllm_backend import VllmEngine
        from rlboost.models.loading import model_folder

        built = VllmEngine(model_folder(model), engine, eos_token_ids, weight_version=version, dtype=model.dtype,
                           num_threads=1 if num_threads is None else num_threads, draft_tokens=draft_tokens)
    else:
        import torch

        from rlboost.engine.engine import LLMEngine
        from rlboost.models.loading import load_model, load_skeleton

        if num_threads is not None:
            torch.set_num_threads(num_threads)
        # the checkpoint is read only when served: other weights overwrite every parameter
        module = load_model(model).model if weights == CHECKPOINT else load_skeleton(model)
        built = LLMEngine(module, engine, eos_token_ids=eos_token_ids, weight_version=version)
    if state is not None:
        built.load_weights(state, version)
    return built


__all__ = ["CHECKPOINT", "engine_gpus", "make_engine"]
