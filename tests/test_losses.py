"""The policy losses for stale tokens (`trainer.loss`: decoupled PPO, M2PO) against their definitions
written out here, and the trainer's behaviour-weight metrics: with fresh tokens from an exact engine,
`decoupled` trains exactly as `grpo` does."""

from __future__ import annotations

import copy
import math
import random

import pytest
import torch

from rlboost.trainer.config import TrainerConfig
from rlboost.trainer.losses import M2PO, Decoupled, PPOClip, make_loss, second_moment_mask
from rlboost.trainer.stats import ess
from test_trainer import (captured_grads, make_groups, make_trainer, mismatch_shifts, tis_reference_grads,
                          with_rollout_logprobs)


def greedy_mask(m2: list[float], threshold: float) -> set[int]:
    """M2PO's mask as the paper states it: drop the token of largest (log r)^2 until the mean of the
    rest is at most the threshold; the indices kept."""
    kept = set(range(len(m2)))
    while kept and sum(m2[i] for i in kept) / len(kept) > threshold:
        kept.remove(max(kept, key=lambda i: m2[i]))
    return kept


@pytest.mark.parametrize("seed", range(20))
def test_the_second_moment_mask_is_the_greedy_one(seed):
    rng = random.Random(seed)
    rows, cols = rng.randint(1, 4), rng.randint(1, 12)
    log_ratio = torch.tensor([[rng.gauss(0, rng.choice([0.05, 0.3, 1.0])) for _ in range(cols)] for _ in range(rows)])
    mask = torch.tensor([[float(rng.random() < 0.8) for _ in range(cols)] for _ in range(rows)])
    threshold = rng.choice([0.01, 0.04, 0.2])
    keep = second_moment_mask(log_ratio, mask, threshold)
    on = [(b, t) for b in range(rows) for t in range(cols) if mask[b, t]]
    expected = greedy_mask([log_ratio[b, t].item() ** 2 for b, t in on], threshold)
    assert {i for i, (b, t) in enumerate(on) if keep[b, t]} == expected
    assert (keep * (1 - mask)).sum() == 0  # nothing off the mask is kept


def test_m2po_drops_only_the_outliers_and_takes_the_unclipped_ratio():
    behaviour = torch.tensor([[-1.0, -1.0, -1.0, -1.0]])
    logp = torch.tensor([[-1.0, -0.9, -3.0, -1.1]], requires_grad=True)  # one outlier: (log r)^2 = 4
    advantages = torch.tensor([2.0])
    mask = torch.ones(1, 4)
    out = M2PO(threshold=0.04)(logp, behaviour, advantages, mask)
    assert out.masked.tolist() == [[0.0, 0.0, 1.0, 0.0]]
    out.loss.sum().backward()
    r = (logp.detach() - behaviour).exp()
    assert torch.allclose(logp.grad, -2.0 * r * torch.tensor([[1.0, 1.0, 0.0, 1.0]]))  # d(-A r)/dlogp = -A r
    assert out.clipped.sum() == 0


def test_the_decoupled_loss_weighs_the_proximal_ratio_by_the_capped_behaviour_weight():
    behaviour = torch.tensor([[-1.0, -2.0, -1.0]])
    logp = torch.tensor([[-1.0, -1.0, -1.5]], requires_grad=True)
    out = Decoupled(0.2, 0.2, cap=2.0)(logp, behaviour, torch.tensor([1.0]), torch.ones(1, 3))
    weight = torch.tensor([[1.0, 2.0, math.exp(-0.5)]])  # e^1 capped at 2
    assert torch.allclose(out.weight, weight) and out.truncated.tolist() == [[0.0, 1.0, 0.0]]
    out.loss.sum().backward()
    assert torch.allclose(out.loss, -weight) and torch.allclose(logp.grad, -weight)  # ratio to pi_prox is 1


def test_the_loss_is_one_type_per_kind():
    assert isinstance(make_loss("grpo", 0.2, 0.2, 0.0, 2.0, 0.04), PPOClip)
    assert isinstance(make_loss("grpo", 0.2, 0.2, 3.0, 2.0, 0.04), Decoupled)  # TIS: the one-step case
    assert make_loss("decoupled", 0.2, 0.2, 0.0, 5.0, 0.04).cap == 5.0
    assert make_loss("m2po", 0.2, 0.2, 0.0, 2.0, 0.1).threshold == 0.1


@pytest.mark.parametrize("field, value, message", [
    ("loss", "ppo", "trainer.loss='ppo'; choose one of grpo, decoupled, m2po"),
    ("behaviour_cap", 0.5, "trainer.behaviour_cap must be >= 1"),
    ("m2_threshold", 0.0, "trainer.m2_threshold must be > 0"),
])
def test_a_bad_loss_setting_names_its_key(field, value, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        TrainerConfig(**{field: value}).validate()
    with pytest.raises(ValueError, match="trainer.tis_cap is loss=grpo's"):
        TrainerConfig(loss="m2po", tis_cap=2.0).validate()


def fresh(groups):
    """`groups` as an exact engine serving the trainer's own weights streams them (k = 0)."""
    return with_rollout_logprobs(groups, [torch.zeros(len(s.response_ids)) for g in groups for s in g.samples])


@pytest.mark.parametrize("loss", ["decoupled", "m2po"])
def test_with_fresh_tokens_every_loss_trains_as_grpo(loss):
    groups = fresh(make_groups(seed=31))
    plain = captured_grads(make_trainer(), copy.deepcopy(groups))
    for g, p in zip(captured_grads(make_trainer(loss=loss), groups), plain):
        torch.testing.assert_close(g, p, rtol=1e-4, atol=1e-6)


def test_decoupled_with_stale_tokens_is_the_truncated_weighting_at_any_mini_batch_split():
    """Behaviour log-probs off the trainer's (stale tokens): one mini-batch is the TIS reference; the
    decoupled loss, unlike `tis_cap`, also trains a step of several optimizer steps."""
    groups = with_rollout_logprobs(make_groups(seed=32), mismatch_shifts(make_groups(seed=32), seed=2))
    expected = tis_reference_grads(groups, cap=2.0)
    for g, e in zip(captured_grads(make_trainer(loss="decoupled", behaviour_cap=2.0), groups), expected):
        torch.testing.assert_close(g, e, rtol=1e-4, atol=1e-6)
    metrics = make_trainer(loss="decoupled", mini_batch_groups=2).train_step(copy.deepcopy(groups), len(groups))
    assert metrics["actor/optimizer_steps"] == 2.0 and 0 < metrics["actor/tis_clipfrac"] < 1


def test_the_behaviour_weight_metrics_and_the_effective_sample_size():
    groups = make_groups(seed=33)
    shifts = mismatch_shifts(groups, seed=3)  # log pi_trainer / pi_behav per token
    metrics = make_trainer().train_step(with_rollout_logprobs(groups, shifts), len(groups))
    w = torch.cat(shifts).exp()
    assert metrics["actor/behav_weight_mean"] == pytest.approx(w.mean().item(), rel=1e-4)
    assert metrics["actor/behav_weight_max"] == pytest.approx(w.max().item(), rel=1e-4)
    assert metrics["actor/ess"] == pytest.approx((w.sum() ** 2 / (len(w) * (w ** 2).sum())).item(), rel=1e-4)
    assert ess(4.0, 4.0, 4.0) == 1.0 and ess(1.0, 1.0, 4.0) == 0.25  # equal weights; one token carries all
    same = make_trainer().train_step(fresh(groups), len(groups))
    assert same["actor/ess"] == pytest.approx(1.0, abs=1e-5) and "actor/m2po_masked_frac" not in same


def test_m2po_masks_the_stale_outliers_of_each_forward():
    groups = make_groups(seed=34)
    shifts = mismatch_shifts(groups, seed=4)  # every fifth token off by e: (log r)^2 = 1
    metrics = make_trainer(loss="m2po", micro_batch_groups=len(groups)).train_step(
        with_rollout_logprobs(groups, shifts), len(groups))
    log_ratio = torch.cat(shifts)
    expected = 1.0 - second_moment_mask(log_ratio[None], torch.ones(1, len(log_ratio)), 0.04).mean().item()
    assert metrics["actor/m2po_masked_frac"] == pytest.approx(expected)
    assert 0 < expected <= (log_ratio.abs() > 0.5).float().mean().item()  # only the outliers go
    fresh_step = make_trainer(loss="m2po").train_step(fresh(groups), len(groups))
    assert fresh_step["actor/m2po_masked_frac"] == 0.0  # reported on every m2po step, nothing masked included


def test_the_staleness_of_a_step_is_counted_per_token():
    from rlboost.train import rollout_metrics

    groups = make_groups(num_groups=2, n=2, seed=35)
    for g in groups:
        for s in g.samples:
            s.reward = 1.0
            s.versions = [7] * len(s.response_ids)  # the version the step trains from: fresh
    assert rollout_metrics(groups, version=7)["staleness/max"] == 0.0
    old = groups[0].samples[0]
    old.versions = [5] + [6] * (len(old.response_ids) - 1)  # migrated across versions: each token keeps its own
    tokens = sum(len(s.response_ids) for g in groups for s in g.samples)
    metrics = rollout_metrics(groups, version=7)
    assert metrics["staleness/max"] == 2.0
    assert metrics["staleness/mean"] == pytest.approx((2 + (len(old.response_ids) - 1)) / tokens)


def test_a_collapsing_effective_sample_size_is_one_console_line(caplog):
    from rlboost.train import ESS_COLLAPSE, Run

    run = Run.__new__(Run)  # the loop's watch alone: no parts are needed for it
    run.ess_collapsed = False
    with caplog.at_level("WARNING", logger="rlboost.train"):
        run.watch_ess(1, 0.9)
        run.watch_ess(2, ESS_COLLAPSE / 2)
        run.watch_ess(3, ESS_COLLAPSE / 3)
    [line] = [r.getMessage() for r in caplog.records]
    assert line.startswith("step 2: the effective sample size of the behaviour weights collapsed to 0.15")


def test_a_sharded_step_merges_the_behaviour_weights_of_every_rank():
    """Each rank sums its own tokens' weights; the driver's merge gives the step's ESS over all of them
    and the largest weight of any rank (`TrainStepStats.merged`)."""
    from rlboost.trainer.stats import TrainStepStats

    parts = []
    for weights in ([1.0, 1.0], [4.0]):
        stats = TrainStepStats()
        stats.tokens = float(len(weights))
        stats.behav_weight, stats.behav_weight_sq = sum(weights), sum(w * w for w in weights)
        stats.behav_weight_max, stats.m2_masked, stats.m2_tokens = max(weights), 1.0, float(len(weights))
        stats.grad_norms = [1.0]
        parts.append(stats.totals())
    metrics = TrainStepStats.merged(parts).metrics(lr=1e-3)
    assert metrics["actor/ess"] == pytest.approx(ess(6.0, 18.0, 3.0)) and metrics["actor/behav_weight_max"] == 4.0
    assert metrics["actor/behav_weight_mean"] == pytest.approx(2.0)
    assert metrics["actor/m2po_masked_frac"] == pytest.approx(2.0 / 3.0)


def test_the_loss_follows_a_config_changed_between_steps():
    """A sharded trainer's driver changes config fields between steps (`TrainerGroup.reconfigure`): the
    next step trains with the loss they name, as a fresh trainer would."""
    groups = with_rollout_logprobs(make_groups(seed=36), mismatch_shifts(make_groups(seed=36), seed=5))
    trainer = make_trainer()
    trainer.config.tis_cap = 2.0
    for g, e in zip(captured_grads(trainer, copy.deepcopy(groups)), tis_reference_grads(groups, cap=2.0)):
        torch.testing.assert_close(g, e, rtol=1e-4, atol=1e-6)
