"""A rollout worker's own copy of the version it serves, in the wire dtype: what a patch is applied to.

Contract: `HostCopy(load_base).pull(manifest, fingerprint, timeout_s)` -> `Reached` (the verified
version as `PulledWeights`, the names of the parameters that differ from the version served before,
or None for "all", and a `PullResult` saying how it got there). Every transport that can reach the
version from what the copy holds makes an offer (`rlboost.cluster.transports`: `patch`, `from_base`,
`full`); `rlboost.policies.weight_routes.routes` orders them and they are tried in that order, all
within the one limit `timeout_s`: a route that proves unusable (a torn patch, another base on disk)
hands over to the next and its reason goes in `PullResult.note`; a timeout ends the pull, in one line,
by the limit (no later route could finish in the time that is left). The result is bit for bit a full
pull's whichever route reached it.
With `manifest.patching` the copy keeps a writable copy of what it reached (one more model in host
memory) and a record of which version it is (`Held`: no reference into the object store, so the store
frees a version once the fleet has moved on, however long a worker serves it); otherwise none, and the
next pull is full. It also keeps what it fetched (buckets or patch parts) until the next pull, so this
node's object store can serve them to peers.
Buckets are packed, patched and checksummed on a few threads (`_THREADS`): numpy, zstd, zlib and
torch's casts release the GIL, and a join waits on these seconds. Torch is imported only to read the
base model.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from rlboost.cluster.manifest import PullResult, WeightManifest
from rlboost.cluster.transports import TRANSPORTS, Held, Reached, Unusable
from rlboost.cluster.weights import PulledWeights, PullTimeout, WeightError
from rlboost.models.config import ModelConfig
from rlboost.policies.weight_routes import routes

_THREADS = min(4, os.cpu_count() or 1)
"""Threads that pack, patch and checksum buckets side by side (more gain little: memory bandwidth)."""


class HostCopy:
    def __init__(self, load_base: Callable[[], Mapping[str, object]] | None = None):
        self.load_base = load_base
        """Reads the run's base model (name -> tensor) from this instance's disk; None: never join from it."""
        self.held: Held | None = None
        """The version `arrays` hold (None: nothing a patch could build on)."""
        self.arrays: list[np.ndarray] | None = None
        self.fetched: list = []
        """What the last pull fetched: kept so this node's object store can serve it to peers."""

    def pull(self, m: WeightManifest, fingerprint: str, timeout_s: float) -> Reached:
        if m.fingerprint != fingerprint:
            raise WeightError(f"version {m.version} is for model {m.fingerprint}, this worker serves model {fingerprint}")
        t0, deadline, notes = time.perf_counter(), time.monotonic() + timeout_s, []
        offers = routes(o for t in TRANSPORTS.values() if (o := t.offer(m, self)) is not None)
        for offer in offers:
            try:
                reached = TRANSPORTS[offer.mode].reach(m, self, deadline)
            except Unusable as e:
                notes.append(str(e))
                continue
            except PullTimeout as e:
                self.forget()
                raise PullTimeout(f"pull of version {m.version} timed out after {timeout_s:g}s by {offer.mode} ({e})"
                                  ) from None
            reached.result.seconds = time.perf_counter() - t0
            reached.result.note = "; ".join(notes)
            return reached
        raise WeightError(f"version {m.version}: no route reached it ({'; '.join(notes) or 'none on offer'})")

    def keep(self, m: WeightManifest, changed: set[str] | None, result: PullResult) -> Reached:
        """`arrays` hold `m` now (verified): what the pull returns, and what the next patch builds on when
        the publisher offers patches."""
        weights = PulledWeights(m, self.arrays)
        if m.patching:
            self.held = Held.of(m)
        else:
            self.held, self.arrays = None, None
        return Reached(weights, changed, result)

    def forget(self) -> None:
        """Nothing to build on any more (a route failed half way, or the engine refused the version)."""
        self.held, self.arrays = None, None


def run_threads(fn, *iterables) -> list:
    """`list(map(fn, *iterables))` on `_THREADS` threads (the first error raised, as `map` would)."""
    with ThreadPoolExecutor(_THREADS, thread_name_prefix="host-copy") as pool:
        return list(pool.map(fn, *iterables))


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

    return run_threads(packed, m.buckets)


def base_reader(model: ModelConfig) -> Callable[[], dict]:
    """Reads `model` (the run's `model.path`) from this machine's disk, in `model.dtype`. `pack` casts it
    as the trainer's weights are cast; a worker reads it in the dtype it serves, the one weights travel
    in, so nothing is cast twice: a model loaded in bf16 has the bits of the fp32 one cast to bf16 (de-
    quantized GGUF and tiny models alike; the checksum refuses a base where that would not hold)."""

    def read() -> dict:
        from rlboost.models import load_model

        return dict(load_model(model).model.named_parameters())

    return read


__all__ = ["HostCopy", "Reached", "base_reader", "pack", "run_threads"]
