"""GRPO training of an HF causal LM on streamed groups of rollout samples.

Layout: `schedule` (pure: where a step's micro-batches and optimizer steps fall), `trainer` (the
in-process trainer), `ranks` and `sharding` (N ranks on Ray, FSDP2 on each), `protocol` (what the
loop and the checkpoints ask of either), `stats`, `state` (checkpoint files), `config`.

Names are imported on first use (PEP 562): `TrainerConfig` is torch-free, so `rlboost.config` (and
with it `rlboost simulate` and `rlboost report`) never loads torch; `Trainer` loads it when used."""

from rlboost._lazy import lazy_exports

_WHERE = {"Trainer": "trainer", "TrainerConfig": "config", "LOSS_AGG_MODES": "config",
          "PolicyTrainer": "protocol", "BatchSchedule": "schedule", "TrainStepStats": "stats"}

__all__ = sorted(_WHERE)
__getattr__, __dir__ = lazy_exports(__name__, _WHERE, globals())
