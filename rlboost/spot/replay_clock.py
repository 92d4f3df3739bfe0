"""The trace replay's clock tied to the run's progress (`rollout.hybrid.trace.tokens_per_s`).

On wall time a replay meets its events wherever the run happens to be: a fast machine has finished
its steps before the trace's first drop, a slow one sees its drops while the trainer trains and the
instances hold nothing. A `ProgressClock` reads instead the response tokens the run has generated,
divided by a nominal rate, so every machine meets each event at the same token of the run.

Contract: the runtime calls `begin(tokens_so_far)` when a step (or an evaluation) starts, with a
callable that returns that step's tokens generated so far, which must never decrease; the previous
step's count, final by then, is folded into the run's total. Calling the clock, from any thread,
returns run seconds that never go back: (tokens of finished steps, this step's counter) is replaced
as one value, so a reader never adds a step twice or skips one. Pure: no wall clock, no threads.
"""

from __future__ import annotations

import math
from collections.abc import Callable


def _nothing_yet() -> int:
    return 0


class ProgressClock:
    def __init__(self, tokens_per_s: float):
        if not (tokens_per_s > 0 and math.isfinite(tokens_per_s)):
            raise ValueError(f"tokens_per_s must be a finite number > 0, got {tokens_per_s}")
        self.tokens_per_s = tokens_per_s
        self._parts: tuple[int, Callable[[], int]] = (0, _nothing_yet)

    def begin(self, tokens_so_far: Callable[[], int]) -> None:
        """A step starts; `tokens_so_far()` is its count of generated tokens from now on."""
        done, current = self._parts
        self._parts = (done + current(), tokens_so_far)

    def tokens(self) -> int:
        """Response tokens the run has generated."""
        done, current = self._parts
        return done + current()

    def __call__(self) -> float:
        """Run seconds of the replay: tokens generated / tokens_per_s."""
        return self.tokens() / self.tokens_per_s


__all__ = ["ProgressClock"]
