"""Where a run lives and how long it goes: `outputs/<run>/` with its config, metrics and checkpoints."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

RESUME_MODES = ("auto", "disable")


@dataclass
class RunConfig:
    name: str = ""
    """Run name; the folder is `outputs/<name>`. Empty: `<config file stem>-<YYYYmmdd-HHMMSS>`."""
    output_dir: str | None = None
    """The run's folder, overriding `name` (veRL: trainer.default_local_dir)."""
    total_steps: int = 10
    """RL steps to run (veRL: trainer.total_training_steps); each is one batch of prompts."""
    save_freq: int = 10
    """Checkpoint every this many steps and at the last step; 0 disables checkpoints."""
    test_freq: int = 5
    """Evaluate on the held-out prompts every this many steps and at the last step; 0 disables it."""
    val_before_train: bool = True
    """Evaluate once before the first step (logged at step 0), for a before/after comparison."""
    resume: str = "auto"
    """`auto`: continue from the latest checkpoint in the run folder if there is one; `disable`: start
    fresh (the folder must not hold checkpoints); or a path to a `global_step_N` checkpoint folder."""
    seed: int = 0
    """Seed of sampling (every sample's seed derives from it and the sample's position) and of torch."""

    def validate(self) -> None:
        """Raise ValueError naming the offending field."""
        if self.total_steps < 1:
            raise ValueError(f"run.total_steps must be >= 1, got {self.total_steps}")
        if self.save_freq < 0 or self.test_freq < 0:
            raise ValueError("run.save_freq and run.test_freq must be >= 0 (0 disables)")
        if self.resume not in RESUME_MODES and not Path(self.resume).is_dir():
            raise ValueError(f"run.resume={self.resume!r} is neither auto, disable nor an existing checkpoint folder")


def unwritable(folder: Path) -> str | None:
    """Why the run could not write `folder` (created with its parents if missing), or None: read from
    the file system, nothing is created."""
    at = folder
    while not at.exists():  # the deepest part that exists decides
        if at.parent == at:
            break
        at = at.parent
    if at.exists() and not at.is_dir():
        return f"{at} is a file, not a folder"
    if not os.access(at, os.W_OK | os.X_OK):
        return f"{at} is not writable"
    return None


def run_folder(config: RunConfig, config_path: str | Path | None) -> Path:
    if config.output_dir:
        return Path(config.output_dir)
    name = config.name or f"{Path(config_path).stem if config_path else 'run'}-{time.strftime('%Y%m%d-%H%M%S')}"
    return Path("outputs") / name
