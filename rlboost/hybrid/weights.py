"""The weight store: the trainer publishes each version once; rollout workers pull it.

Contract (DESIGN.md 2.5, invariant 5):
- `publish(state, version)` packs the state dict into buckets of about `bucket_mb` (each a flat byte
  array: one object, one copy), checksums every bucket (CRC-32: it detects a torn or corrupted
  transfer; Ray's token authentication is what keeps strangers out) and puts them in Ray's object
  store once. The returned `WeightManifest` is small; it names the buckets, the tensors inside them,
  the model's architecture fingerprint and the checksum of the whole version.
- `pull(manifest, ...)` runs in a worker: it fetches the buckets, verifies each checksum and only then
  hands back a complete state dict. A wrong architecture, a checksum mismatch or a fetch timeout is an
  error and nothing is loaded: a worker either serves a complete, verified version or keeps the one
  it had (which the manager does not dispatch to).
- Peer to peer: a bucket a worker fetched is a copy in its node's object store, and Ray's object
  manager serves later fetches from any node holding a copy, so joiners do not all queue on the
  trainer's node. On one machine with `instances=processes` every worker maps the same store.
"""

from __future__ import annotations

import hashlib
import warnings
import zlib
from dataclasses import dataclass, field

import numpy as np
import torch

_DTYPES = {str(d): d for d in (torch.float32, torch.bfloat16, torch.float16, torch.float64)}


@dataclass
class WeightsConfig:
    bucket_mb: float = 64.0
    """Size of one published bucket; a bucket is the unit of transfer and of checksumming."""
    pull_timeout_s: float = 120.0
    """A pull that has not completed in this long fails (the worker is retried or dropped)."""
    pull_retries: int = 2
    """Failed pulls retried per worker and version before the worker is dropped."""

    def validate(self) -> None:
        if self.bucket_mb <= 0:
            raise ValueError(f"rollout.hybrid.weights.bucket_mb must be > 0, got {self.bucket_mb}")
        if self.pull_timeout_s <= 0:
            raise ValueError(f"rollout.hybrid.weights.pull_timeout_s must be > 0, got {self.pull_timeout_s}")
        if self.pull_retries < 0:
            raise ValueError(f"rollout.hybrid.weights.pull_retries must be >= 0, got {self.pull_retries}")


@dataclass(frozen=True)
class TensorSlot:
    name: str
    dtype: str
    shape: tuple[int, ...]
    offset: int
    """Byte offset inside its bucket."""
    nbytes: int


@dataclass
class Bucket:
    ref: object
    """Ray ObjectRef of a flat uint8 array."""
    nbytes: int
    crc32: int
    tensors: list[TensorSlot]


@dataclass
class WeightManifest:
    version: int
    fingerprint: str
    """The architecture the weights are for (see `fingerprint`)."""
    checksum: str
    """Of the whole version: a worker reports it back once it serves these weights."""
    buckets: list[Bucket] = field(default_factory=list)

    @property
    def nbytes(self) -> int:
        return sum(b.nbytes for b in self.buckets)


class WeightError(RuntimeError):
    """A pull that must not be served: wrong model, torn or corrupted bytes, or a timeout."""


def fingerprint(state: dict[str, torch.Tensor]) -> str:
    """Names, shapes and dtypes of the parameters: two models share it iff one's weights fit the other."""
    spec = ";".join(f"{n}:{tuple(t.shape)}:{t.dtype}" for n, t in sorted(state.items()))
    return hashlib.sha256(spec.encode()).hexdigest()[:16]


def publish(state: dict[str, torch.Tensor], version: int, bucket_mb: float = 64.0) -> WeightManifest:
    """Pack, checksum and put one version into Ray's object store (the caller keeps the manifest alive:
    it holds the only references to the buckets)."""
    import ray

    limit = int(bucket_mb * 2**20)
    groups: list[list[tuple[str, torch.Tensor]]] = [[]]
    size = 0
    for name, t in state.items():
        if groups[-1] and size + t.numel() * t.element_size() > limit:
            groups.append([])
            size = 0
        groups[-1].append((name, t))
        size += t.numel() * t.element_size()
    buckets = []
    for group in groups:
        slots, offset = [], 0
        for name, t in group:
            nbytes = t.numel() * t.element_size()
            slots.append(TensorSlot(name, str(t.dtype), tuple(t.shape), offset, nbytes))
            offset += nbytes
        flat = np.empty(offset, dtype=np.uint8)
        for (name, t), slot in zip(group, slots):
            flat[slot.offset:slot.offset + slot.nbytes] = _bytes_of(t)
        buckets.append(Bucket(ray.put(flat), offset, zlib.crc32(flat), slots))
    return WeightManifest(version, fingerprint(state), version_checksum(b.crc32 for b in buckets), buckets)


def version_checksum(crcs) -> str:
    return hashlib.sha256(",".join(f"{c:08x}" for c in crcs).encode()).hexdigest()[:16]


def pull(manifest: WeightManifest, expected_fingerprint: str, timeout_s: float) -> dict[str, torch.Tensor]:
    """Fetch and verify every bucket; returns the state dict (tensors viewing the fetched buckets).
    Raises `WeightError` before anything could be loaded if any check fails."""
    import ray

    if manifest.fingerprint != expected_fingerprint:
        raise WeightError(f"version {manifest.version} is for model {manifest.fingerprint}, this worker "
                          f"serves model {expected_fingerprint}")
    # One wait for all buckets: Ray then fetches them side by side (waiting for one bucket at a time
    # measured twice as slow on a node-to-node transfer).
    refs = [b.ref for b in manifest.buckets]
    ready, _ = ray.wait(refs, num_returns=len(refs), timeout=timeout_s)
    if len(ready) < len(refs):
        raise WeightError(f"pull of version {manifest.version} timed out after {timeout_s}s "
                          f"({len(ready)} of {len(refs)} buckets arrived)")
    state: dict[str, torch.Tensor] = {}
    for bucket, flat in zip(manifest.buckets, ray.get(refs)):
        if flat.nbytes != bucket.nbytes or zlib.crc32(flat) != bucket.crc32:
            raise WeightError(f"version {manifest.version}: a bucket failed its checksum (torn or corrupted)")
        for slot in bucket.tensors:
            dtype = _DTYPES[slot.dtype]
            count = slot.nbytes // torch.empty((), dtype=dtype).element_size()
            with warnings.catch_warnings():  # a read-only view of the object store: the engine copies from it
                warnings.simplefilter("ignore", UserWarning)
                state[slot.name] = torch.frombuffer(flat, dtype=dtype, count=count,
                                                    offset=slot.offset).view(slot.shape)
    return state


def _bytes_of(t: torch.Tensor) -> np.ndarray:
    return t.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy()
