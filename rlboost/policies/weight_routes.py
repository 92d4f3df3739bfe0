"""Which way a rollout worker reaches a published weight version: the choice behind the weight-transport
seam (`rlboost.cluster.transports`, docs/weights.md, "Pulling: the transports").

Contract: each transport that can reach the version from what the worker holds makes an `Offer` (its
name and the bytes it would fetch over the link); `routes(offers)` orders them, the first to try first.
The fewest bytes come first: every route of one pull crosses the same link from the same store, so its
bytes are what orders them on the wire. On a tie the route named earlier in `PREFERENCE` comes first
(less work on the worker: applying a patch to the copy it holds, before reading a base model from disk,
before taking the whole version). A full pull is always on offer and, as the publisher offers patches
only up to `cluster.weights.max_patch_share` (at most 1) of the version, it comes last: the order is the
one the worker always took (patch, else from its base, else full), now written as one rule a new
transport joins by making an offer. Local costs (reading the base from disk, applying a patch) are not
weighed: a worker has not measured them before its first join.

Pure: names and numbers in, an order out.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

PREFERENCE = ("patch", "from_base", "full")
"""Tie-break among offers of equal bytes; a transport not named here comes after these."""


@dataclass(frozen=True)
class Offer:
    mode: str
    """The transport's name (`PullResult.mode` once it reached the version)."""
    nbytes: int
    """Bytes it would fetch over the link."""


def routes(offers: Iterable[Offer]) -> list[Offer]:
    """`offers` in the order to try them (module docstring)."""
    def rank(o: Offer) -> tuple[int, int]:
        return o.nbytes, PREFERENCE.index(o.mode) if o.mode in PREFERENCE else len(PREFERENCE)
    return sorted(offers, key=rank)


__all__ = ["Offer", "PREFERENCE", "routes"]
