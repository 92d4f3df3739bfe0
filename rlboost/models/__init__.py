"""Model loading: HF checkpoint folders, the bundled SmolLM2-135M-Instruct GGUF, tiny test models.

Names are imported on first use (PEP 562): `ModelConfig` is torch-free, so a process that only
passes a model's config around (a rollout worker whose engine needs no model) never loads torch."""

from rlboost._lazy import lazy_exports

_WHERE = {"ModelConfig": "config", "LoadedModel": "loading", "load_model": "loading", "tiny_model": "tiny",
          "TINY_FAMILIES": "tiny"}

__all__ = sorted(_WHERE)
__getattr__, __dir__ = lazy_exports(__name__, _WHERE, globals())
