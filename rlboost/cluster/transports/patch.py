"""The `patch` transport: the lossless patch from the version the copy holds (`rlboost.cluster.patches`),
fetched and applied in place, bucket by bucket, each patched bucket checked against its CRC-32. It names
the parameters that changed, so the engine reloads only those. Also what a `from_base` route applies
once the base is read (`apply`)."""

from __future__ import annotations

import time
import zlib
from typing import TYPE_CHECKING

import numpy as np

from rlboost.cluster import patches
from rlboost.cluster.manifest import PatchSet, PullResult, WeightManifest
from rlboost.cluster.transports.base import Reached, Unusable
from rlboost.cluster.weights import PullTimeout, WeightError, fetch
from rlboost.policies.weight_routes import Offer

if TYPE_CHECKING:
    from rlboost.cluster.host_copy import HostCopy


class PatchPull:
    mode = "patch"

    def offer(self, m: WeightManifest, copy: HostCopy) -> Offer | None:
        patch = self._patch(m, copy)
        return Offer(self.mode, patch.nbytes) if patch is not None else None

    def reach(self, m: WeightManifest, copy: HostCopy, deadline: float) -> Reached:
        patch = self._patch(m, copy)
        try:
            changed = apply(m, patch, copy, deadline)
        except (patches.PatchError, Unusable) as e:
            raise Unusable(f"the patch from v{patch.from_version} was not usable ({e})") from None
        return copy.keep(m, changed, PullResult(m.version, m.checksum, patch.nbytes, 0.0, self.mode))

    @staticmethod
    def _patch(m: WeightManifest, copy: HostCopy) -> PatchSet | None:
        held = copy.held
        if copy.arrays is None or held is None or held.layout != m.layout:
            return None
        return m.patch_from(held.version, held.checksum)


def apply(m: WeightManifest, patch: PatchSet, copy: HostCopy, deadline: float) -> set[str]:
    """`patch`'s parts fetched by `deadline` and applied to `copy.arrays` in place; the names of the
    parameters that changed. A bucket that fails its checksum raises `Unusable`; whatever fails leaves the
    copy holding nothing (half patched: nothing to build on)."""
    from rlboost.cluster.host_copy import run_threads

    try:
        parts = fetch(patch.parts, deadline, f"the {len(patch.parts)} parts of the patch from v{patch.from_version}")
    except PullTimeout:
        raise
    except WeightError as e:  # a part lost: the version itself may still be at hand
        copy.forget()
        raise Unusable(str(e)) from None

    def patched(bucket, buf, part) -> set[str]:
        where = patches.apply(buf, part)
        if zlib.crc32(buf) != bucket.crc32:
            raise Unusable("a patched bucket failed its checksum (a patch for other bytes, or corrupted)")
        return _names_at(bucket, where)

    try:
        changed = set().union(*run_threads(patched, m.buckets, copy.arrays, parts))
    except BaseException:
        copy.forget()
        raise
    copy.fetched = parts
    return changed


def _names_at(bucket, where: np.ndarray) -> set[str]:
    """The tensors of `bucket` holding any of the element indices `where`."""
    if where.size == 0:
        return set()
    starts = np.array([s.offset // bucket.itemsize for s in bucket.tensors])
    hit = np.unique(np.searchsorted(starts, where, side="right") - 1)
    return {bucket.tensors[i].name for i in hit}


__all__ = ["PatchPull", "apply"]
