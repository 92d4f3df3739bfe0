"""GRPO training of an HF causal LM on streamed groups of rollout samples.

Names are imported on first use (PEP 562): `TrainerConfig` is torch-free, so `rlboost.config` (and
with it `rlboost simulate` and `rlboost report`) never loads torch; `Trainer` loads it when used."""

from rlboost._lazy import lazy_exports

_WHERE = {"Trainer": "trainer", "TrainerConfig": "config", "LOSS_AGG_MODES": "config"}

__all__ = sorted(_WHERE)
__getattr__, __dir__ = lazy_exports(__name__, _WHERE, globals())
