"""What crosses the wire between the rollout manager and its workers, as torch-free, Ray-free types.

Contract: plain dataclasses of ints, floats, strings, lists and (for the buckets) opaque object-store
references. Unpickling any of them imports nothing heavier than this module and the engine's output
types (`rlboost.engine.sequence`), so a worker process whose engine needs no torch never loads it.

- `WorkerReport`: what a worker streams: the chunks of one or more engine steps and its load.
- `WorkerInfo`: what a new worker says about itself (pid, node, capacity, weights it serves).
- `WeightManifest` / `Bucket` / `TensorSlot`: one published weight version (DESIGN.md 2.5): where its
  checksummed buckets are and which tensors each holds.
- `PullResult`: what a verified pull reports back.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass, field

from rlboost.engine.sequence import StreamChunk


@dataclass
class WorkerReport:
    """New chunks and the worker's load, after one or more engine steps (or a heartbeat)."""

    chunks: list[StreamChunk]
    running: int
    waiting: int
    generated: dict[str, int] = field(default_factory=dict)
    """Tokens generated so far by each unfinished request, streamed or not."""
    batch_size: int = 0
    """Requests in the last decode step reported (0: a heartbeat, or only prefills)."""
    step_s: float = 0.0
    """Duration of one decode step at that batch size."""
    steps: int = 0
    """Engine steps the report covers."""


@dataclass
class WorkerInfo:
    pid: int
    node_id: str
    max_running: int
    version: int
    fingerprint: str
    """Architecture of the model it serves (`rlboost.engine.protocol.weights_fingerprint`)."""
    checksum: str
    """Checksum of the version it serves ("" before its first pull)."""


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


__all__ = ["Bucket", "PullResult", "TensorSlot", "WeightManifest", "WorkerInfo", "WorkerReport", "version_checksum"]
