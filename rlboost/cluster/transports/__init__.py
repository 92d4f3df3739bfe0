"""Ways a rollout worker's copy reaches a published weight version, one module each behind one
contract (`base.Transport`; docs/weights.md, "Pulling: the transports"): `patch`, `from_base`, `full`.
A new transport is a new module here and an entry in `TRANSPORTS`; `rlboost.policies.weight_routes`
orders what they offer."""

from rlboost.cluster.transports.base import Held, Reached, Transport, Unusable
from rlboost.cluster.transports.from_base import FromBase
from rlboost.cluster.transports.full import FullPull
from rlboost.cluster.transports.patch import PatchPull

TRANSPORTS: dict[str, Transport] = {t.mode: t for t in (PatchPull(), FromBase(), FullPull())}
"""Every transport, by name."""

__all__ = ["TRANSPORTS", "FromBase", "FullPull", "Held", "PatchPull", "Reached", "Transport", "Unusable"]
