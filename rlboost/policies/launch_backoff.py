"""When a provider may launch instances again after failed boots: exponential backoff.

Contract: after the k-th failed boot in a row, no launch for `first_s` x 2^(k-1) seconds, at most
`max_s`; a boot that succeeds resets it (the next failure waits `first_s` again). An instance that
can never boot (a model missing on the instances, a Ray node that does not come up) is then asked
for at 1, 2, 4 ... `max_s` seconds apart instead of at every tick of its provider. `first_s` 0
turns the backoff off.

Pure: the caller passes the time (any monotonic seconds); no clock, no threads.
"""

from __future__ import annotations


class LaunchBackoff:
    def __init__(self, first_s: float, max_s: float):
        if not 0 <= first_s <= max_s:
            raise ValueError(f"need 0 <= first_s <= max_s, got {first_s} and {max_s}")
        self.first_s, self.max_s = first_s, max_s
        self.failures = 0
        """Failed boots since the last one that succeeded."""
        self.delay_s = 0.0
        """The wait the last failure set."""
        self.next_launch_s = float("-inf")

    def may_launch(self, now_s: float) -> bool:
        return now_s >= self.next_launch_s

    def wait_s(self, now_s: float) -> float:
        """Seconds until launches may go on (0: now)."""
        return max(0.0, self.next_launch_s - now_s)

    def failed(self, now_s: float) -> float:
        """A boot failed (noticed at `now_s`): the wait before the next launch, in seconds."""
        self.failures += 1
        # doubled step by step rather than first_s * 2**k: no overflow after a thousand failures
        self.delay_s = self.first_s if self.failures == 1 else min(2 * self.delay_s, self.max_s)
        self.next_launch_s = now_s + self.delay_s
        return self.delay_s

    def booted(self) -> None:
        """A boot succeeded: launches go on at once, and the next failure waits `first_s`."""
        self.failures, self.delay_s, self.next_launch_s = 0, 0.0, float("-inf")


__all__ = ["LaunchBackoff"]
