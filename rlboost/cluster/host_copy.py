"""A rollout worker's own copy of the version it serves, in the wire dtype: what a patch is applied to.

Contract: `HostCopy(load_base).pull(manifest, fingerprint, timeout_s)` -> `Reached` (the verified
version as `PulledWeights`, the names of the parameters that differ from the version served before,
or None for "all", and a `PullResult` saying how it got there). In order of preference:
1. `patch`: it holds the version a patch on offer starts from (same layout, same checksum): the patch
   is fetched and applied in place, bucket by bucket;
2. `from_base`: it holds nothing yet and the version is the run's base or carries a patch from it:
   `load_base()` reads the base model from this instance's own disk, packed into the manifest's
   layout and checksummed; a base whose checksum is not the run's is never patched or served (the
   pull goes on in full and `PullResult.note` says so);
3. `full`: every bucket fetched (`weights.pull`).
Every bucket reached by a patch must match its CRC-32 in the manifest, so the result is bit-identical
to a full pull; a torn, corrupted or unfetchable patch drops the copy and the pull goes on in full.
Buckets are packed, patched and checksummed on a few threads (`_THREADS`): numpy, zstd, zlib and
torch's casts release the GIL, and a join waits on these seconds.
With `manifest.patching` it keeps a writable copy of what it reached (one more model in host memory);
otherwise none, and the next pull is full. It also keeps what it fetched (buckets or patch parts) until
the next pull, so this node's object store can serve them to peers.
Torch is imported only to read the base model.
"""

from __future__ import annotations

import os
import threading
import time
import zlib
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from rlboost.cluster import patches
from rlboost.cluster.manifest import PatchSet, PullResult, WeightManifest, version_checksum
from rlboost.cluster.weights import PulledWeights, WeightError, pull
from rlboost.models.config import ModelConfig

_THREADS = min(4, os.cpu_count() or 1)
"""Threads that pack, patch and checksum buckets side by side (more gain little: memory bandwidth)."""


@dataclass
class Reached:
    weights: PulledWeights
    changed: set[str] | None
    """Parameters that differ from the version served before; None: load them all."""
    result: PullResult


class HostCopy:
    def __init__(self, load_base: Callable[[], Mapping[str, object]] | None = None):
        self.load_base = load_base
        """Reads the run's base model (name -> tensor) from this instance's disk; None: never join from it."""
        self.held: WeightManifest | None = None
        self.arrays: list[np.ndarray] | None = None
        self._fetched: list = []
        """What the last pull fetched: kept so this node's object store can serve it to peers."""

    def pull(self, m: WeightManifest, fingerprint: str, timeout_s: float) -> Reached:
        if m.fingerprint != fingerprint:
            raise WeightError(f"version {m.version} is for model {m.fingerprint}, this worker serves model {fingerprint}")
        t0, note = time.perf_counter(), ""
        if self.arrays is not None and self.held is not None and self.held.layout == m.layout:
            patch = m.patch_from(self.held.version, self.held.checksum)
            if patch is not None:
                try:
                    return self._patched(m, patch, "patch", timeout_s, t0)
                except (patches.PatchError, WeightError) as e:
                    note = f"the patch from v{patch.from_version} was not usable ({e})"
        elif self.held is None and m.from_base and self.load_base is not None:
            reached = self._from_base(m, timeout_s, t0)
            if isinstance(reached, Reached):
                return reached
            note = reached
        self.arrays, self.held = None, None  # whatever it held is not what the full pull builds on
        weights = pull(m, fingerprint, timeout_s)
        self._fetched = weights.arrays
        arrays = [a.copy() for a in weights.arrays] if m.patching else weights.arrays
        result = PullResult(m.version, m.checksum, m.nbytes, time.perf_counter() - t0, "full", note)
        if not m.patching:
            self.held = None
            return Reached(weights, None, result)
        self.arrays = arrays
        return self._kept(m, None, result)

    def drop(self) -> None:
        """Forget the held version (its load failed): the next pull is full."""
        self.held, self.arrays = None, None

    def _from_base(self, m: WeightManifest, timeout_s: float, t0: float) -> Reached | str:
        """The version reached from the base on this instance's disk, or why not."""
        patch = m.patch_from_base()
        if patch is not None:
            _prefetch(patch.parts, timeout_s)  # the link carries the patch while the disk gives the base
        try:
            self.arrays = pack(self.load_base(), m)
        except (OSError, ValueError, WeightError) as e:
            return f"the base model could not be read: {str(e).splitlines()[0] if str(e) else type(e).__name__}"
        base = version_checksum(_map(zlib.crc32, self.arrays))
        if base == m.checksum:
            return self._kept(m, None, PullResult(m.version, m.checksum, 0, time.perf_counter() - t0, "from_base"))
        if patch is None or patch.from_checksum != base:
            return f"the base model on this instance's disk (checksum {base}) is not the run's base"
        try:
            return self._patched(m, patch, "from_base", timeout_s, t0)
        except (patches.PatchError, WeightError) as e:
            return f"the patch from the base was not usable ({e})"

    def _patched(self, m: WeightManifest, patch: PatchSet, mode: str, timeout_s: float, t0: float) -> Reached:
        import ray

        ready, _ = ray.wait(patch.parts, num_returns=len(patch.parts), timeout=timeout_s)
        if len(ready) < len(patch.parts):
            raise WeightError(f"timed out after {timeout_s}s ({len(ready)} of {len(patch.parts)} parts arrived)")
        parts = ray.get(patch.parts)

        def patched(bucket, buf, part) -> set[str]:
            where = patches.apply(buf, part)
            if zlib.crc32(buf) != bucket.crc32:
                raise WeightError("a patched bucket failed its checksum (a patch for other bytes, or corrupted)")
            return _names_at(bucket, where)

        try:
            changed = set().union(*_map(patched, m.buckets, self.arrays, parts))
        except BaseException:
            self.arrays, self.held = None, None  # half patched: nothing to build on
            raise
        self._fetched = parts
        result = PullResult(m.version, m.checksum, patch.nbytes, time.perf_counter() - t0, mode)
        return self._kept(m, changed if mode == "patch" else None, result)

    def _kept(self, m: WeightManifest, changed: set[str] | None, result: PullResult) -> Reached:
        weights = PulledWeights(m, self.arrays)
        if m.patching:
            self.held = m
        else:
            self.held, self.arrays = None, None
        return Reached(weights, changed, result)


def _prefetch(refs: list, timeout_s: float) -> None:
    """Starts moving `refs` into this node's object store and returns at once (`ray.wait` with
    `fetch_local` pulls what it waits for; its thread ends when they are here or at the timeout)."""
    import ray

    threading.Thread(target=ray.wait, args=(refs,), daemon=True, name="prefetch",
                     kwargs={"num_returns": len(refs), "timeout": timeout_s, "fetch_local": True}).start()


def _map(fn, *iterables) -> list:
    """`list(map(fn, *iterables))` on `_THREADS` threads (the first error raised, as `map` would)."""
    with ThreadPoolExecutor(_THREADS, thread_name_prefix="host-copy") as pool:
        return list(pool.map(fn, *iterables))


def _names_at(bucket, where: np.ndarray) -> set[str]:
    """The tensors of `bucket` holding any of the element indices `where`."""
    if where.size == 0:
        return set()
    starts = np.array([s.offset // bucket.itemsize for s in bucket.tensors])
    hit = np.unique(np.searchsorted(starts, where, side="right") - 1)
    return {bucket.tensors[i].name for i in hit}


def pack(state: Mapping[str, object], m: WeightManifest) -> list[np.ndarray]:
    """`state`'s tensors cast to each slot's dtype and laid out as `m`'s buckets (how an instance's base
    is compared with the run's, and how the publisher of a resumed run makes its base)."""
    import torch

    def packed(bucket) -> np.ndarray:
        flat = np.empty(bucket.nbytes, dtype=np.uint8)
        for s in bucket.tensors:
            if s.name not in state:
                raise WeightError(f"the base model has no parameter {s.name}")
            t = state[s.name].detach().to(getattr(torch, s.dtype.removeprefix("torch."))).cpu().contiguous()
            if tuple(t.shape) != s.shape:
                raise WeightError(f"the base model's {s.name} has shape {tuple(t.shape)}, the run's {s.shape}")
            flat[s.offset:s.offset + s.nbytes] = t.view(-1).view(torch.uint8).numpy()
        return flat

    return _map(packed, m.buckets)


def base_reader(model: ModelConfig) -> Callable[[], dict]:
    """Reads `model` (the run's `model.path`) from this machine's disk, in `model.dtype`. `pack` casts it
    as the trainer's weights are cast; a worker reads it in the dtype it serves, the one weights travel
    in, so nothing is cast twice: a model loaded in bf16 has the bits of the fp32 one cast to bf16 (de-
    quantized GGUF and tiny models alike; the checksum refuses a base where that would not hold)."""

    def read() -> dict:
        from rlboost.models import load_model

        return dict(load_model(model).model.named_parameters())

    return read


__all__ = ["HostCopy", "Reached", "base_reader", "pack"]
