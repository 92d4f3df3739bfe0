"""The trainer's state on disk: model and optimizer with torch.distributed.checkpoint, the policy as an
HF folder.

- `save_state` / `load_state`: the model's and AdamW's state by parameter name (DCP's
  `get_state_dict` / `set_state_dict`), written as DCP shards: each rank of a sharded trainer writes its
  own shard, a world-1 trainer writes one. DCP reshards on load, so a checkpoint written at one world
  size loads at any other (2 -> 1, 1 -> 2). The folder must be one every rank can reach (one machine,
  or a shared filesystem across nodes).
- `load_unsharded_state`: a checkpoint of an earlier version (no DCP shards) at world size 1: the
  weights from its HF folder, the optimizer's state dict as it was pickled.
- `export_hf`: the policy as a normal `from_pretrained` folder (config + safetensors, an index when
  the weights span several files), written bucket by bucket from the full tensors so a sharded
  trainer never holds the whole model; only `writer` writes.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path

import torch
from transformers import PreTrainedModel

from rlboost.cluster.weights import plan_buckets

MODEL_KEY, OPTIM_KEY = "model", "optimizer"


def save_state(model: PreTrainedModel, optimizer: torch.optim.Optimizer, folder: Path) -> None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_state, optim_state = get_state_dict(model, optimizer)
    with _one_process_is_intended():
        dcp.save({MODEL_KEY: model_state, OPTIM_KEY: optim_state}, checkpoint_id=str(folder), no_dist=_single())


def load_state(model: PreTrainedModel, optimizer: torch.optim.Optimizer, folder: Path) -> None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    # the state dicts of this model and optimizer, laid out as this world shards them: DCP fills them
    model_state, optim_state = get_state_dict(model, optimizer)
    state = {MODEL_KEY: model_state, OPTIM_KEY: optim_state}
    with _one_process_is_intended():
        dcp.load(state, checkpoint_id=str(folder), no_dist=_single())
    set_state_dict(model, optimizer, model_state_dict=state[MODEL_KEY], optim_state_dict=state[OPTIM_KEY])


def load_unsharded_state(model: PreTrainedModel, optimizer: torch.optim.Optimizer, hf_folder: Path,
                         optimizer_state: dict) -> None:
    import safetensors.torch

    weights = next(hf_folder.glob("*.safetensors"), None)
    if weights is None:
        raise FileNotFoundError(f"{hf_folder} holds no safetensors weights")
    missing, unexpected = safetensors.torch.load_model(model, str(weights), strict=False)
    if unexpected or [k for k in missing if not _is_tied(model, k)]:
        raise ValueError(f"checkpoint {hf_folder.parent} does not match the model: missing {missing[:5]}, "
                         f"unexpected {unexpected[:5]}")
    optimizer.load_state_dict(optimizer_state)


def _is_tied(model: PreTrainedModel, key: str) -> bool:
    # save_pretrained writes a tied LM head once, under the embedding's name
    return key == "lm_head.weight" and getattr(model.config, "tie_word_embeddings", False)


@contextmanager
def _one_process_is_intended():
    """DCP warns at every world-1 save and load that it assumes one process: that is the intent here."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled, unavailable or uninitialized")
        yield


def _single() -> bool:
    """A world-1 trainer has no process group: DCP then reads and writes in this process alone."""
    import torch.distributed as dist

    return not (dist.is_available() and dist.is_initialized())


def export_hf(model: PreTrainedModel, folder: Path, gather: Callable[[torch.Tensor], torch.Tensor], writer: bool,
              bucket_mb: float = 1024.0) -> None:
    """`model`'s weights (tied ones once, as `save_pretrained` writes them) and config into `folder`.
    `gather(t)`: the full tensor (a collective for a shard: every rank calls it in the same order)."""
    import safetensors.torch

    buckets = plan_buckets(list(model.named_parameters()), int(bucket_mb * 2**20))
    names = ([f"model-{i + 1:05d}-of-{len(buckets):05d}.safetensors" for i in range(len(buckets))]
             if len(buckets) > 1 else ["model.safetensors"])
    if writer:
        folder.mkdir(parents=True, exist_ok=True)
        model.config.save_pretrained(folder)
        if getattr(model, "generation_config", None) is not None:
            model.generation_config.save_pretrained(folder)
    weight_map, total = {}, 0
    for bucket, file in zip(buckets, names):
        tensors = {name: gather(t).contiguous() for name, t in bucket}
        if writer:
            safetensors.torch.save_file(tensors, str(folder / file), metadata={"format": "pt"})
            weight_map |= {name: file for name in tensors}
            total += sum(t.numel() * t.element_size() for t in tensors.values())
        del tensors
    if writer and len(buckets) > 1:
        index = {"metadata": {"total_size": total}, "weight_map": weight_map}
        (folder / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
