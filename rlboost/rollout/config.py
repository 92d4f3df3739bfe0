"""How responses are sampled, and where rollout runs."""

from __future__ import annotations

from dataclasses import dataclass, field

from rlboost.histospec.config import HistoSpecConfig
from rlboost.hybrid.config import HybridConfig
from rlboost.policies.histopipe import HistoPipeConfig

ROLLOUT_MODES = ("colocated", "hybrid")


@dataclass
class RolloutConfig:
    mode: str = "colocated"
    """`colocated`: rollout and training take turns on the reserved resources (the veRL baseline).
    `hybrid`: rollout runs on reserved and preemptible workers (Ray actors) with a seeding window,
    migration and load balancing, and the trainer consumes groups as they finish (`rollout.hybrid`)."""
    n: int = 4
    """Responses per prompt, i.e. the GRPO group size (veRL: rollout.n)."""
    temperature: float = 1.0
    """Sampling temperature; the trainer computes log-probs at the same temperature."""
    top_p: float = 1.0
    """Nucleus sampling threshold (1 disables it)."""
    top_k: int = -1
    """Keep the k most likely tokens (-1 disables it)."""
    val_n: int = 1
    """Responses per held-out prompt at evaluation."""
    val_temperature: float = 0.0
    """Evaluation temperature (0: greedy, veRL's default for validation)."""
    hybrid: HybridConfig = field(default_factory=HybridConfig)
    """Workers, seeding window, balancing and liveness of `mode=hybrid` (ignored when colocated)."""
    histospec: HistoSpecConfig = field(default_factory=HistoSpecConfig)
    """Speculative decoding from the history of earlier rollouts."""
    histopipe: HistoPipeConfig = field(default_factory=HistoPipeConfig)
    """Scheduling from the previous epoch's response lengths: longest first, long groups spread over
    workers, alternating order across steps, samples far past their history moved first."""

    def validate(self) -> None:
        """Raise ValueError naming the offending field."""
        if self.mode not in ROLLOUT_MODES:
            raise ValueError(f"rollout.mode={self.mode!r}; choose one of {', '.join(ROLLOUT_MODES)}")
        if self.n < 1 or self.val_n < 1:
            raise ValueError(f"rollout.n and rollout.val_n must be >= 1, got {self.n} and {self.val_n}")
        if self.temperature <= 0:
            raise ValueError(f"rollout.temperature must be > 0 for RL (sampling), got {self.temperature}")
        if self.val_temperature < 0:
            raise ValueError(f"rollout.val_temperature must be >= 0, got {self.val_temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"rollout.top_p must be in (0, 1], got {self.top_p}")
        self.hybrid.validate()
        self.histospec.validate()
        self.histopipe.validate()
