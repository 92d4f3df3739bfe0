"""The weight store: the trainer publishes each version once; rollout workers pull it.

Contract (docs/elastic.md, "Weights: published once, pulled, verified"; invariant 5 of docs/hybrid.md,
"Invariants and the tests that check them"):
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
- The manifest is `rlboost.cluster.manifest`'s torch-free types.
- Each byte crosses the link once: Ray's object manager asks again for an object that has not arrived
  within its pull timeout (`object_manager_pull_timeout_ms`, 10 s, doubling after each try), and
  the sender then queues every chunk of the object again, also those already delivered, and sends
  them even after the object is complete. So `pull` fetches the buckets in groups sized to arrive
  within half that timeout at the rate measured so far (`window_bytes`, `next_group`): one bucket
  first, then as many as the link carries in time (all at once on a fast link). A single bucket
  slower than the timeout (64 MiB on a link under about 54 Mbit/s) is still sent more than once.
- Peer to peer: a bucket a worker fetched is a copy in its node's object store, and Ray's object
  manager serves later fetches from any node holding a copy, so joiners do not all queue on the
  trainer's node. On one machine with `instances=processes` every worker maps the same store.
"""

from __future__ import annotations

import time
import warnings
import zlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import numpy as np

from rlboost.cluster.config import WeightsConfig
from rlboost.cluster.manifest import Bucket, TensorSlot, WeightManifest, version_checksum
from rlboost.engine.protocol import weights_fingerprint as fingerprint


class WeightError(RuntimeError):
    """A pull that must not be served: wrong model, torn or corrupted bytes, or a timeout."""


def publish(state: Mapping[str, object], version: int, bucket_mb: float = 64.0) -> WeightManifest:
    """Pack, checksum and put one version into Ray's object store (the caller keeps the manifest alive:
    it holds the only references to the buckets). No patches: `rlboost.cluster.publisher` adds them."""
    return publish_gathered(list(state.items()), version, bucket_mb).manifest


def plan_buckets(named: list[tuple[str, object]], limit: int) -> list[list[tuple[str, object]]]:
    """`named` in order, cut into buckets of at most `limit` bytes by each tensor's full size (shapes
    only, nothing is read); a tensor larger than `limit` gets a bucket of its own."""
    buckets: list[list[tuple[str, object]]] = [[]]
    size = 0
    for name, t in named:
        nbytes = t.numel() * t.element_size()
        if buckets[-1] and size + nbytes > limit:
            buckets.append([])
            size = 0
        buckets[-1].append((name, t))
        size += nbytes
    return [b for b in buckets if b]


@dataclass
class Published:
    manifest: WeightManifest | None
    """None on the ranks that only take part in the gathers (`keep=False`)."""
    peak_bytes: int
    """The most extra memory packing held at once (one bucket's array plus the tensor being copied)."""
    arrays: list[np.ndarray] | None = None
    """With `hold=True`: this process's own copy of every bucket (what patches are made from)."""


def publish_gathered(named: list[tuple[str, object]], version: int, bucket_mb: float = 64.0, gather=None,
                     keep: bool = True, dtype=None, hold: bool = False) -> Published:
    """`publish` for tensors that are materialised one at a time by `gather(t)` (e.g. a sharded
    parameter's `full_tensor()`, a collective every rank runs in the same order): each is copied into
    its bucket's array and dropped before the next is gathered, so the extra memory held is one
    bucket's array plus the tensor being copied (a tensor in a bucket of its own is not copied). With
    `keep=False` (the ranks other than the one that publishes) every gather runs and nothing is packed
    or put. `dtype`: the dtype the weights travel in, by name (the engines' own, e.g. "bfloat16"; None:
    as they are), each tensor cast once here. `hold`: keep this process's copy of every bucket (`Published.arrays`)."""
    import ray

    named = [(name, _Cast(t, dtype)) for name, t in named]
    buckets, arrays, peak = [], [], 0
    for group in plan_buckets(named, int(bucket_mb * 2**20)):
        slots, offset = [], 0
        for name, t in group:
            nbytes = t.numel() * t.element_size()
            slots.append(TensorSlot(name, str(t.dtype), tuple(t.shape), offset, nbytes))
            offset += nbytes
        if len(group) == 1:  # a bucket of one tensor is that tensor's bytes: no second copy
            full = group[0][1].read(gather)
            peak = max(peak, offset) if gather is not None else peak
            flat = _bytes_of(full) if keep else None
            if hold and keep and full is group[0][1].tensor and full.device.type == "cpu":
                flat = flat.copy()  # the trainer updates its tensor in place: hold what was published
        else:
            flat = np.empty(offset, dtype=np.uint8) if keep else None
            for (name, t), slot in zip(group, slots):
                full = t.read(gather)
                if gather is not None:  # a gathered tensor is a copy the caller did not hold before
                    peak = max(peak, (offset if keep else 0) + slot.nbytes)
                if keep:
                    flat[slot.offset:slot.offset + slot.nbytes] = _bytes_of(full)
                del full
            peak = max(peak, offset if keep else 0)
        if keep:
            buckets.append(Bucket(ray.put(flat), offset, zlib.crc32(flat), slots))
            if hold:
                arrays.append(flat)
        del flat
    if not keep:
        return Published(None, peak)
    manifest = WeightManifest(version, fingerprint(dict(named)), version_checksum(b.crc32 for b in buckets), buckets)
    return Published(manifest, peak, arrays if hold else None)


class _Cast:
    """A tensor as it travels: its shape, the wire dtype, and `read(gather)` to materialise it so."""

    def __init__(self, tensor, dtype: str | None):
        import torch

        self.tensor, self.dtype = tensor, getattr(torch, dtype) if dtype is not None else tensor.dtype
        self.shape = tensor.shape
        self._itemsize = self.dtype.itemsize

    def numel(self) -> int:
        return self.tensor.numel()

    def element_size(self) -> int:
        return self._itemsize

    def read(self, gather):
        full = gather(self.tensor) if gather is not None else self.tensor
        return full if full.dtype == self.dtype else full.to(self.dtype)


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


class PullTimeout(WeightError):
    """Objects of a pull did not arrive by its deadline (the message says which)."""


def fetch(refs: list, deadline: float, what: str) -> list:
    """`refs`' objects, fetched into this node's store by `deadline` (`time.monotonic()`), each held (so
    pinned there) while the caller holds it; `PullTimeout` when they did not all arrive in time, `WeightError`
    when one cannot be fetched at all (lost with its node, or its task failed).
    One `ray.get`, never `ray.wait(fetch_local=True)` first: Ray pulls a get's objects as one bundle, admitted
    when the store has room for all of it, and pins each as it lands, where a wait asks for each object on
    its own and pins none. With the store full, objects restored from spill for a wait then push each other
    out again and the wait never ends (ray-project/ray#18415); a patch pull sat so for over 1,000 s, Ray
    restoring 14 GiB for 0.2 GiB of parts (issue 46)."""
    import ray
    from ray.exceptions import GetTimeoutError, RayError

    left = deadline - time.monotonic()
    if left <= 0:
        raise PullTimeout(f"{what}: no time left")
    try:
        return ray.get(refs, timeout=left)
    except GetTimeoutError:
        raise PullTimeout(f"{what} did not arrive in time") from None
    except RayError as e:  # lost with its node, or never made: the caller may have another way
        raise WeightError(f"{what} could not be fetched: {str(e).strip().splitlines()[0]}") from None


def pull(manifest: WeightManifest, expected_fingerprint: str, timeout_s: float) -> PulledWeights:
    """Fetch and verify every bucket; returns the whole version. Raises `WeightError` before anything
    could be loaded if any check fails (`PullTimeout` when the buckets did not all arrive in `timeout_s`)."""
    if manifest.fingerprint != expected_fingerprint:
        raise WeightError(f"version {manifest.version} is for model {manifest.fingerprint}, this worker "
                          f"serves model {expected_fingerprint}")
    try:
        return pull_by(manifest, time.monotonic() + timeout_s)
    except PullTimeout as e:
        raise PullTimeout(f"pull of version {manifest.version} timed out after {timeout_s:g}s ({e})") from None


def pull_by(manifest: WeightManifest, deadline: float) -> PulledWeights:
    """`pull` by `deadline` (`time.monotonic()`), the fingerprint already checked: the end of a pull that
    may have begun another way. `PullTimeout` says how many buckets arrived."""
    refs, sizes = [b.ref for b in manifest.buckets], [b.nbytes for b in manifest.buckets]
    retry_s, arrays, t0 = _ray_pull_retry_s(), [], time.monotonic()
    # A group's buckets are fetched side by side (one at a time measured twice as slow node to node);
    # each group is fetched whole, so no pull is cancelled and asked again
    while len(arrays) < len(refs):
        start = len(arrays)
        end = next_group(sizes, start, window_bytes(sum(sizes[:start]), time.monotonic() - t0, retry_s))
        try:  # held now: the store may not evict them before the end
            arrays.extend(fetch(refs[start:end], deadline, "buckets"))
        except PullTimeout:
            raise PullTimeout(f"{start} of {len(refs)} buckets arrived") from None
    for bucket, flat in zip(manifest.buckets, arrays):
        if flat.nbytes != bucket.nbytes or zlib.crc32(flat) != bucket.crc32:
            raise WeightError(f"version {manifest.version}: a bucket failed its checksum (torn or corrupted)")
    return PulledWeights(manifest, arrays)


IN_TIME_SHARE = 0.5
"""A group of buckets is sized to arrive within this share of Ray's pull timeout (a margin for a rate
that drops, e.g. when more hosts start pulling from the same source)."""


def window_bytes(arrived_bytes: int, elapsed_s: float, retry_s: float) -> float:
    """The bytes to fetch at once so that they arrive within `IN_TIME_SHARE` of `retry_s` (Ray's pull
    timeout) at the rate measured so far (`arrived_bytes` in `elapsed_s`); 0 (one bucket) before any
    bucket arrived."""
    if arrived_bytes <= 0 or elapsed_s <= 0:
        return 0.0
    return arrived_bytes / elapsed_s * retry_s * IN_TIME_SHARE


def next_group(sizes: list[int], start: int, window: float) -> int:
    """The end (exclusive) of the group fetched together from bucket `start`: the buckets that fit in
    `window` bytes, at least one."""
    end, total = start + 1, sizes[start]
    while end < len(sizes) and total + sizes[end] <= window:
        total += sizes[end]
        end += 1
    return end


RAY_PULL_TIMEOUT_S = 10.0
"""Ray's default `object_manager_pull_timeout_ms`, for a Ray that does not say its own."""


def _ray_pull_retry_s() -> float:
    """Ray's `object_manager_pull_timeout_ms` as this process's Ray runs with it, in seconds (a private
    API: where it is gone, Ray's default)."""
    try:
        from ray._raylet import Config

        return Config.object_manager_pull_timeout_ms() / 1000
    except (ImportError, AttributeError):
        return RAY_PULL_TIMEOUT_S


def _bytes_of(t) -> np.ndarray:
    import torch

    return t.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy()


__all__ = ["Bucket", "Published", "PullTimeout", "PulledWeights", "TensorSlot", "WeightError", "WeightManifest",
           "WeightsConfig", "fetch", "fingerprint", "next_group", "plan_buckets", "publish", "publish_gathered", "pull",
           "pull_by", "version_checksum", "window_bytes"]
