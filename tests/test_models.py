"""Model loading: tiny families built in code, HF checkpoint folders, the bundled SmolLM2 GGUF."""

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from transformers import AutoModelForCausalLM

from rlboost.models import ModelConfig, load_model, loading, tiny_model
from rlboost.models.loading import bundled_gguf_path, bundled_smollm2_folder, model_problem


def test_tiny_models_are_real_and_seeded(family):
    a, b, c = tiny_model(family, seed=1), tiny_model(family, seed=1), tiny_model(family, seed=2)
    assert a.config.model_type == family
    sa, sb, sc = a.state_dict(), b.state_dict(), c.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert not all(torch.equal(sa[k], sc[k]) for k in sa)
    torch.manual_seed(0)
    x = torch.rand(1)
    torch.manual_seed(0)
    tiny_model(family, seed=3)
    assert torch.equal(torch.rand(1), x), "building a tiny model must not disturb the global RNG"
    assert sum(p.numel() for p in a.parameters()) < 200_000
    if family == "qwen2":
        assert a.model.layers[0].self_attn.q_proj.bias.abs().sum() > 0
    if family == "qwen3":
        assert hasattr(a.model.layers[0].self_attn, "q_norm")


def test_load_model_errors():
    with pytest.raises(ValueError, match="tiny:llama, tiny:qwen2, tiny:qwen3"):
        load_model(ModelConfig(path="tiny:gpt9"))
    with pytest.raises(FileNotFoundError, match="neither"):
        load_model(ModelConfig(path="/nonexistent/model"))
    with pytest.raises(ValueError, match="unknown dtype"):
        load_model(ModelConfig(path="tiny:llama", dtype="float8"))


def test_model_problem_says_what_a_node_lacks_without_loading(tmp_path):
    """What a joined cluster's nodes are asked at start-up (`checks.check_model_on_nodes`)."""
    assert model_problem(ModelConfig(path="tiny:qwen2")) is None
    assert model_problem(ModelConfig(path="tiny:nope")) == "unknown tiny family 'tiny:nope'"
    assert model_problem(ModelConfig(path="smollm2")) is None  # the package is installed here
    assert model_problem(ModelConfig(path=str(tmp_path / "x"))) == f"{tmp_path / 'x'} does not exist"
    assert model_problem(ModelConfig(path=str(tmp_path))) == f"{tmp_path / 'config.json'} does not exist"
    (tmp_path / "config.json").write_text("{}")
    assert model_problem(ModelConfig(path=str(tmp_path))) is None
    assert model_problem(ModelConfig(path=str(tmp_path), gguf_file="m.gguf")) == f"{tmp_path / 'm.gguf'} does not exist"
    (tmp_path / "m.gguf").write_bytes(b"GGUF")
    assert model_problem(ModelConfig(path=str(tmp_path / "m.gguf"))) is None
    assert model_problem(ModelConfig(path=str(tmp_path / "config.json"))) == \
        f"{tmp_path / 'config.json'} is a file but not a .gguf one"


def test_bundled_smollm2(smollm2):
    model, tok = smollm2.model, smollm2.tokenizer
    assert model.config.model_type == "llama" and model.config.num_hidden_layers == 30
    assert 130e6 < sum(p.numel() for p in model.parameters()) < 140e6
    assert model.dtype == torch.float32
    assert smollm2.eos_token_ids == [tok.convert_tokens_to_ids("<|im_end|>")]
    text = tok.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False)
    assert text.endswith("<|im_start|>assistant\n") and "<|im_start|>user\nhi<|im_end|>" in text


def test_hf_checkpoint_folder_roundtrip(tmp_path, smollm2):
    """A Qwen3 checkpoint saved as an HF folder (safetensors + config + tokenizer) loads back identically."""
    model = tiny_model("qwen3", seed=4)
    model.save_pretrained(tmp_path)
    smollm2.tokenizer.save_pretrained(tmp_path)
    loaded = load_model(ModelConfig(path=str(tmp_path)))
    assert loaded.model.config.model_type == "qwen3" and loaded.tokenizer is not None
    ref = model.state_dict()
    assert all(torch.equal(v, ref[k]) for k, v in loaded.model.state_dict().items())
    assert load_model(ModelConfig(path=str(tmp_path), dtype="bfloat16")).model.dtype == torch.bfloat16


def test_gguf_conversion_is_faithful(tmp_path, monkeypatch, smollm2):
    """Loading the GGUF directly (as transformers does) gives the weights of our converted cache folder, and a
    fresh conversion writes a standard folder of them. transformers takes about 30 s to parse this GGUF (gguf-py
    reads its 49k-entry vocabulary field by field, twice), so the conversion is handed what the direct load
    got from that same call on that same file (checked) instead of parsing it a second time."""
    monkeypatch.setenv("RLBOOST_CACHE", str(tmp_path / "cache"))
    gguf = bundled_gguf_path()
    link = tmp_path / "gguf" / gguf.name
    link.parent.mkdir()
    link.symlink_to(gguf)
    direct = load_model(ModelConfig(path=str(link)))
    assert direct.model.dtype == torch.float32
    converted = smollm2.model.state_dict()
    assert all(torch.equal(v, converted[k]) for k, v in direct.model.state_dict().items())

    asked = []

    def parsed_already(what):
        def from_pretrained(folder, gguf_file=None, **kwargs):
            asked.append((Path(folder, gguf_file).resolve(), kwargs.get("dtype")))
            return what
        return type("Parsed", (), {"from_pretrained": staticmethod(from_pretrained)})

    monkeypatch.setattr(loading, "AutoModelForCausalLM", parsed_already(direct.model))
    monkeypatch.setattr(loading, "AutoTokenizer", parsed_already(direct.tokenizer))
    folder = bundled_smollm2_folder()  # a fresh cache: converts now
    assert asked == [(gguf.resolve(), None), (gguf.resolve(), torch.float32)], asked  # the direct load's calls
    assert (folder / "model.safetensors").is_file() and str(folder).startswith(str(tmp_path))
    assert_standard_hf_folder(folder, direct.model)
    shutil.rmtree(tmp_path / "cache")


def assert_standard_hf_folder(folder, reference):
    """What loaders other than transformers need (vLLM picks its model class from `architectures` and
    reads each weight by its own name): the class is named and every weight name is stored, tied
    ones included, with the reference's values."""
    config = json.loads((folder / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and config["tie_word_embeddings"] is True
    assert "quantization_config" not in config
    with safe_open(folder / "model.safetensors", "pt") as f:
        stored = {name: f.get_tensor(name) for name in f.keys()}
    expected = reference.state_dict()
    assert set(stored) == set(expected), "every name of the state dict, lm_head.weight and embed_tokens both"
    assert all(torch.equal(stored[k], v) for k, v in expected.items())
    # a loader that does not tie weights itself (tie_word_embeddings off) still gets the same model
    untied = AutoModelForCausalLM.from_pretrained(folder, tie_word_embeddings=False).eval()
    ids = torch.tensor([[1, 504, 3500, 28, 253]])
    with torch.no_grad():
        assert torch.allclose(untied(ids).logits, reference(ids).logits, atol=1e-5)
