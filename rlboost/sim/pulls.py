"""What a weight pull moves in the simulated cluster: the whole version, a patch against the version
the puller holds, or the cumulative patch from the base model (issue 25; docs/simulator.md, "Weight
patches").

Contract: `PullTimes.seconds(holds, target)` is how long a puller holding version `holds` (None: only
the base model from its own disk, a joiner) takes to reach version `target` over its link: the full
version's seconds times `share(holds, target)`, which is
- `patch_share` when it holds target - 1 (a refresh: the sparse patch v-1 -> v),
- `from_base_share` when it holds no version (a join: the cumulative patch base -> v),
- 1.0 otherwise (two or more versions behind: the full version, as the weight store serves it).
The shares are assumptions of the run (SimConfig), constant over its steps. Pure arithmetic.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PullTimes:
    """Pull times over one link, from the seconds of the whole version and the two patch shares."""

    full_s: float
    """Seconds to move the whole version (its bytes in the wire dtype over the link)."""
    patch_share: float
    """Share of the whole version's bytes in the patch v-1 -> v."""
    from_base_share: float
    """Share of the whole version's bytes in the cumulative patch base -> v."""

    def share(self, holds: int | None, target: int) -> float:
        """The share of the whole version a puller holding `holds` moves to reach `target`."""
        if holds is None:
            return self.from_base_share
        if target - holds == 1:
            return self.patch_share
        return 1.0

    def seconds(self, holds: int | None, target: int) -> float:
        return self.full_s * self.share(holds, target)

    @property
    def longest_planned_s(self) -> float:
        """The longer of a join and a refresh: what every instance that keeps up pulls at most."""
        return self.full_s * max(self.patch_share, self.from_base_share)


__all__ = ["PullTimes"]
