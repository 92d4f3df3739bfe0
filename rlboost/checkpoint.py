"""Checkpoints: everything needed to continue a run exactly where it stopped.

`<run>/checkpoints/global_step_N/` holds
- `hf/`: the policy as an HF checkpoint folder (safetensors + config + tokenizer), loadable with
  `model.path=<that folder>` or transformers directly (written bucket by bucket from the shards at
  `trainer.world_size` > 1);
- `dcp/`: model and optimizer state by parameter name, as torch.distributed.checkpoint shards (one
  per trainer rank): it loads at any world size, so a run saved at 2 ranks resumes at 1 and back;
- `trainer.json`: the LR-scheduler state and the torch / numpy / Python RNG states;
- `rollout.json`: the rollout backend's state (HistoSpec's history, the offload loop's memory...);
- `state.json`: the global step, the data loader's position, and anything else the loop keeps.
A checkpoint is written to a temporary folder and renamed into place, so a run killed while saving
leaves either the whole checkpoint or none of it.

Safety: loading a checkpoint runs no code from it. Everything but `dcp/` is JSON or safetensors.
Checkpoints of earlier versions kept that state pickled in `trainer.pt` (with the optimizer's state
when there is no `dcp/`: those load at world size 1); it is read with torch's restricted unpickler
(`weights_only=True`: tensors, plain containers, numbers, and numpy's RNG-state array), and a file
holding anything else is refused with a `CheckpointError` naming it. `dcp/` is trusted input: DCP
unpickles its `.metadata` file, so load only checkpoint folders you or your runs wrote.
"""

from __future__ import annotations

import base64
import json
import pickle
import random
import re
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

if TYPE_CHECKING:
    from rlboost.trainer.protocol import PolicyTrainer

_STEP_DIR = re.compile(r"^global_step_(\d+)$")


class CheckpointError(ValueError):
    """A checkpoint that cannot be loaded safely (one line naming its file)."""


def checkpoint_root(run_dir: Path) -> Path:
    return run_dir / "checkpoints"


def save_checkpoint(run_dir: Path, step: int, trainer: PolicyTrainer, tokenizer, state: dict,
                    rollout_state: dict | None = None) -> Path:
    """`state` goes to state.json (small, readable); `rollout_state` (e.g. HistoSpec's history, which
    can be large) to rollout.json; both must be JSON data."""
    root = checkpoint_root(run_dir)
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"global_step_{step}"
    tmp = Path(tempfile.mkdtemp(prefix=f".global_step_{step}.tmp-", dir=root))
    try:
        trainer.save_state(tmp / "dcp")
        trainer.export_hf(tmp / "hf")
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp / "hf")
        _write_json(tmp / "trainer.json", {"scheduler": trainer.scheduler_state(), "rng": rng_state()})
        _write_json(tmp / "rollout.json", rollout_state or {})
        _write_json(tmp / "state.json", {"global_step": step, **state})
        if final.exists():  # a re-run of the same step after a resume: replace it
            shutil.rmtree(final)
        tmp.rename(final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def latest_checkpoint(run_dir: Path) -> Path | None:
    root = checkpoint_root(run_dir)
    if not root.is_dir():
        return None
    steps = [(int(m.group(1)), p) for p in root.iterdir() if (m := _STEP_DIR.match(p.name))
             and (p / "state.json").is_file()]
    return max(steps)[1] if steps else None


def load_checkpoint(path: Path, trainer: PolicyTrainer) -> dict:
    """Restore the trainer and the RNGs from `path`; returns its state.json (step, data position...)
    with the rollout backend's state under `rollout`."""
    path = Path(path)
    if not (path / "state.json").is_file():
        raise FileNotFoundError(f"{path} is not a checkpoint folder (no state.json)")
    if (path / "trainer.json").is_file():
        extra = json.loads((path / "trainer.json").read_text())
        rollout = json.loads((path / "rollout.json").read_text())
    else:  # written by an earlier version
        extra = _load_pickled(path / "trainer.pt")
        rollout = extra.get("rollout", {})
    if (path / "dcp").is_dir():
        trainer.load_state(path / "dcp")
    else:  # a checkpoint of an earlier version: weights in hf/, the optimizer's state in trainer.pt
        if "optimizer" not in extra:
            raise CheckpointError(f"{path}: no dcp/ folder and no optimizer state: not a whole checkpoint")
        trainer.load_unsharded_state(path / "hf", extra["optimizer"])
    trainer.load_scheduler_state(extra["scheduler"])
    set_rng_state(extra["rng"])
    return json.loads((path / "state.json").read_text()) | {"rollout": rollout}


def rng_state() -> dict:
    """The torch, numpy and Python RNG states as JSON data."""
    kind, keys, pos, has_gauss, cached_gaussian = np.random.get_state()
    version, internal, gauss_next = random.getstate()
    return {"torch": base64.b64encode(torch.get_rng_state().numpy().tobytes()).decode("ascii"),
            "numpy": {"kind": kind, "keys": keys.tolist(), "pos": pos, "has_gauss": has_gauss,
                      "cached_gaussian": cached_gaussian},
            "python": {"version": version, "internal": list(internal), "gauss_next": gauss_next}}


def set_rng_state(rng: dict) -> None:
    """Restore `rng_state()`'s output, or the objects an earlier version's trainer.pt held."""
    torch_state, numpy_state, python_state = rng["torch"], rng["numpy"], rng["python"]
    if isinstance(torch_state, str):
        torch_state = torch.frombuffer(bytearray(base64.b64decode(torch_state)), dtype=torch.uint8)
    if isinstance(numpy_state, dict):
        numpy_state = (numpy_state["kind"], np.array(numpy_state["keys"], dtype=np.uint32), numpy_state["pos"],
                       numpy_state["has_gauss"], numpy_state["cached_gaussian"])
    if isinstance(python_state, dict):
        python_state = (python_state["version"], tuple(python_state["internal"]), python_state["gauss_next"])
    torch.set_rng_state(torch_state)
    np.random.set_state(numpy_state)
    random.setstate(python_state)


def _write_json(file: Path, data: dict) -> None:
    file.write_text(json.dumps(data, indent=1) + "\n")


# what an earlier version's trainer.pt holds beyond tensors and plain data: numpy's RNG state (a uint32 array)
_NUMPY_RNG_STATE = [np.ndarray, np.dtype, getattr(np, "_core", np).multiarray._reconstruct, type(np.dtype(np.uint32))]


def _load_pickled(file: Path) -> dict:
    """An earlier version's trainer.pt, through torch's restricted unpickler: no code from the file runs."""
    try:
        with torch.serialization.safe_globals(_NUMPY_RNG_STATE):
            return torch.load(file, weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError, OSError) as e:
        reason = str(e).strip().splitlines()[0][:200] if isinstance(e, OSError) else (
            "it holds objects other than tensors and plain data, and unpickling them could run code")
        raise CheckpointError(f"{file}: refused: {reason}; resume from a checkpoint this version wrote, or "
                              "start afresh with run.resume=disable and another run.output_dir") from e
