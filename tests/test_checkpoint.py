"""Checkpoints load without running code from them: their state is JSON (plus DCP shards and
safetensors); a checkpoint of an earlier version (state pickled in trainer.pt, and without a dcp/
folder the optimizer's state too) still resumes a world-1 trainer exactly, read by torch's restricted
unpickler, and a trainer.pt crafted to run code is refused with one line naming it."""

from __future__ import annotations

import copy
import json
import random
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from rlboost.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from rlboost.cli import main
from test_train import QUIET, SMOKE
from test_trainer import make_groups, make_trainer


class WritesMarker:
    """Unpickled, it writes `marker`: what a malicious checkpoint would do instead."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return Path.write_text, (self.marker, "unpickled: code ran")


def as_earlier_version(saved: Path, trainer, **extra) -> None:
    """Rewrite `saved` as the previous version wrote it: scheduler, RNG and rollout state in trainer.pt."""
    rng = {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}
    torch.save({"scheduler": trainer.scheduler_state(), "rng": rng, "rollout": {"history": {"entries": []}}} | extra,
               saved / "trainer.pt")
    (saved / "trainer.json").unlink()
    (saved / "rollout.json").unlink()


def draws() -> tuple:
    return torch.rand(4).tolist(), np.random.rand(), random.random()


def test_a_checkpoint_holds_no_pickle_outside_its_dcp_shards_and_restores_the_rngs(tmp_path):
    trainer = make_trainer()
    trainer.train_step(make_groups(num_groups=2, n=2, seed=5), 2)
    saved = save_checkpoint(tmp_path, 1, trainer, None, {"data": {"epoch": 0}}, rollout_state={"history": {}})
    want = draws()
    assert sorted(p.name for p in saved.iterdir()) == ["dcp", "hf", "rollout.json", "state.json", "trainer.json"]
    assert set(json.loads((saved / "trainer.json").read_text())) == {"scheduler", "rng"}
    torch.manual_seed(2), np.random.seed(2), random.seed(2)
    state = load_checkpoint(saved, make_trainer())
    assert state == {"global_step": 1, "data": {"epoch": 0}, "rollout": {"history": {}}}
    assert draws() == want


def test_a_checkpoint_without_dcp_shards_resumes_a_world_1_trainer(tmp_path):
    first, second = make_groups(num_groups=2, n=2, seed=5), make_groups(num_groups=2, n=2, seed=6)
    trainer = make_trainer()
    trainer.train_step(copy.deepcopy(first), 2)
    saved = save_checkpoint(tmp_path, 1, trainer, None, {})
    want = trainer.train_step(copy.deepcopy(second), 2)
    # the earlier layout: no DCP shards, the optimizer's state dict beside the scheduler's in trainer.pt
    shutil.rmtree(saved / "dcp")
    resumed_from = make_trainer()
    resumed_from.train_step(copy.deepcopy(first), 2)
    torch.manual_seed(0)  # the RNG state the old file records
    as_earlier_version(saved, resumed_from, optimizer=resumed_from.optimizer.state_dict())
    recorded = torch.rand(3)

    resumed = make_trainer()
    torch.manual_seed(1)
    state = load_checkpoint(saved, resumed)
    assert state["global_step"] == 1 and state["rollout"] == {"history": {"entries": []}}
    assert torch.equal(torch.rand(3), recorded)
    for (name, a), (_, b) in zip(resumed.model.named_parameters(), resumed_from.model.named_parameters()):
        torch.testing.assert_close(a, b, rtol=0, atol=0, msg=name)
    got = resumed.train_step(copy.deepcopy(second), 2)
    assert got == pytest.approx(want, rel=1e-6)


def crafted_checkpoint(tmp_path: Path, marker: Path) -> Path:
    """A checkpoint of the earlier layout whose trainer.pt runs code when unpickled."""
    trainer = make_trainer()
    saved = save_checkpoint(tmp_path / "run", 1, trainer, None, {"data": {}})
    as_earlier_version(saved, trainer)
    torch.save({"scheduler": trainer.scheduler_state(), "rng": WritesMarker(marker)}, saved / "trainer.pt")
    return saved


def test_a_trainer_pt_crafted_to_run_code_is_refused_naming_it(tmp_path):
    control = tmp_path / "control-marker"
    torch.load(crafted_checkpoint(tmp_path / "control", control) / "trainer.pt", weights_only=False)
    assert control.read_text() == "unpickled: code ran"  # the payload is live: plain unpickling runs it

    marker = tmp_path / "marker"
    saved = crafted_checkpoint(tmp_path, marker)
    with pytest.raises(CheckpointError) as refused:
        load_checkpoint(saved, make_trainer())
    message = str(refused.value)
    assert message.startswith(f"{saved / 'trainer.pt'}: refused: ") and "\n" not in message, message
    assert "could run code" in message
    assert not marker.exists()


def test_the_command_refuses_a_crafted_checkpoint_in_one_line(tmp_path, capsys):
    marker = tmp_path / "marker"
    saved = crafted_checkpoint(tmp_path, marker)
    code = main(["train", SMOKE, f"run.output_dir={tmp_path / 'r'}", *QUIET, f"run.resume={saved}",
                 "run.total_steps=2"])  # in the command's own process: no process boundary is under test
    captured = capsys.readouterr()
    out = captured.out + captured.err
    flat = " ".join(out.split())
    assert code == 2 and "Traceback" not in out, out
    assert f"{saved / 'trainer.pt'}: refused:" in flat, out
    assert not marker.exists()
