"""Model loading: HF checkpoint folders, the bundled SmolLM2-135M-Instruct GGUF, tiny test models.

Names are imported on first use (PEP 562): `ModelConfig` is torch-free, so a process that only
passes a model's config around (a rollout worker whose engine needs no model) never loads torch."""

from importlib import import_module

_WHERE = {"ModelConfig": "config", "LoadedModel": "loading", "load_model": "loading", "tiny_model": "tiny",
          "TINY_FAMILIES": "tiny"}

__all__ = sorted(_WHERE)


def __getattr__(name: str):
    if name not in _WHERE:
        raise AttributeError(f"module 'rlboost.models' has no attribute {name!r}")
    value = getattr(import_module(f"rlboost.models.{_WHERE[name]}"), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))
