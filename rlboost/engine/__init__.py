"""The rollout engine: continuous batching over a slot KV cache, streaming, exact abort/resume.

Files, nano-vllm style: sequence (request state and outputs), scheduler (what runs next), kv_cache (slot
cache), model_runner (forward pass), sampler + rng (tokens and log-probs), draft_tree (speculative drafts
as trees and how they are accepted, torch-free), engine (`LLMEngine`), protocol (the contract every
backend implements, torch-free), request_book (every backend's per-request bookkeeping, torch-free),
vllm_backend (`VllmEngine`), factory (`make_engine`: the engine `engine.backend` names).

Names are imported on first use (PEP 562): the contract (`EngineBackend`, `SpecStats`, the errors) and
the request and output types (`SamplingParams`, `StreamChunk`, `ChunkColumns`, `PartialOutput`) are
torch-free, so a worker whose engine needs no torch (the emulated one) never loads it; `LLMEngine` does.
"""

from rlboost._lazy import lazy_exports

_WHERE = {
    "EngineConfig": "config",
    "LLMEngine": "engine",
    "EngineStateError": "protocol",
    "InvalidRequestError": "protocol",
    "SpecStats": "protocol",
    "DraftTree": "draft_tree",
    "EngineBackend": "protocol",
    "SamplingParams": "sampling_params",
    "StreamChunk": "sequence",
    "ChunkColumns": "sequence",
    "PartialOutput": "sequence",
    "Completion": "sequence",
    "make_engine": "factory",
}

__all__ = sorted(_WHERE)
__getattr__, __dir__ = lazy_exports(__name__, _WHERE, globals())
