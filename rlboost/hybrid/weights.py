"""The weight store: the trainer publishes each version once; rollout workers pull it.

Contract (DESIGN.md 2.5, invariant 5):
- `publish(state, version)` packs the state dict into buckets of about `bucket_mb` (each a flat byte
  array: one object, one copy), checksums every bucket (CRC-32: it detects a torn or corrupted
  transfer; Ray's token authentication is what keeps strangers out) and puts them in Ray's object
  store once. The returned `WeightManifest` is small; it names the buckets, the tensors inside them,
  the model's architecture fingerprint and the checksum of the whole version.
- `pull(manifest, ...)` runs in a worker: it fetches the buckets, verifies each checksum and only then
  hands back the complete version, a mapping of parameter name to tensor (`PulledWeights`: the
  tensors are views of the fetched buckets, made when first read, so a worker whose engine needs
  no tensors never imports torch). A wrong architecture, a checksum mismatch or a fetch timeout is
  an error and nothing is loaded: a worker either serves a complete, verified version or keeps the
  one it had (which the manager does not dispatch to).
- The manifest and the other messages are `rlboost.hybrid.wire`'s torch-free types.
- Peer to peer: a bucket a worker fetched is a copy in its node's object store, and Ray's object
  manager serves later fetches from any node holding a copy, so joiners do not all queue on the
  trainer's node. On one machine with `instances=processes` every worker maps the same store.
"""

from __future__ import annotations

import warnings
import zlib
from collections.abc import Iterator, Mapping

import numpy as np

from rlboost.engine.protocol import weights_fingerprint as fingerprint
from rlboost.hybrid.config import WeightsConfig
from rlboost.hybrid.wire import Bucket, TensorSlot, WeightManifest, version_checksum


class WeightError(RuntimeError):
    """A pull that must not be served: wrong model, torn or corrupted bytes, or a timeout."""


def publish(state: Mapping[str, object], version: int, bucket_mb: float = 64.0) -> WeightManifest:
    """Pack, checksum and put one version into Ray's object store (the caller keeps the manifest alive:
    it holds the only references to the buckets)."""
    import ray

    limit = int(bucket_mb * 2**20)
    groups: list[list[tuple[str, object]]] = [[]]
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


class PulledWeights(Mapping):
    """A verified version: parameter name -> tensor, each a read-only view of its fetched bucket, made
    when first read (torch is imported then). Holding it keeps this node's copies of the buckets in
    the object store, where later joiners can fetch them (peer to peer)."""

    def __init__(self, manifest: WeightManifest, arrays: list[np.ndarray]):
        self.manifest, self.arrays = manifest, arrays
        self._where = {slot.name: (i, slot) for i, b in enumerate(manifest.buckets) for slot in b.tensors}

    def __getitem__(self, name: str):
        import torch

        i, slot = self._where[name]
        dtype = getattr(torch, slot.dtype.removeprefix("torch."))
        count = slot.nbytes // torch.empty((), dtype=dtype).element_size()
        with warnings.catch_warnings():  # a read-only view of the object store: the engine copies from it
            warnings.simplefilter("ignore", UserWarning)
            return torch.frombuffer(self.arrays[i], dtype=dtype, count=count, offset=slot.offset).view(slot.shape)

    def __iter__(self) -> Iterator[str]:
        return iter(self._where)

    def __len__(self) -> int:
        return len(self._where)

    @property
    def nbytes(self) -> int:
        return self.manifest.nbytes


def pull(manifest: WeightManifest, expected_fingerprint: str, timeout_s: float) -> PulledWeights:
    """Fetch and verify every bucket; returns the whole version. Raises `WeightError` before anything
    could be loaded if any check fails."""
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
    arrays = ray.get(refs)
    for bucket, flat in zip(manifest.buckets, arrays):
        if flat.nbytes != bucket.nbytes or zlib.crc32(flat) != bucket.crc32:
            raise WeightError(f"version {manifest.version}: a bucket failed its checksum (torn or corrupted)")
    return PulledWeights(manifest, arrays)


def _bytes_of(t) -> np.ndarray:
    import torch

    return t.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy()


__all__ = ["Bucket", "PulledWeights", "TensorSlot", "WeightError", "WeightManifest", "WeightsConfig", "fingerprint",
           "publish", "pull", "version_checksum"]
