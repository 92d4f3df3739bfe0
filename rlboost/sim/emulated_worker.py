"""A light rollout worker for emulated instances: a Ray actor that never imports torch.

Contract: `EmulatedWorker` has RolloutWorker's interface and behaviour (rlboost/hybrid/worker.py:
`info`, `ping`, `submit`, `abort`, `pull`, `spec_stats`, `stream`, the ledger), around an
`EmulatedEngine`. What it leaves out is what a process importing torch costs: no model skeleton
(its architecture fingerprint comes from the driver, which builds the skeleton once), and `pull`
fetches every bucket of the version from the object store and verifies its size and CRC-32, then
serves the version without turning the bytes into tensors. Pulls, checksums, refusals and retries
therefore run for real. A RolloutWorker process of the tiny test model holds about 290 MB of private
memory (torch and transformers), this one about 50 MB (Ray and numpy): 64 instances fit in 4 GB.

The Fleet starts it instead of a RolloutWorker when `WorkerSpec.emulate.worker == "light"`
(`light_worker`). The manager sends it SamplingParams (torch-free) and WeightManifests; unpickling a
WeightManifest imports its module, hence torch. `torch_free_wire()` registers a Ray serializer on the
driver that ships it as the attribute-compatible `LightManifest` instead; without it a light worker
still works, only heavier.
"""

from __future__ import annotations

import os
import threading
import time
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import ray

from rlboost.engine.sequence import PartialOutput, StreamChunk
from rlboost.sim.emulated import EmulatedEngine, EmulationConfig, SpecCounters


@dataclass
class LightSpec:
    """What a light worker needs (WorkerSpec without the model and engine configs)."""

    emulate: EmulationConfig
    fingerprint: str
    """The architecture fingerprint of the model the run serves (`weights.fingerprint`)."""
    eos_token_ids: list[int] = field(default_factory=list)
    heartbeat_interval_s: float = 1.0
    ledger_path: str | None = None
    pull_delay_s: float = 0.0


# ---- field for field RolloutWorker's WorkerReport, WorkerInfo and PullResult (the manager reads attributes)

@dataclass
class Report:
    chunks: list[StreamChunk]
    running: int
    waiting: int
    generated: dict[str, int] = field(default_factory=dict)
    batch_size: int = 0
    step_s: float = 0.0


@dataclass
class Info:
    pid: int
    node_id: str
    max_running: int
    version: int
    fingerprint: str
    checksum: str


@dataclass
class Pulled:
    version: int
    checksum: str
    nbytes: int
    seconds: float


@dataclass
class LightManifest:
    """What a WeightManifest becomes on its way to a light worker: the buckets' refs, sizes and CRCs."""

    version: int
    fingerprint: str
    checksum: str
    buckets: list[tuple[object, int, int]]
    """(ObjectRef, bytes, CRC-32) per bucket."""

    @property
    def nbytes(self) -> int:
        return sum(n for _, n, _ in self.buckets)


class PullError(RuntimeError):
    """A version that must not be served: another model, torn or corrupted bytes, or a timeout."""


class EmulatedWorker:
    """See the module docstring; wrapped as a Ray actor by `light_worker`."""

    def __init__(self, spec: LightSpec):
        self.spec = spec
        self.fingerprint = spec.fingerprint
        self.checksum = ""
        self._served: list = []
        self.engine = EmulatedEngine(spec.emulate, spec.eos_token_ids, weight_version=-1)
        self._cv = threading.Condition()
        self._ledger = open(spec.ledger_path, "a") if spec.ledger_path else None

    def info(self) -> Info:
        node = ray.get_runtime_context().get_node_id() if ray.is_initialized() else ""
        return Info(os.getpid(), node, self.engine.config.max_num_seqs, self.engine.weight_version,
                    self.fingerprint, self.checksum)

    def ping(self) -> int:
        return os.getpid()

    # ---- control calls (as RolloutWorker's) ------------------------------------------------------------

    def submit(self, requests: list[tuple[str, list[int], object, int]], histories=None) -> None:
        with self._cv:
            self.engine.wake()
            for request_id, token_ids, params, prompt_len in requests:
                self.engine.add(request_id, token_ids, params, prompt_len=prompt_len)
            self._cv.notify_all()

    def spec_stats(self) -> SpecCounters:
        with self._cv:
            stats, self.engine.spec_stats = self.engine.spec_stats, SpecCounters()
            return stats

    def abort(self, request_ids: list[str], then_sleep: bool = False) -> dict[str, PartialOutput]:
        with self._cv:
            partials = self.engine.abort(request_ids)
            if then_sleep and not self.engine.has_unfinished():
                self.engine.sleep()
            return partials

    def pull(self, manifest, timeout_s: float) -> Pulled:
        """Fetch every bucket, check its size and CRC-32, and only then serve the version; the bytes
        are held (as a RolloutWorker holds its tensors) so that later joiners can fetch from here."""
        t0 = time.perf_counter()
        if self.spec.pull_delay_s:
            time.sleep(self.spec.pull_delay_s)
        if manifest.fingerprint != self.fingerprint:
            raise PullError(f"version {manifest.version} is for model {manifest.fingerprint}, this worker "
                            f"serves model {self.fingerprint}")
        buckets = [(b.ref, b.nbytes, b.crc32) if hasattr(b, "ref") else b for b in manifest.buckets]
        refs = [ref for ref, _, _ in buckets]
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=timeout_s)
        if len(ready) < len(refs):
            raise PullError(f"pull of version {manifest.version} timed out after {timeout_s}s "
                            f"({len(ready)} of {len(refs)} buckets arrived)")
        arrays = ray.get(refs)
        for (_, nbytes, crc), flat in zip(buckets, arrays):
            if flat.nbytes != nbytes or zlib.crc32(flat) != crc:
                raise PullError(f"version {manifest.version}: a bucket failed its checksum (torn or corrupted)")
        with self._cv:
            self.engine.load_weights(None, manifest.version)
            self.checksum = manifest.checksum
            self._served = arrays
        return Pulled(manifest.version, manifest.checksum, sum(n for _, n, _ in buckets), time.perf_counter() - t0)

    # ---- the stream (as RolloutWorker.stream) ------------------------------------------------------

    def stream(self) -> Iterator[Report]:
        last_report = time.monotonic()
        while True:
            with self._cv:
                if self.engine.asleep or not self.engine.has_unfinished():
                    self._cv.wait(timeout=self.spec.heartbeat_interval_s)
                    report = None if self.engine.has_unfinished() and not self.engine.asleep else self._report([])
                else:
                    t0 = time.perf_counter()
                    chunks = self.engine.step()
                    step_s = (time.perf_counter() - t0) / self.engine.last_decode_steps  # per decode step
                    batch_size, was_prefill = self.engine.last_step
                    decoding = 0 if was_prefill else batch_size
                    self._write_ledger(chunks)
                    due = time.monotonic() - last_report >= self.spec.heartbeat_interval_s
                    report = self._report(chunks, decoding, step_s) if chunks or due else None
            if report is not None:
                last_report = time.monotonic()
                yield report

    def _report(self, chunks: list[StreamChunk], batch_size: int = 0, step_s: float = 0.0) -> Report:
        return Report(chunks, self.engine.num_running, self.engine.num_waiting, self.engine.progress(),
                      batch_size, step_s)

    def _write_ledger(self, chunks: list[StreamChunk]) -> None:
        if self._ledger is not None:
            counts = self.engine.progress() | {c.request_id: c.offset + len(c.token_ids) for c in chunks if c.finished}
            self._ledger.write(" ".join(f"{rid}={n}" for rid, n in counts.items()) + "\n")
            self._ledger.flush()


EmulatedWorkerActor = ray.remote(EmulatedWorker)
_fingerprints: dict[str, str] = {}


def light_worker(spec) -> tuple[object, LightSpec]:
    """For the Fleet: the actor class and the spec of a light worker standing in for the RolloutWorker
    of `spec` (a WorkerSpec with `emulate` set). Runs on the driver: it builds the model's skeleton
    once per model to learn the architecture fingerprint the worker will report."""
    key = repr(spec.model)
    if key not in _fingerprints:
        from rlboost.hybrid import weights as weight_store
        from rlboost.models.loading import load_skeleton

        _fingerprints[key] = weight_store.fingerprint(dict(load_skeleton(spec.model).named_parameters()))
    light = LightSpec(spec.emulate, _fingerprints[key], list(spec.eos_token_ids), spec.heartbeat_interval_s,
                      spec.ledger_path, spec.pull_delay_s)
    return EmulatedWorkerActor, light


# ---- the torch-free wire ---------------------------------------------------------------------------

def light_manifest(fields: tuple) -> LightManifest:
    return LightManifest(*fields)


def _manifest_fields(m) -> tuple:
    return (m.version, m.fingerprint, m.checksum, [(b.ref, b.nbytes, b.crc32) for b in m.buckets])


@contextmanager
def torch_free_wire():
    """While active, this process sends every WeightManifest as a LightManifest (a Ray custom
    serializer), so light workers unpickle nothing that imports torch.
    Process-wide: only for runs whose workers are all light (a RolloutWorker cannot load a
    LightManifest)."""
    from rlboost.hybrid.weights import WeightManifest

    ray.util.register_serializer(WeightManifest, serializer=_manifest_fields, deserializer=light_manifest)
    try:
        yield
    finally:
        ray.util.deregister_serializer(WeightManifest)


__all__ = ["EmulatedWorker", "EmulatedWorkerActor", "LightManifest", "LightSpec", "PullError", "light_worker",
           "torch_free_wire"]
