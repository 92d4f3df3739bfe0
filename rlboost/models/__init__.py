"""Model loading: HF checkpoint folders, the bundled SmolLM2-135M-Instruct GGUF, tiny test models."""

from rlboost.models.config import ModelConfig
from rlboost.models.loading import LoadedModel, load_model
from rlboost.models.tiny import TINY_FAMILIES, tiny_model

__all__ = ["ModelConfig", "LoadedModel", "load_model", "tiny_model", "TINY_FAMILIES"]
