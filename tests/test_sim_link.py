"""The simulator's provisioning model: a spot instance serves instance_startup_s + the version's bytes
over its link (`link_gbps`) after its launch, the bytes being what the weight store would pack for
the architecture (every parameter once, in `wire_dtype`), and a link or dtype that makes no sense is
refused naming its key."""

from __future__ import annotations

import math

import pytest

from rlboost.cli import main
from rlboost.policies.offload import OffloadController
from rlboost.sim.simulator import SimConfig, simulate
from rlboost.sim.specs import MODELS
from rlboost.spot.trace import TraceConfig

BYTES_PER_PARAM = {"bfloat16": 2, "float32": 4}


def constant_trace(tmp_path, instances: int) -> TraceConfig:
    path = tmp_path / "constant.csv"
    path.write_text(f"time_s,available_instances\n0,{instances}\n7200,{instances}\n")
    return TraceConfig(path=str(path), sample=1.0, time_scale=1.0)


def joins_seen(monkeypatch, cfg: SimConfig) -> list[float]:
    """The launch-to-serving times the offload controller was given, one mean per step with joins."""
    seen = []
    original = OffloadController.update

    def update(self, timings):
        if math.isfinite(timings.provision_s):
            seen.append(timings.provision_s)
        return original(self, timings)

    monkeypatch.setattr(OffloadController, "update", update)
    simulate(cfg)
    return seen


@pytest.mark.parametrize("model, gbps, dtype", [("qwen3-8b", 1.0, "bfloat16"), ("qwen3-8b", 10.0, "bfloat16"),
                                                ("qwen3-8b", 100.0, "bfloat16"), ("qwen3-8b", 10.0, "float32"),
                                                ("qwen3-32b", 1.0, "bfloat16")])
def test_a_join_takes_the_boot_plus_the_versions_bytes_over_the_link(tmp_path, monkeypatch, model, gbps, dtype):
    # Two instances from t=0 and a single step (steps start while the clock is below duration_s):
    # both launch at the step's start and serve once booted and pulled.
    cfg = SimConfig(model=model, trace=constant_trace(tmp_path, 2), duration_s=1.0, link_gbps=gbps, wire_dtype=dtype,
                    instance_startup_s=60.0)
    pull_s = MODELS[model].params * BYTES_PER_PARAM[dtype] * 8 / (gbps * 1e9)
    assert joins_seen(monkeypatch, cfg) == [pytest.approx(60.0 + pull_s, rel=1e-9)]


def test_the_default_link_is_the_one_the_model_always_assumed():
    # 50 Gbit/s and bf16: every number the simulator published before the knob existed still holds
    cfg = SimConfig()
    assert (cfg.link_gbps, cfg.wire_dtype) == (50.0, "bfloat16")


@pytest.mark.parametrize("model", sorted(MODELS))
@pytest.mark.parametrize("dtype", sorted(BYTES_PER_PARAM))
def test_the_bytes_are_what_the_weight_store_packs_for_the_real_architecture(model, dtype):
    # The trainer publishes `named_parameters()` (every parameter once) and the weight store sizes each
    # tensor as numel x element size: built from the public config on the meta device (no memory),
    # the real Qwen3 architecture gives exactly the simulator's bytes.
    import torch
    from transformers import AutoModelForCausalLM, Qwen3Config

    spec = MODELS[model]
    config = Qwen3Config(hidden_size=spec.hidden, intermediate_size=spec.intermediate, num_hidden_layers=spec.layers,
                         num_attention_heads=spec.heads, num_key_value_heads=spec.kv_heads, head_dim=spec.head_dim,
                         vocab_size=spec.vocab, tie_word_embeddings=False)
    with torch.device("meta"):
        real = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype))
    packed = sum(p.numel() * p.element_size() for _, p in real.named_parameters())
    assert spec.weight_bytes_in(dtype) == packed


@pytest.mark.parametrize("value", [0.0, -10.0, math.nan, math.inf])
def test_a_link_that_moves_nothing_is_refused_naming_the_key(value):
    with pytest.raises(ValueError, match=r"^simulate\.link_gbps must be finite and > 0"):
        SimConfig(link_gbps=value).validate()


def test_the_command_refuses_a_bad_link_or_dtype_in_one_line(tmp_path, capsys):
    for override, message in [("link_gbps=0", "error: simulate.link_gbps must be finite and > 0 (Gbit/s), got 0.0"),
                              ("link_gbps=-1", "error: simulate.link_gbps must be finite and > 0 (Gbit/s), got -1.0"),
                              ("link_gbps=nan", "error: link_gbps must be a finite number, got nan"),
                              ("wire_dtype=int8", "error: simulate.wire_dtype='int8'; valid: bfloat16, float32")]:
        assert main(["simulate", override, "--plots", str(tmp_path)]) == 2
        captured = capsys.readouterr()
        assert "Traceback" not in captured.out + captured.err
        errors = [line for line in (captured.out + captured.err).splitlines() if line.startswith("error:")]
        assert errors == [message], override
