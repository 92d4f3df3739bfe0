"""The rollout engine: continuous batching over a slot KV cache, streaming, exact abort/resume.

Files, nano-vllm style: sequence (request state and outputs), scheduler (what runs next),
kv_cache (slot cache), model_runner (forward pass), sampler + rng (tokens and log-probs), engine
(the public contract).
"""

from rlboost.engine.config import EngineConfig
from rlboost.engine.engine import EngineStateError, InvalidRequestError, LLMEngine
from rlboost.engine.sampling_params import SamplingParams
from rlboost.engine.sequence import Completion, PartialOutput, StreamChunk

__all__ = ["EngineConfig", "LLMEngine", "SamplingParams", "StreamChunk", "PartialOutput", "Completion",
           "InvalidRequestError", "EngineStateError"]
