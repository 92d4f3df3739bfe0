"""A run's weight versions as the trainer publishes them: each in full, and as lossless patches where
they pay (issue 25; `rlboost.cluster.patches` for the encoding).

Contract: `Publisher(cfg, dtype).publish(named, version, gather=None, keep=True)` -> `Published`, as
`weights.publish_gathered` (weights cast to `dtype`, the engines' own, once here), plus, with
`cfg.patches`:
- a patch from the version published before (for workers serving it: a refresh), and
- a patch from the run's base, the model every instance has on its own disk (for instances joining
  with it): the first version this publisher published, or, for a run that starts past version 0 (a
  resumed run, whose first version is its checkpoint's), the model `load_base()` reads, packed as the
  instances pack it. It is always one diff base -> v, never a chain, so it
  stays as small as the cumulative change itself (the store keeps it compacted);
each offered only when its bytes are at most `cfg.max_patch_share` of the full version (otherwise
workers pull in full). The manifest lists what it offers (`WeightManifest.patches`).
Memory: with patches, the publishing process holds two more copies of the model in the wire dtype
(the previous version and the base). Buckets are encoded side by side in threads (numpy and zstd
release the GIL).
"""

from __future__ import annotations

import dataclasses
import os
import time
import zlib
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from rlboost.cluster import patches
from rlboost.cluster.config import WeightsConfig
from rlboost.cluster.host_copy import pack
from rlboost.cluster.manifest import PatchSet, version_checksum
from rlboost.cluster.weights import Published, publish_gathered


@dataclass
class _Kept:
    """A published version's bytes, to make patches from."""

    version: int
    checksum: str
    layout: tuple
    arrays: list[np.ndarray]
    itemsizes: list[int]


@dataclass
class PublishStats:
    """What the last `publish` put in the store (bench weights, weights/* metrics)."""

    full_bytes: int = 0
    patch_bytes: int = 0
    """Of the patch from the previous version, offered or not (too large); 0: none encoded."""
    from_base_bytes: int = 0
    """Of the patch from the base, likewise (0 also when this version is the base)."""
    changed_share: float = 0.0
    """Elements whose bits changed since the previous version."""
    encode_s: float = 0.0


class Publisher:
    def __init__(self, cfg: WeightsConfig, dtype=None, load_base: Callable[[], Mapping[str, object]] | None = None):
        """`load_base`: reads the run's base model (`host_copy.base_reader`), for a run that starts past
        version 0; None: such a run offers no patch from the base (joiners pull in full)."""
        self.cfg, self.dtype, self.load_base = cfg, dtype, load_base
        self._prev: _Kept | None = None
        self._base: _Kept | None = None
        self.stats = PublishStats()

    @property
    def last_bytes(self) -> list | None:
        """The buckets of the version published last, as this process holds them (with patches only)."""
        return self._prev.arrays if self._prev is not None else None

    def publish(self, named: list[tuple[str, object]], version: int, gather=None, keep: bool = True) -> Published:
        out = publish_gathered(named, version, self.cfg.bucket_mb, gather=gather, keep=keep, dtype=self.dtype,
                               hold=self.cfg.patches)
        if out.manifest is None or not self.cfg.patches:
            if out.manifest is not None:
                self.stats = PublishStats(full_bytes=out.manifest.nbytes)
            return out
        m = out.manifest
        kept = _Kept(m.version, m.checksum, m.layout, out.arrays, [b.itemsize for b in m.buckets])
        out.arrays = None
        t0 = time.perf_counter()
        self.stats = PublishStats(full_bytes=m.nbytes)
        if self._prev is not None and self._prev.layout == kept.layout:
            offered, self.stats.patch_bytes = self._offer(self._prev, kept, m.nbytes, base=False)
            m.patches += offered
        if self._base is None and m.version > 0 and self.load_base is not None:
            self._base = self._read_base(m)
        if self._base is None:
            self._base = kept  # the run's first version is what every instance's disk holds
        elif self._base.layout == kept.layout:
            if self._base is self._prev:  # the same diff: offer it under both names
                m.patches += [dataclasses.replace(p, base=True) for p in m.patches]
                self.stats.from_base_bytes = self.stats.patch_bytes
            else:
                offered, self.stats.from_base_bytes = self._offer(self._base, kept, m.nbytes, base=True)
                m.patches += offered
        m.from_base = self._base is kept or any(p.base for p in m.patches)
        m.patching = self._prev is None or any(not p.base for p in m.patches)
        self.stats.encode_s = time.perf_counter() - t0
        self._prev = kept
        return out

    def _read_base(self, m) -> _Kept:
        """The base model as the instances pack it into `m`'s layout (version 0: it is the run's first)."""
        arrays = pack(self.load_base(), m)
        return _Kept(0, version_checksum(zlib.crc32(a) for a in arrays), m.layout, arrays,
                     [b.itemsize for b in m.buckets])

    def _offer(self, old: _Kept, new: _Kept, full_bytes: int, base: bool) -> tuple[list[PatchSet], int]:
        """The patch old -> new if it is small enough to pay, and its encoded bytes either way."""
        import ray

        limit = self.cfg.max_patch_share * full_bytes
        if not base:
            changed = sum(patches.changed_share(a, b, n) * a.nbytes for a, b, n in zip(old.arrays, new.arrays, new.itemsizes))
            self.stats.changed_share = changed / max(full_bytes, 1)
        # encoded even where nearly every element changed: the XOR planes of fp32 weights after a small
        # step are mostly zero bytes (SmolLM2 at lr 2e-5: ~all elements changed, the patch ~1/8 of the version)
        with ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1)) as pool:
            parts = list(pool.map(patches.encode, old.arrays, new.arrays, new.itemsizes))
        encoded = sum(len(p) for p in parts)
        if encoded > limit:
            return [], encoded
        refs = [ray.put(np.frombuffer(p, dtype=np.uint8)) for p in parts]
        return [PatchSet(old.version, old.checksum, refs, [len(p) for p in parts], base=base)], encoded


__all__ = ["PublishStats", "Publisher"]
