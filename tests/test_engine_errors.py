"""Bad input gets a clear error naming the request; the other requests are unaffected."""

import pytest
import torch

from rlboost.engine import EngineConfig, EngineStateError, InvalidRequestError, LLMEngine, SamplingParams

from conftest import make_engine, random_prompts

BAD_REQUESTS = [
    (list(range(3, 60)), SamplingParams(), "prompt has 57 tokens but the context is 50"),
    ([5, 256, 7], SamplingParams(), "token id 256 at prompt position 1 is outside the vocabulary"),
    ([5, -1], SamplingParams(), "token id -1 at prompt position 1"),
    ([5, 2.5], SamplingParams(), "prompt_token_ids must be integers"),
    ([], SamplingParams(), "empty prompt"),
    ([5, 6], SamplingParams(temperature=-1), "temperature must be"),
    ([5, 6], SamplingParams(temperature=float("nan")), "temperature must be"),
    ([5, 6], SamplingParams(top_p=0.0), "top_p must be in (0, 1]"),
    ([5, 6], SamplingParams(top_k=-2), "top_k must be"),
    ([5, 6], SamplingParams(max_tokens=0), "max_tokens must be"),
]


@pytest.mark.parametrize("prompt,params,message", BAD_REQUESTS, ids=[m for _, _, m in BAD_REQUESTS])
def test_bad_request_rejected_others_unaffected(prompt, params, message):
    good = random_prompts([6, 9], seed=1)
    greedy = SamplingParams(temperature=0, max_tokens=12)
    reference = make_engine("llama", max_model_len=50).generate(good, greedy)

    engine = make_engine("llama", max_model_len=50)
    engine.add("good-0", good[0], greedy)
    engine.step()
    with pytest.raises(InvalidRequestError) as err:
        engine.add("bad", prompt, params)
    assert "request 'bad'" in str(err.value) and message in str(err.value)
    engine.add("good-1", good[1], greedy)
    outputs = {"good-0": [], "good-1": []}
    while engine.has_unfinished():
        for chunk in engine.step():
            outputs[chunk.request_id] += chunk.token_ids
    assert [outputs["good-0"], outputs["good-1"]] == [r.token_ids for r in reference]


def test_duplicate_active_id_rejected():
    engine = make_engine("qwen2")
    engine.add("a", [5, 6], SamplingParams(max_tokens=4))
    with pytest.raises(InvalidRequestError, match="already in the engine"):
        engine.add("a", [7, 8], SamplingParams(max_tokens=4))


def test_invalid_engine_config():
    with pytest.raises(ValueError, match="stream_interval must be >= 1"):
        make_engine("llama", stream_interval=0)
    with pytest.raises(ValueError, match="engine.cpu_linear must be one of onednn, torch"):
        make_engine("llama", cpu_linear="mkl")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA is not available"):
            make_engine("llama", device="cuda")


def test_unsupported_model_type():
    from transformers import GPT2Config, GPT2LMHeadModel

    model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=64))
    with pytest.raises(ValueError, match="model type 'gpt2' is not supported"):
        LLMEngine(model, EngineConfig(device="cpu"))


def test_generate_refuses_a_busy_engine():
    engine = make_engine("qwen3")
    engine.add("a", [5, 6], SamplingParams(max_tokens=4))
    with pytest.raises(EngineStateError, match="idle engine"):
        engine.generate([[7, 8]])


@pytest.mark.parametrize("fail_at_step", [0, 3], ids=["prefill", "decode"])
def test_failed_step_loses_nothing(fail_at_step):
    """A forward pass that raises (e.g. out of memory) leaves the engine consistent: retrying the
    step yields exactly the outputs of a run that never failed."""
    prompts = random_prompts([5, 11, 7], seed=6)
    params = SamplingParams(temperature=1.0, max_tokens=10, seed=3)
    reference = make_engine("qwen3").generate(prompts, params)
    engine = make_engine("qwen3")
    for i, p in enumerate(prompts):
        engine.add(f"r{i}", p, params)
    real_forward, calls = engine.runner.forward, []

    def flaky_forward(*args, **kwargs):
        calls.append(1)
        if len(calls) == fail_at_step + 1:
            raise RuntimeError("simulated out of memory")
        return real_forward(*args, **kwargs)

    engine.runner.forward = flaky_forward
    outputs = {f"r{i}": [] for i in range(3)}
    failures = 0
    while engine.has_unfinished():
        try:
            chunks = engine.step()
        except RuntimeError as e:
            assert "simulated" in str(e)
            failures += 1
            continue
        for c in chunks:
            outputs[c.request_id] += c.token_ids
    assert failures == 1
    assert [outputs[f"r{i}"] for i in range(3)] == [r.token_ids for r in reference]


def test_invalid_backend_fields_are_named():
    from rlboost.engine.config import EngineConfig as Config

    for fields, message in [({"backend": "sglang"}, "engine.backend must be one of rlboost, vllm"),
                            ({"vllm_tensor_parallel_size": 0}, "engine.vllm_tensor_parallel_size must be >= 1"),
                            ({"vllm_gpu_memory_utilization": 1.5}, "engine.vllm_gpu_memory_utilization must be in"),
                            ({"vllm_cpu_kv_cache_gib": 0.5}, "engine.vllm_cpu_kv_cache_gib must be an integer")]:
        with pytest.raises(ValueError, match=message):
            Config(**fields).validate()


def test_vllm_backend_refuses_an_engine_core_in_another_process(monkeypatch):
    """Abort's exactness rests on reading every step's output in the worker's process."""
    from rlboost.engine.vllm_backend import VllmEngine

    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "1")
    with pytest.raises(ValueError, match="unset VLLM_ENABLE_V1_MULTIPROCESSING"):
        VllmEngine("unused", EngineConfig(backend="vllm"))
