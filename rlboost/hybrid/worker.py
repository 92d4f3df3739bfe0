"""A rollout worker: one engine in its own process (a Ray actor), on a reserved or preemptible resource.

Contract (docs/hybrid.md, "The code"):
- The engine is built in the worker's process by `spec.engine_factory(spec)`: any
  `rlboost.engine.protocol.EngineBackend`. The default is the engine `engine.backend` names, with no
  trained weights until the first pull (`configured_engine`); the emulated engine of
  `rlboost.sim.emulated` plugs in the same way.
  This module imports neither torch nor Ray: a worker whose engine needs no torch never loads it.
- `stream()` is a streaming generator the manager reads for the worker's whole life. A report leaves
  the moment a request has a full chunk (`stream_interval` tokens), carrying every other request's
  tokens too (`engine.flush()`): the requests stay in step, so the next report is due
  `stream_interval` decode steps later whatever the batch, not after every engine step. A hard kill
  thus loses at most `stream_interval` tokens per request that were never sent, plus the reports Ray
  was still carrying (a streaming generator's items that arrive after its task failed are dropped):
  the manager's report relay starts the stream with Ray's backpressure, so a `yield` blocks while
  `max_unacked_reports` reports are not yet taken by the relay, and the engine does not step
  meanwhile (invariant 4: at most (max_unacked_reports + 1) x stream_interval per request).
  A report holding only finished requests' last chunks (which never grow) may wait for the next one,
  up to `report_delay_s`. An idle worker still reports every `heartbeat_interval_s`.
- `submit`, `abort`, `siblings` and `pull` are control calls, run between engine steps (they take the
  engine lock). `abort` returns each request's exact partial output. `siblings` hands the drafter
  tokens of samples of its requests' groups that run on other workers (HistoSpec across instances,
  `rlboost.hybrid.sibling_relay`); it never changes what is generated, only what is drafted.
- A worker starts with its model's architecture and no trained weights (version -1); `pull` reaches a
  published version (in full, by a patch from the version it serves, or from the base model on its
  disk: `rlboost.cluster.host_copy`), verifies every bucket and only then swaps it in (invariant 5); a
  patched version swaps in only the parameters whose bits changed. With `stage` (bounded staleness)
  a worker whose engine is busy keeps the verified version staged and goes on generating on the one it
  serves; the staged version swaps in as soon as the engine holds no request (after an `abort` that
  empties it, or before a `submit` to an idle engine), never in the middle of a token. Every token
  carries the version that made it (`StreamChunk.weight_version`).
- The worker knows nothing of samples, steps or fencing: the manager decides what its reports mean.
"""

from __future__ import annotations

import dataclasses
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from rlboost.cluster.host_copy import HostCopy, base_reader
from rlboost.cluster.manifest import PullResult, WeightManifest
from rlboost.cluster.weights import PulledWeights
from rlboost.engine.config import EngineConfig
from rlboost.engine.factory import make_engine
from rlboost.engine.protocol import EngineBackend, SpecStats
from rlboost.engine.sampling_params import SamplingParams
from rlboost.engine.sequence import ChunkColumns, PartialOutput, StreamChunk
from rlboost.histospec import HistoryStore, make_drafter
from rlboost.histospec.config import HistoSpecConfig
from rlboost.hybrid.token_ledger import TokenLedger
from rlboost.hybrid.wire import WorkerInfo, WorkerReport
from rlboost.models.config import ModelConfig


@dataclass
class WorkerSpec:
    """Everything a worker process needs to build its engine."""

    model: ModelConfig
    engine: EngineConfig
    eos_token_ids: list[int]
    num_threads: int = 1
    heartbeat_interval_s: float = 1.0
    histospec: HistoSpecConfig | None = None
    """Speculate from the history of each prompt, which the manager sends along with its requests."""
    ledger_path: str | None = None
    """Append the tokens of every request generated and sent here (`rlboost.hybrid.token_ledger`), so
    the manager and the tests can count exactly what a hard kill lost (rollout.hybrid.ledger_dir)."""
    engine_factory: Callable[[WorkerSpec], EngineBackend] | None = None
    """Builds the engine in the worker's process (a module-level callable or a picklable object).
    None: `configured_engine`, the engine `engine.backend` names (rlboost's own, or vLLM)."""
    report_delay_s: float = 0.0
    """How long a report holding only finished requests' last chunks may wait for the next report
    (rollout.hybrid.report_delay_s): fewer reports for the manager to handle, at no risk of waste."""
    join_from_base: bool = False
    """Read the base model (`model.path`) from this machine's disk to reach the first version from it
    with a patch (cluster.weights.join_from_base), where the version offers one."""


def configured_engine(spec: WorkerSpec) -> EngineBackend:
    """The default engine: the one `spec.engine.backend` names (`rlboost.engine.factory`), on the worker's
    share of threads, serving no trained weights (version -1) until the first pull, verifying drafts of
    HistoSpec's longest when `spec.histospec` is set."""
    spec.engine.check_histospec(spec.histospec is not None, spec.histospec.drafter if spec.histospec else "ngram")
    return make_engine(spec.model, spec.engine, spec.eos_token_ids, weights=None, version=-1,
                       num_threads=spec.num_threads, draft_tokens=spec.histospec.max_draft if spec.histospec else 0)


@dataclass
class _Staged:
    version: int
    checksum: str
    weights: object
    """The whole verified version (`PulledWeights`), bytes of its own."""
    names: set[str] | None
    """The parameters that differ from the version the engine serves (None: all)."""


class RolloutWorker:
    """Wrapped as a Ray actor by the fleet; usable directly in-process too."""

    def __init__(self, spec: WorkerSpec):
        self.engine = (spec.engine_factory or configured_engine)(spec)
        self.fingerprint = self.engine.fingerprint
        self.checksum = ""
        serving = dataclasses.replace(spec.model, dtype=spec.engine.serving_dtype(spec.model.dtype))
        self.host = HostCopy(base_reader(serving) if spec.join_from_base else None)
        """The version served, as bytes patches apply to; it keeps what it fetched for peers to fetch."""
        self.history = None
        if spec.histospec is not None:
            self.history = HistoryStore(spec.histospec.history_max_tokens)
            self.engine.drafter = make_drafter(self.history, spec.histospec)
        self.spec = spec
        self.staged: _Staged | None = None
        """A verified version waiting for the engine to be idle (`pull(stage=True)`)."""
        self._cv = threading.Condition()
        self._ledger = TokenLedger(spec.ledger_path) if spec.ledger_path else None

    def info(self) -> WorkerInfo:
        import ray  # only the actor needs Ray; the class itself runs without it

        node = ray.get_runtime_context().get_node_id() if ray.is_initialized() else ""
        return WorkerInfo(os.getpid(), node, self.engine.config.max_num_seqs, self.engine.weight_version,
                          self.fingerprint, self.checksum, os.environ.get("CUDA_VISIBLE_DEVICES"),
                          self.engine.kv_capacity_tokens)

    def ping(self) -> int:
        """Liveness: answered by a free actor thread even while the engine is in a long step."""
        return os.getpid()

    # ---- control calls ---------------------------------------------------------------------------

    def submit(self, requests: list[tuple[str, list[int], SamplingParams, int]],
               histories: list[tuple[list[int], list[list[int]]]] | None = None) -> None:
        """requests: (request id, prompt + tokens so far, params, length of the original prompt).
        histories: (prompt, its responses in the latest rollout), to draft from (HistoSpec)."""
        with self._cv:
            if histories and self.history is not None:
                for prompt_ids, responses in histories:
                    self.history.update(prompt_ids, responses)
                self.engine.drafter.invalidate(prompt_ids for prompt_ids, _ in histories)
            self.engine.wake()  # work for a sleeping reserved worker means it is rollout's turn again
            if not self.engine.has_unfinished():
                self._swap_staged()
            for request_id, token_ids, params, prompt_len in requests:
                self.engine.add(request_id, token_ids, params, prompt_len=prompt_len)
            self._cv.notify_all()

    def siblings(self, forwards: list[tuple[str, str, int, list[int]]]) -> int:
        """forwards: (request id here, the sibling's key, offset in the sibling's response, its tokens
        from there), for the request's group in the drafter (`SuffixDrafter.add_sibling`). Returns how
        many tokens were new (counted in `spec_stats().sibling_tokens`)."""
        with self._cv:
            if self.engine.drafter is None:
                return 0
            taken = sum(self.engine.drafter.add_sibling(*forward) for forward in forwards)
            self.engine.spec_stats.sibling_tokens += taken
            return taken

    def spec_stats(self) -> SpecStats:
        """The speculation counters since the last call (HistoSpec), reset."""
        with self._cv:
            stats, self.engine.spec_stats = self.engine.spec_stats, SpecStats()
            return stats

    def abort(self, request_ids: list[str], then_sleep: bool = False,
              then_load: int | None = None) -> dict[str, PartialOutput]:
        """Partial outputs of the requests still running (finished ones already streamed their last
        chunk). Once the engine is idle, a staged version swaps in (`then_load`: the version the manager
        expects, a refresh's; the staged one is what is verified) and `then_sleep` frees the KV cache."""
        with self._cv:
            partials = self.engine.abort(request_ids)
            if not self.engine.has_unfinished():
                self._swap_staged()
                if then_sleep:
                    self.engine.sleep()
            return partials

    def pull(self, manifest: WeightManifest, timeout_s: float, stage: bool = False) -> PullResult:
        """Fetch, verify and load a published version. The fetch runs outside the engine lock; the swap
        happens only once every bucket passed its checksum, so a failure leaves the old weights. With
        `stage`, an engine busy with requests keeps generating on the version it serves and the new one
        waits, staged, for it to be idle (the module docstring)."""
        t0 = time.perf_counter()
        reached = self.host.pull(manifest, self.fingerprint, timeout_s)
        with self._cv:
            names = self._changed_since_served(reached.changed)
            if stage and self.engine.has_unfinished():
                # the host copy is patched in place by the next pull: a staged version needs bytes of its own
                weights = reached.weights if self.host.arrays is None else \
                    PulledWeights(manifest, [a.copy() for a in reached.weights.arrays])
                self.staged = _Staged(manifest.version, manifest.checksum, weights, names)
            else:
                self.staged = None
                self._load(manifest.version, manifest.checksum, reached.weights, names)
        result = reached.result
        result.seconds = time.perf_counter() - t0
        return result

    def _changed_since_served(self, changed) -> set[str] | None:
        """The parameters that differ from the version the engine serves: this pull's changes (from the
        version the host copy held) and a staged version's (None: all)."""
        if changed is None:
            return None
        if self.staged is None:
            return set(changed)
        return None if self.staged.names is None else set(changed) | self.staged.names

    def _load(self, version: int, checksum: str, weights, names) -> None:
        try:
            # a patched version names what changed: the engine copies only those parameters
            self.engine.load_weights(weights, version, names=names)
        except BaseException:
            self.host.forget()  # the engine keeps the version before: the next patch must not build on this one
            raise
        self.checksum = checksum

    def _swap_staged(self) -> None:
        """Load the staged version (the caller holds the lock and the engine is idle)."""
        staged, self.staged = self.staged, None
        if staged is not None:
            self._load(staged.version, staged.checksum, staged.weights, staged.names)

    # ---- the stream ------------------------------------------------------------------------------

    def stream(self) -> Iterator[WorkerReport]:
        held: list[StreamChunk] = []  # finished requests' last chunks, waiting for the next report
        held_since = last_report = time.monotonic()
        steps, batch_size, step_s = 0, 0, 0.0
        while True:
            report = None
            with self._cv:
                if self.engine.asleep or not self.engine.has_unfinished():
                    if not held:
                        self._cv.wait(timeout=self.spec.heartbeat_interval_s)
                    if held or self.engine.asleep or not self.engine.has_unfinished():
                        report = self._report(held, batch_size, step_s, steps)
                else:
                    t0 = time.perf_counter()
                    chunks = self.engine.step()
                    steps += 1
                    batch, was_prefill = self.engine.last_step
                    if batch and not was_prefill:
                        # per decode step: an engine's step() may span several (the emulated one's does)
                        batch_size, step_s = batch, (time.perf_counter() - t0) / max(self.engine.last_decode_steps, 1)
                    self._write_ledger(chunks)
                    now = time.monotonic()
                    if chunks and not held:
                        held_since = now
                    held += chunks
                    # a request's unchunked tokens never exceed stream_interval: a full chunk goes at once
                    full = any(not c.finished for c in chunks)
                    if (full or now - last_report >= self.spec.heartbeat_interval_s
                            or (held and now - held_since >= self.spec.report_delay_s)):
                        report = self._report(held + (self.engine.flush() if held else []), batch_size, step_s, steps)
            if report is not None:
                held, steps, batch_size, step_s = [], 0, 0, 0.0
                if self._ledger is not None:  # before the yield, which may wait for the manager
                    self._ledger.sent(report.chunks.ends())
                yield report
                last_report = time.monotonic()

    def _report(self, chunks: list[StreamChunk], batch_size: int, step_s: float, steps: int) -> WorkerReport:
        return WorkerReport(ChunkColumns.of(chunks), self.engine.num_running, self.engine.num_waiting,
                            self.engine.progress(), batch_size, step_s, steps)

    def _write_ledger(self, chunks: list[StreamChunk]) -> None:
        """Record the tokens each request has generated, after an engine step."""
        if self._ledger is None:
            return
        # requests that finished in this step have left progress(); their last chunk has the count
        self._ledger.generated(self.engine.progress()
                               | {c.request_id: c.offset + len(c.token_ids) for c in chunks if c.finished})
