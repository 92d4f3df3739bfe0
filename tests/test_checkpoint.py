"""Checkpoints of an earlier version (no dcp/ folder: the optimizer's state pickled in trainer.pt)
still resume a world-1 trainer exactly."""

from __future__ import annotations

import copy
import shutil

import pytest
import torch

from rlboost.checkpoint import load_checkpoint, save_checkpoint
from test_trainer import make_groups, make_trainer


def test_a_checkpoint_without_dcp_shards_resumes_a_world_1_trainer(tmp_path):
    first, second = make_groups(num_groups=2, n=2, seed=5), make_groups(num_groups=2, n=2, seed=6)
    trainer = make_trainer()
    trainer.train_step(copy.deepcopy(first), 2)
    saved = save_checkpoint(tmp_path, 1, trainer, None, {})
    want = trainer.train_step(copy.deepcopy(second), 2)
    # the earlier layout: no DCP shards, the optimizer's state dict beside the scheduler's
    shutil.rmtree(saved / "dcp")
    extra = torch.load(saved / "trainer.pt", weights_only=False)
    resumed_from = make_trainer()
    resumed_from.train_step(copy.deepcopy(first), 2)
    torch.save(extra | {"optimizer": resumed_from.optimizer.state_dict()}, saved / "trainer.pt")

    resumed = make_trainer()
    assert load_checkpoint(saved, resumed)["global_step"] == 1
    for (name, a), (_, b) in zip(resumed.model.named_parameters(), resumed_from.model.named_parameters()):
        torch.testing.assert_close(a, b, rtol=0, atol=0, msg=name)
    got = resumed.train_step(copy.deepcopy(second), 2)
    assert got == pytest.approx(want, rel=1e-6)
