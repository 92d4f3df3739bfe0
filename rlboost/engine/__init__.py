"""The rollout engine: continuous batching over a slot KV cache, streaming, exact abort/resume.

Files, nano-vllm style: sequence (request state and outputs), scheduler (what runs next),
kv_cache (slot cache), model_runner (forward pass), sampler + rng (tokens and log-probs), engine
(`LLMEngine`), protocol (the contract every backend implements, torch-free).

Names are imported on first use (PEP 562): the contract (`EngineBackend`, `SpecStats`, the errors) and
the request and output types (`SamplingParams`, `StreamChunk`, `PartialOutput`) are torch-free, so a
worker whose engine needs no torch (the emulated one) never loads it; `LLMEngine` does.
"""

from importlib import import_module

_WHERE = {
    "EngineConfig": "config",
    "LLMEngine": "engine",
    "EngineStateError": "protocol",
    "InvalidRequestError": "protocol",
    "SpecStats": "protocol",
    "EngineBackend": "protocol",
    "SamplingParams": "sampling_params",
    "StreamChunk": "sequence",
    "PartialOutput": "sequence",
    "Completion": "sequence",
}

__all__ = list(_WHERE)


def __getattr__(name: str):
    if name not in _WHERE:
        raise AttributeError(f"module 'rlboost.engine' has no attribute {name!r}")
    value = getattr(import_module(f"rlboost.engine.{_WHERE[name]}"), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))
