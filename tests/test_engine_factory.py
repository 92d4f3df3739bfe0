"""`make_engine`: the engine `engine.backend` names, on the weights asked for, and the only reader of that
field (the vLLM side runs in test_engine_contract.py and the other `vllm` tests)."""

from __future__ import annotations

import ast
from pathlib import Path

import torch

import rlboost
from rlboost.engine import EngineConfig, LLMEngine
from rlboost.engine.factory import CHECKPOINT, make_engine
from rlboost.models import ModelConfig, load_model

MODEL = ModelConfig(path="tiny:llama", seed=3)
ENGINE = EngineConfig(device="cpu")


def params(engine: LLMEngine) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in engine.model.named_parameters()}


def test_the_checkpoint_is_served_as_version_zero_by_default():
    engine = make_engine(MODEL, ENGINE, [2])
    assert isinstance(engine, LLMEngine) and engine.weight_version == 0 and engine.eos_token_ids == {2}
    reference = make_engine(MODEL, ENGINE, weights=CHECKPOINT, version=0)
    assert all(torch.equal(a, b) for a, b in zip(params(engine).values(), params(reference).values()))


def test_given_weights_are_swapped_in_and_tagged():
    other = load_model(ModelConfig(path="tiny:llama", seed=4)).model
    state = {name: p.detach().clone() for name, p in other.named_parameters()}
    engine = make_engine(MODEL, ENGINE, weights=state, version=7)
    assert engine.weight_version == 7
    served = params(make_engine(ModelConfig(path="tiny:llama", seed=4), ENGINE))
    assert all(torch.equal(params(engine)[name], served[name]) for name in served)


def test_no_weights_yet_is_the_architecture_under_the_version_given():
    engine = make_engine(MODEL, ENGINE, weights=None, version=-1)
    assert engine.weight_version == -1 and engine.fingerprint == make_engine(MODEL, ENGINE).fingerprint


def test_num_threads_sets_the_engines_threads():
    before = torch.get_num_threads()
    try:
        make_engine(MODEL, ENGINE, num_threads=1)
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


def test_only_the_factory_reads_engine_backend():
    root = Path(rlboost.__file__).parent
    readers = sorted(str(path.relative_to(root)) for path in root.rglob("*.py")
                     if any(isinstance(node, ast.Attribute) and node.attr == "backend"
                            for node in ast.walk(ast.parse(path.read_text()))))
    assert readers == ["engine/config.py", "engine/factory.py"]
