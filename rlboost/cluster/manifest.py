"""What the weight store (`rlboost.cluster.weights`) hands out, as torch-free, Ray-free types.

Contract: plain dataclasses of ints, strings, lists and (for the buckets) opaque object-store
references. Unpickling any of them imports nothing but this module, so a rollout worker whose
engine needs no torch never loads it, and a trainer rank and the rollout manager pass them along
without knowing who made them.

- `WeightManifest` / `Bucket` / `TensorSlot`: one published weight version (DESIGN.md 2.5): where its
  checksummed buckets are and which tensors each holds.
- `PullResult`: what a verified pull reports back.
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


@dataclass
class Bucket:
    ref: object
    """Object-store reference of a flat uint8 array."""
    nbytes: int
    crc32: int
    tensors: list[TensorSlot]


@dataclass
class WeightManifest:
    version: int
    fingerprint: str
    """The architecture the weights are for."""
    checksum: str
    """Of the whole version: a worker reports it back once it serves these weights."""
    buckets: list[Bucket] = field(default_factory=list)

    @property
    def nbytes(self) -> int:
        return sum(b.nbytes for b in self.buckets)


@dataclass
class PullResult:
    version: int
    checksum: str
    nbytes: int
    seconds: float


def version_checksum(crcs: Iterable[int]) -> str:
    """The checksum of a whole version from its buckets' CRC-32s, in order."""
    return hashlib.sha256(",".join(f"{c:08x}" for c in crcs).encode()).hexdigest()[:16]


__all__ = ["Bucket", "PullResult", "TensorSlot", "WeightManifest", "version_checksum"]
