"""load_weights swaps weights in place with a version tag; sleep/wake free and restore the KV cache."""

import pytest
import torch

from rlboost.engine import EngineStateError, SamplingParams

from conftest import hf_greedy, make_engine, random_prompts
from rlboost.models import tiny_model

GREEDY = SamplingParams(temperature=0, max_tokens=16)


def test_load_weights_switches_model_and_version(family):
    engine = make_engine(family, seed=0)
    prompts = random_prompts([5, 13], seed=2)
    before = engine.generate(prompts, GREEDY)
    new = tiny_model(family, seed=9)
    engine.load_weights(new.state_dict(), version=3)
    assert engine.weight_version == 3
    after = engine.generate(prompts, GREEDY)
    assert [o.token_ids for o in after] == [hf_greedy(new, p, 16) for p in prompts]
    assert [o.token_ids for o in after] != [o.token_ids for o in before]
    engine.add("v", prompts[0], GREEDY)
    assert {c.weight_version for c in engine.step()} <= {3}


def test_load_weights_accepts_checkpoint_without_tied_alias():
    engine = make_engine("qwen3")  # tied embeddings: safetensors checkpoints omit lm_head.weight
    state = {k: v for k, v in tiny_model("qwen3", seed=4).state_dict().items() if k != "lm_head.weight"}
    engine.load_weights(state, version=1)
    assert torch.equal(engine.model.lm_head.weight, state["model.embed_tokens.weight"])


def test_load_weights_rejects_mismatch_and_busy_engine():
    engine = make_engine("llama")
    state = tiny_model("llama", seed=1).state_dict()
    with pytest.raises(ValueError, match="missing keys"):
        engine.load_weights({k: v for k, v in state.items() if "layers.1." not in k}, version=1)
    with pytest.raises(ValueError, match="unknown keys"):
        engine.load_weights({**state, "model.extra.weight": torch.zeros(1)}, version=1)
    bad = dict(state)
    bad["model.norm.weight"] = torch.zeros(3)
    with pytest.raises(ValueError, match="model.norm.weight"):
        engine.load_weights(bad, version=1)
    assert engine.weight_version == 0
    engine.add("busy", [5, 6], SamplingParams(max_tokens=4))
    with pytest.raises(EngineStateError, match="1 requests are unfinished"):
        engine.load_weights(state, version=1)


def test_sleep_frees_cache_and_wake_restores():
    engine = make_engine("qwen2")
    prompts = random_prompts([8, 3], seed=5)
    before = engine.generate(prompts, GREEDY)
    assert engine.cache.nbytes > 0
    engine.sleep()
    assert engine.cache.nbytes == 0
    with pytest.raises(EngineStateError, match="asleep"):
        engine.add("x", [5, 6], GREEDY)
    with pytest.raises(EngineStateError, match="asleep"):
        engine.step()
    engine.wake()
    assert [o.token_ids for o in engine.generate(prompts, GREEDY)] == [o.token_ids for o in before]


def test_sleep_refused_while_busy():
    engine = make_engine("qwen2")
    engine.add("x", [5, 6], GREEDY)
    with pytest.raises(EngineStateError, match="sleep"):
        engine.sleep()


def test_partial_load_copies_the_named_parameters_and_nothing_else(family):
    engine = make_engine(family, seed=0)
    v1 = {n: p.detach().clone() for n, p in engine.model.named_parameters()}
    v2 = {n: p.detach().clone() for n, p in tiny_model(family, seed=7).named_parameters()}
    named = ["model.layers.0.self_attn.k_proj.weight", "model.norm.weight"]
    engine.load_weights(v2, version=2, names=named)
    for name, param in engine.model.named_parameters():
        assert torch.equal(param, (v2 if name in named else v1)[name]), name
    assert engine.weight_version == 2


def test_partial_load_of_a_tied_embedding_by_its_head_name():
    engine = make_engine("qwen3")  # tied: lm_head.weight is model.embed_tokens.weight
    v2 = {n: p.detach().clone() for n, p in tiny_model("qwen3", seed=7).named_parameters()}
    engine.load_weights(v2, version=1, names=["lm_head.weight"])
    assert torch.equal(engine.model.model.embed_tokens.weight, v2["model.embed_tokens.weight"])
    assert engine.model.lm_head.weight is engine.model.model.embed_tokens.weight


def test_vllm_partial_reload_sends_every_layer_it_touches_whole():
    from rlboost.engine.vllm_backend import whole_layers

    packed = {"qkv_proj": ["q_proj", "k_proj", "v_proj"], "gate_up_proj": ["gate_proj", "up_proj"]}
    state = [f"model.layers.{i}.{m}.{t}" for i in (0, 1)
             for m in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                       "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj") for t in ("weight", "bias")]
    state = ["model.embed_tokens.weight", *state, "model.norm.weight", "lm_head.weight"]
    sent = whole_layers(state, ["model.layers.1.self_attn.k_proj.weight", "model.layers.0.mlp.up_proj.bias",
                                "lm_head.weight"], packed, tied=True)
    assert sent == ["model.embed_tokens.weight",
                    "model.layers.0.mlp.gate_proj.weight", "model.layers.0.mlp.gate_proj.bias",
                    "model.layers.0.mlp.up_proj.weight", "model.layers.0.mlp.up_proj.bias",
                    *[f"model.layers.1.self_attn.{m}_proj.{t}" for m in "qkv" for t in ("weight", "bias")],
                    "lm_head.weight"]
    assert whole_layers(state, ["lm_head.weight"], packed, tied=False) == ["lm_head.weight"]
    assert whole_layers(state, ["model.layers.0.self_attn.o_proj.weight"], packed, tied=False) == [
        "model.layers.0.self_attn.o_proj.weight", "model.layers.0.self_attn.o_proj.bias"]
