"""What crosses the wire between the rollout manager and its workers, as torch-free, Ray-free types.

Contract: plain dataclasses of ints, floats, strings and lists. Unpickling any of them imports nothing
heavier than this module and the engine's output types (`rlboost.engine.sequence`), so a worker
process whose engine needs no torch never loads it.

- `WorkerReport`: what a worker streams: the chunks of one or more engine steps and its load.
- `WorkerInfo`: what a new worker says about itself (pid, node, GPUs, capacity, weights it serves).

The weight manifests and pull results they exchange too are the cluster layer's
(`rlboost.cluster.manifest`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rlboost.engine.sequence import ChunkColumns


@dataclass
class WorkerReport:
    """New chunks and the worker's load, after one or more engine steps (or a heartbeat)."""

    chunks: ChunkColumns
    """In the order the engine made them; iterating gives `StreamChunk`s."""
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

    def __reduce__(self):
        # positional fields, as StreamChunk's: the manager unpickles a few hundred reports a second (at
        # 256 instances Ray's deserialising of the relay's batches was a third of its loop's CPU)
        return WorkerReport, (self.chunks, self.running, self.waiting, self.generated, self.batch_size, self.step_s,
                              self.steps)


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
    visible_gpus: str | None = None
    """Its CUDA_VISIBLE_DEVICES, as Ray set it for the GPUs it owns (None: unset, it owns none)."""
    kv_tokens: int | None = None
    """Its engine's KV cache in tokens, where that binds before max_running (`EngineBackend.kv_capacity_tokens`)."""


__all__ = ["WorkerInfo", "WorkerReport"]
