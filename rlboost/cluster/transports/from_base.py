"""The `from_base` transport: a joining worker (it holds nothing yet) reads the run's base model from its
own disk (`HostCopy.load_base`), packed into the version's layout and checksummed, then applies the
cumulative patch from the base (nothing travels when the version is the base itself). The patch's parts
start moving while the disk gives the base. A base whose checksum is not the run's is never patched or
served: the route is unusable and the next one (full) is taken."""

from __future__ import annotations

import threading
import time
import zlib
from typing import TYPE_CHECKING

from rlboost.cluster import patches
from rlboost.cluster.manifest import PullResult, WeightManifest, version_checksum
from rlboost.cluster.transports.base import Reached, Unusable
from rlboost.cluster.transports.patch import apply
from rlboost.cluster.weights import WeightError, fetch
from rlboost.policies.weight_routes import Offer

if TYPE_CHECKING:
    from rlboost.cluster.host_copy import HostCopy


class FromBase:
    mode = "from_base"

    def offer(self, m: WeightManifest, copy: HostCopy) -> Offer | None:
        if copy.held is not None or copy.load_base is None or not m.from_base:
            return None
        patch = m.patch_from_base()
        return Offer(self.mode, patch.nbytes if patch is not None else 0)

    def reach(self, m: WeightManifest, copy: HostCopy, deadline: float) -> Reached:
        from rlboost.cluster.host_copy import pack, run_threads

        patch = m.patch_from_base()
        if patch is not None:  # the link carries the patch while the disk gives the base
            _prefetch(patch.parts, deadline)
        try:
            copy.arrays = pack(copy.load_base(), m)
        except (OSError, ValueError, WeightError) as e:
            copy.forget()
            why = str(e).splitlines()[0] if str(e) else type(e).__name__
            raise Unusable(f"the base model could not be read: {why}") from None
        base = version_checksum(run_threads(zlib.crc32, copy.arrays))
        if base == m.checksum:
            return copy.keep(m, None, PullResult(m.version, m.checksum, 0, 0.0, self.mode))
        if patch is None or patch.from_checksum != base:
            copy.forget()
            raise Unusable(f"the base model on this instance's disk (checksum {base}) is not the run's base")
        try:
            apply(m, patch, copy, deadline)
        except (patches.PatchError, Unusable) as e:
            raise Unusable(f"the patch from the base was not usable ({e})") from None
        return copy.keep(m, None, PullResult(m.version, m.checksum, patch.nbytes, 0.0, self.mode))


def _prefetch(refs: list, deadline: float) -> None:
    """Starts moving `refs` into this node's object store and returns at once: a thread fetches them
    (`weights.fetch`, one bundle, pinned as they land) and lets go; they stay in the store, where the
    route's own fetch finds them. It ends when they are here or at the deadline."""
    def run() -> None:
        try:
            fetch(refs, deadline, "prefetch")
        except Exception:  # noqa: BLE001 - the route's own fetch says what went wrong
            pass

    threading.Thread(target=run, daemon=True, name="prefetch").start()


__all__ = ["FromBase"]
