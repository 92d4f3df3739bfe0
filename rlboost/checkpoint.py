"""Checkpoints: everything needed to continue a run exactly where it stopped.

`<run>/checkpoints/global_step_N/` holds
- `hf/`: the policy as an HF checkpoint folder (safetensors + config + tokenizer), loadable with
  `model.path=<that folder>` or transformers directly (written bucket by bucket from the shards at
  `trainer.world_size` > 1);
- `dcp/`: model and optimizer state by parameter name, as torch.distributed.checkpoint shards (one
  per trainer rank): it loads at any world size, so a run saved at 2 ranks resumes at 1 and back;
- `trainer.pt`: the LR-scheduler state, the torch / numpy / Python RNG states, and the rollout
  backend's state (HistoSpec's history);
- `state.json`: the global step, the data loader's position, and anything else the loop keeps.
A checkpoint is written to a temporary folder and renamed into place, so a run killed while saving
leaves either the whole checkpoint or none of it. Checkpoints of earlier versions (optimizer state in
`trainer.pt`, no `dcp/`) still load at world size 1.
"""

from __future__ import annotations

import json
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


def checkpoint_root(run_dir: Path) -> Path:
    return run_dir / "checkpoints"


def save_checkpoint(run_dir: Path, step: int, trainer: PolicyTrainer, tokenizer, state: dict,
                    rollout_state: dict | None = None) -> Path:
    """`state` goes to state.json (small, readable); `rollout_state` (e.g. HistoSpec's history, which
    can be large) is pickled into trainer.pt."""
    root = checkpoint_root(run_dir)
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"global_step_{step}"
    tmp = Path(tempfile.mkdtemp(prefix=f".global_step_{step}.tmp-", dir=root))
    try:
        trainer.save_state(tmp / "dcp")
        trainer.export_hf(tmp / "hf")
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp / "hf")
        torch.save({"scheduler": trainer.scheduler_state(),
                    "rng": {"torch": torch.get_rng_state(), "numpy": np.random.get_state(),
                            "python": random.getstate()}, "rollout": rollout_state or {}}, tmp / "trainer.pt")
        (tmp / "state.json").write_text(json.dumps({"global_step": step, **state}, indent=2) + "\n")
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
    extra = torch.load(path / "trainer.pt", weights_only=False)
    if (path / "dcp").is_dir():
        trainer.load_state(path / "dcp")
    else:  # a checkpoint of an earlier version: weights in hf/, the optimizer's state in trainer.pt
        trainer.load_unsharded_state(path / "hf", extra["optimizer"])
    trainer.load_scheduler_state(extra["scheduler"])
    torch.set_rng_state(extra["rng"]["torch"])
    np.random.set_state(extra["rng"]["numpy"])
    random.setstate(extra["rng"]["python"])
    return json.loads((path / "state.json").read_text()) | {"rollout": extra.get("rollout", {})}

