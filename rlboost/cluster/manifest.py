"""What the weight store (`rlboost.cluster.weights`) hands out, as torch-free, Ray-free types.

Contract: plain dataclasses of ints, strings, lists and (for the buckets) opaque object-store
references. Unpickling any of them imports nothing but this module, so a rollout worker whose
engine needs no torch never loads it, and a trainer rank and the rollout manager pass them along
without knowing who made them.

- `WeightManifest` / `Bucket` / `TensorSlot`: one published weight version
  (docs/elastic.md, "Weights: published once, pulled, verified"): where its checksummed buckets are
  and which tensors each holds, and the patches (`PatchSet`) that turn an earlier version, bucket by
  bucket, into this one (`rlboost.cluster.patches`).
- `PullResult`: what a verified pull reports back, and how it got there (`mode`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass, field


@dataclass(frozen=True)
class TensorSlot:
    name: str
    dtype: str
    """As torch prints it, e.g. "torch.bfloat16"."""
    shape: tuple[int, ...]
    offset: int
    """Byte offset inside its bucket."""
    nbytes: int


ITEMSIZE = {"torch.float64": 8, "torch.float32": 4, "torch.bfloat16": 2, "torch.float16": 2, "torch.int64": 8,
            "torch.int32": 4, "torch.int16": 2, "torch.int8": 1, "torch.uint8": 1, "torch.bool": 1,
            "torch.float8_e4m3fn": 1, "torch.float8_e5m2": 1}
"""Bytes per element of the dtypes weights travel in, without importing torch."""


@dataclass
class Bucket:
    ref: object
    """Object-store reference of a flat uint8 array."""
    nbytes: int
    crc32: int
    tensors: list[TensorSlot]

    @property
    def itemsize(self) -> int:
        """The smallest element size among its tensors: it divides every tensor's bytes and offset."""
        return min((ITEMSIZE.get(s.dtype, 1) for s in self.tensors), default=1)


@dataclass
class PatchSet:
    """Version `from_version` (whose checksum is `from_checksum`) -> the manifest's version: one patch per
    bucket, in the buckets' order, each an object-store reference of a flat uint8 array."""

    from_version: int
    from_checksum: str
    parts: list[object]
    sizes: list[int]
    """Bytes of each part."""
    base: bool = False
    """From the run's base model (what every instance has on its own disk), not from the last version."""

    @property
    def nbytes(self) -> int:
        return sum(self.sizes)


@dataclass
class WeightManifest:
    version: int
    fingerprint: str
    """The architecture the weights are for."""
    checksum: str
    """Of the whole version: a worker reports it back once it serves these weights."""
    buckets: list[Bucket] = field(default_factory=list)
    patches: list[PatchSet] = field(default_factory=list)
    """Ways to reach this version from an earlier one; empty: only the full version."""
    from_base: bool = False
    """This version is the run's base, or carries a patch from it (`PatchSet.base`): a joining worker
    with the base model on its disk should load it rather than pull the whole version."""
    patching: bool = False
    """The publisher offers patches and they paid off last time (or none was tried yet): a worker should
    keep a copy of this version to apply the next one's patch to. False: no copy, the next pull is full."""

    @property
    def nbytes(self) -> int:
        return sum(b.nbytes for b in self.buckets)

    @property
    def layout(self) -> tuple:
        """Where every tensor lies: two versions with the same layout can be patched into each other."""
        return tuple((s.name, s.dtype, s.shape, s.offset, s.nbytes) for b in self.buckets for s in b.tensors) + \
            tuple(b.nbytes for b in self.buckets)

    def patch_from(self, version: int, checksum: str) -> PatchSet | None:
        """The patch from `version` with bytes `checksum`, if this manifest carries one."""
        return next((p for p in self.patches if p.from_version == version and p.from_checksum == checksum), None)

    def patch_from_base(self) -> PatchSet | None:
        return next((p for p in self.patches if p.base), None)


@dataclass
class PullResult:
    version: int
    checksum: str
    nbytes: int
    """Bytes fetched."""
    seconds: float
    mode: str = "full"
    """How the version was reached: `full`, `patch` (from the version served before) or `from_base`."""
    note: str = ""
    """Why a patch on offer was not used (a torn patch, another base): the version was pulled in full."""


def version_checksum(crcs: Iterable[int]) -> str:
    """The checksum of a whole version from its buckets' CRC-32s, in order."""
    return hashlib.sha256(",".join(f"{c:08x}" for c in crcs).encode()).hexdigest()[:16]


__all__ = ["Bucket", "PatchSet", "PullResult", "TensorSlot", "WeightManifest", "version_checksum"]
