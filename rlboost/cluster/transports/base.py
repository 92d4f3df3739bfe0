"""The weight-transport seam's contract: how a rollout worker's copy of the weights
(`rlboost.cluster.host_copy.HostCopy`) reaches a published version (docs/weights.md, "Pulling: the
transports").

A transport is one way there, in a module of its own: `patch` (from the version the copy holds),
`from_base` (from the base model on the instance's own disk), `full` (every bucket). Each is
- `offer(m, copy)` -> `Offer | None`: whether it can reach `m` from what `copy` holds, and the bytes it
  would fetch over the link; nothing is fetched or changed (`rlboost.policies.weight_routes.routes`
  orders the offers);
- `reach(m, copy, deadline)` -> `Reached`: fetch by `deadline` (`time.monotonic()`), apply, verify every
  bucket against its CRC-32 in the manifest (so what it reaches is bit for bit a full pull), and leave
  `copy` holding the version (`copy.keep`). A route that cannot be used raises `Unusable` saying why (the
  next route is tried); objects that did not arrive by the deadline raise `PullTimeout` (the pull's limit
  is spent: no route is tried after it); a route that fails half way leaves the copy holding nothing.
Peers are not a transport: every route fetches object-store objects, which Ray's object manager serves
from any node holding a copy, and the copy keeps what it fetched so its own node can.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from rlboost.cluster.manifest import PullResult, WeightManifest
from rlboost.cluster.weights import PulledWeights, WeightError
from rlboost.policies.weight_routes import Offer

if TYPE_CHECKING:
    from rlboost.cluster.host_copy import HostCopy


@dataclass(frozen=True)
class Held:
    """The version a copy holds, as far as a patch needs to know it: no object-store reference, so the
    store frees a version as soon as the fleet moves on from it, whoever still serves it."""

    version: int
    checksum: str
    layout: tuple
    """`WeightManifest.layout`: a patch applies only between versions with the same one."""

    @classmethod
    def of(cls, m: WeightManifest) -> Held:
        return cls(m.version, m.checksum, m.layout)


@dataclass
class Reached:
    weights: PulledWeights
    changed: set[str] | None
    """Parameters that differ from the version served before; None: load them all."""
    result: PullResult


class Unusable(WeightError):
    """This route cannot reach the version (a torn patch, another base on disk): the next one is tried."""


class Transport(Protocol):
    mode: str
    """Its name: `PullResult.mode` of what it reached, `Offer.mode` of what it offers."""

    def offer(self, m: WeightManifest, copy: HostCopy) -> Offer | None: ...

    def reach(self, m: WeightManifest, copy: HostCopy, deadline: float) -> Reached: ...


__all__ = ["Held", "Reached", "Transport", "Unusable"]
