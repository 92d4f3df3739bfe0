"""Counter-based random draws: the uniform for token t of a request is a pure function of (seed, t).

A resumed request (prompt + partial tokens, possibly on another worker) therefore draws exactly the
numbers it would have drawn uninterrupted, on any device, with no generator state to carry over.
`t` is the token's absolute position in the sequence, which is the same before and after resuming.
"""

from __future__ import annotations

_MASK64 = (1 << 64) - 1


def _splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def hash64(seed: int, position: int, stream: int = 0) -> int:
    """64 random bits for (seed, position); `stream` separates independent uses."""
    return _splitmix64(_splitmix64(_splitmix64(seed & _MASK64) ^ position) ^ stream)


def uniform(seed: int, position: int, stream: int = 0) -> float:
    """A U(0, 1) draw, never exactly 0 or 1, for (seed, position); `stream` separates independent uses."""
    return ((hash64(seed, position, stream) >> 11) + 0.5) / float(1 << 53)


def derive_seed(base_seed: int, counter: int) -> int:
    """A 63-bit request seed for the engine's `counter`-th request without a seed of its own."""
    return _splitmix64(_splitmix64(base_seed & _MASK64) ^ counter) >> 1
