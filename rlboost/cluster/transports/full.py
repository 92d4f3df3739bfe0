"""The `full` transport: every bucket of the version (`rlboost.cluster.weights.pull`), always on offer.
With `manifest.patching` the copy keeps a writable copy of it for the next version's patch (one more
model in host memory); otherwise none, and the next pull is full again."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from rlboost.cluster.manifest import PullResult, WeightManifest
from rlboost.cluster.transports.base import Reached
from rlboost.cluster.weights import pull_by
from rlboost.policies.weight_routes import Offer

if TYPE_CHECKING:
    from rlboost.cluster.host_copy import HostCopy


class FullPull:
    mode = "full"

    def offer(self, m: WeightManifest, copy: HostCopy) -> Offer:
        return Offer(self.mode, m.nbytes)

    def reach(self, m: WeightManifest, copy: HostCopy, deadline: float) -> Reached:
        t0 = time.perf_counter()
        copy.forget()  # whatever it held is not what this builds on
        weights = pull_by(m, deadline)
        copy.fetched = weights.arrays
        result = PullResult(m.version, m.checksum, m.nbytes, time.perf_counter() - t0, self.mode)
        if not m.patching:
            return Reached(weights, None, result)
        copy.arrays = [a.copy() for a in weights.arrays]
        return copy.keep(m, None, result)


__all__ = ["FullPull"]
