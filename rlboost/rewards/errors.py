"""What can go wrong with a reward function: it cannot be loaded (a set-up error, found before the run
starts), or it fails on a sample (the run stops, under reward.on_error=raise)."""

from __future__ import annotations


class RewardConfigError(ValueError):
    """A reward function that cannot be loaded or cannot be called the way rewards are called."""


class RewardFunctionError(RuntimeError):
    """The reward function failed on the sample named: it raised, returned something that is not a
    score, ran past reward.timeout_s, or ended its worker process; or no worker could be restarted."""
