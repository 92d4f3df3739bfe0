"""The GRPO trainer: its log-probs match the engine's, streamed accumulation equals the full batch,
advantages and losses follow their definitions, and the optimizer steps at mini-batch boundaries."""

from __future__ import annotations

import copy
import math
import random
import warnings

import pytest
import torch

from rlboost.engine import EngineConfig, LLMEngine, SamplingParams
from rlboost.models import ModelConfig, load_model, tiny_model
from rlboost.rollout import Group, Sample
from rlboost.trainer import LOSS_AGG_MODES, Trainer, TrainerConfig
from rlboost.trainer.grpo import group_advantages, kl_k3, ppo_clip_loss
from rlboost.trainer.logprobs import pad_batch, response_logprobs, shared_prompt_logprobs

from conftest import random_prompts

MAX_RESPONSE = 12


def make_groups(num_groups=4, n=3, seed=0, vocab=256, shared=False) -> list[Group]:
    """Groups with random prompts/responses of varied lengths, rewards, and behaviour log-probs.
    `shared`: a group's samples share one prompt (GRPO's shape); otherwise each has its own."""
    rng = random.Random(seed)
    groups = []
    for g in range(num_groups):
        samples = []
        for j in range(n):
            prompt = random_prompts([rng.randint(3, 9)], vocab, seed=seed * 1000 + g * 10 + (0 if shared else j))[0]
            if shared and samples:
                prompt = list(samples[0].prompt_ids)
            response = random_prompts([rng.randint(1, MAX_RESPONSE)], vocab, seed=seed * 1000 + g * 10 + j + 500)[0]
            samples.append(Sample(uid=f"0:{g}:{j}", prompt_ids=prompt, response_ids=response,
                                  logprobs=[-5.5 + rng.uniform(-0.5, 0.5) for _ in response],
                                  versions=[0] * len(response), finish_reason="length",
                                  reward=float(rng.randint(0, 1)) + rng.uniform(0, 0.1)))
        groups.append(Group(index=g, row_index=g, data_source="t", ground_truth=None, extra_info={},
                            samples=samples))
    return groups


def make_trainer(mode="token-mean", kl_coef=0.0, **overrides) -> Trainer:
    model = tiny_model("qwen2", seed=3)
    cfg = TrainerConfig(lr=1e-3, grad_clip=0.0, loss_agg_mode=mode, kl_coef=kl_coef, device="cpu", **overrides)
    ref = tiny_model("qwen2", seed=4) if kl_coef else None  # a different reference makes the KL non-zero
    return Trainer(model, cfg, temperature=0.8, max_response_length=MAX_RESPONSE, total_optimizer_steps=10,
                   ref_model=ref)


def captured_grads(trainer: Trainer, groups: list[Group]) -> list[torch.Tensor]:
    """The gradient the optimizer sees at the step's (single) optimizer step."""
    grads = []
    trainer.optimizer.register_step_pre_hook(
        lambda *_: grads.append([p.grad.clone() for p in trainer.params]))
    trainer.train_step(groups, len(groups))
    assert len(grads) == 1
    return grads[0]


def reference_grads(mode: str, groups: list[Group], kl_coef: float) -> list[torch.Tensor]:
    """Full-batch GRPO loss written out directly from its definition, one backward pass."""
    trainer = make_trainer(mode, kl_coef)
    model = trainer.model
    samples = [s for g in groups for s in g.samples]
    adv = torch.cat([group_advantages(torch.tensor([s.reward for s in g.samples])) for g in groups])
    batch = pad_batch([s.prompt_ids for s in samples], [s.response_ids for s in samples])
    mask = batch["response_mask"].float()
    logp, _ = response_logprobs(model, batch, 0.8)
    old = torch.zeros_like(logp)
    for b, s in enumerate(samples):
        old[b, :len(s.logprobs)] = torch.tensor(s.logprobs)
    per_token, _, _ = ppo_clip_loss(logp, old, adv, 0.2, 0.2)
    if kl_coef:
        with torch.no_grad():
            ref_logp, _ = response_logprobs(trainer.ref_model, batch, 0.8)
        per_token = per_token + kl_coef * kl_k3(logp, ref_logp)
    lengths = mask.sum(1)
    if mode == "token-mean":
        loss = (per_token * mask).sum() / mask.sum()
    elif mode == "seq-mean-token-mean":
        loss = ((per_token * mask).sum(1) / lengths).mean()
    else:
        loss = ((per_token * mask).sum(1) / MAX_RESPONSE).mean()
    loss.backward()
    return [p.grad.clone() for p in trainer.params]


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
@pytest.mark.parametrize("kl_coef", [0.0, 0.1])
def test_streamed_accumulation_equals_full_batch_gradient(mode, kl_coef):
    groups = make_groups()
    expected = reference_grads(mode, groups, kl_coef)
    for micro, order_seed in [(1, 0), (1, 1), (2, 2), (4, 3)]:
        arrival = groups[:]
        random.Random(order_seed).shuffle(arrival)  # groups finish in any order
        got = captured_grads(make_trainer(mode, kl_coef, micro_batch_groups=micro), arrival)
        for g, e in zip(got, expected):
            torch.testing.assert_close(g, e, rtol=1e-4, atol=1e-6)


def test_the_normaliser_spans_the_mini_batch_not_the_micro_batch():
    """Dividing each micro-batch by its own token count would weight short micro-batches up."""
    groups = make_groups()
    expected = reference_grads("token-mean", groups, 0.0)
    got = captured_grads(make_trainer("token-mean", micro_batch_groups=1), groups)
    per_micro = [sum(len(s.response_ids) for s in g.samples) for g in groups]
    assert len(set(per_micro)) > 1  # micro-batches of unequal token counts, or the test proves nothing
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e, rtol=1e-4, atol=1e-6)


def test_optimizer_steps_at_mini_batch_boundaries():
    trainer = make_trainer(mini_batch_groups=2, micro_batch_groups=1)
    metrics = trainer.train_step(iter(make_groups(num_groups=5)), 5)
    assert metrics["actor/optimizer_steps"] == 3  # 2 + 2 + the remaining 1


def test_train_step_rejects_a_short_stream():
    with pytest.raises(RuntimeError, match="delivered 3 groups, the step expected 4"):
        make_trainer().train_step(make_groups(num_groups=3), 4)


def test_group_advantages():
    r = torch.tensor([1.0, 0.0, 0.0, 1.0])
    torch.testing.assert_close(group_advantages(r), (r - 0.5) / (r.std() + 1e-6))
    torch.testing.assert_close(group_advantages(r, norm_by_std=False), r - 0.5)
    assert group_advantages(torch.ones(4)).abs().max() == 0  # no signal, no push
    assert group_advantages(torch.tensor([3.0])).item() == 0


def test_ppo_clip_loss_clips_only_in_the_profitable_direction():
    old = torch.zeros(1, 2)
    logp = torch.log(torch.tensor([[1.5, 0.5]]))  # ratios 1.5 and 0.5
    loss, clipped, _ = ppo_clip_loss(logp, old, torch.tensor([1.0]), 0.2, 0.2)
    # positive advantage: ratio 1.5 is clipped to 1.2; ratio 0.5 keeps its (worse) unclipped value
    torch.testing.assert_close(loss, torch.tensor([[-1.2, -0.5]]))
    assert clipped.tolist() == [[1.0, 0.0]]
    loss, clipped, _ = ppo_clip_loss(logp, old, torch.tensor([-1.0]), 0.2, 0.2)
    torch.testing.assert_close(loss, torch.tensor([[1.5, 0.8]]))
    assert clipped.tolist() == [[0.0, 1.0]]


def test_kl_k3_is_zero_at_equality_and_positive_otherwise():
    logp = torch.log(torch.tensor([0.2, 0.5, 0.9]))
    assert kl_k3(logp, logp).abs().max() == 0
    assert (kl_k3(logp, logp + 0.3) > 0).all() and (kl_k3(logp, logp - 0.3) > 0).all()


@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3"])
def test_trainer_logprobs_match_the_engines(family):
    """The behaviour log-probs the engine streams and the trainer's recomputation are one quantity."""
    model = load_model(ModelConfig(path=f"tiny:{family}", seed=5)).model
    engine = LLMEngine(copy.deepcopy(model), EngineConfig(device="cpu"), eos_token_ids=[2])
    prompts = random_prompts([5, 9, 3, 7], vocab=259, seed=1)
    outs = engine.generate(prompts, SamplingParams(temperature=0.7, max_tokens=20, seed=0))
    batch = pad_batch(prompts, [o.token_ids for o in outs])
    with torch.no_grad():
        logp, _ = response_logprobs(model, batch, 0.7)
    for b, o in enumerate(outs):
        torch.testing.assert_close(logp[b, :len(o.token_ids)], torch.tensor(o.logprobs), rtol=0, atol=1e-4)


def test_trainer_logprobs_match_the_engines_on_smollm2(smollm2):
    tok = smollm2.tokenizer
    engine = LLMEngine(load_model(ModelConfig()).model, EngineConfig(device="cpu"), eos_token_ids=smollm2.eos_token_ids)
    prompts = [tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True,
                                       tokenize=True, return_dict=True)["input_ids"]
               for q in ("What is 12 + 30?", "Name a colour.")]
    outs = engine.generate(prompts, SamplingParams(temperature=0.7, max_tokens=16, seed=0))
    batch = pad_batch(prompts, [o.token_ids for o in outs])
    with torch.no_grad():
        logp, _ = response_logprobs(smollm2.model, batch, 0.7)
    for b, o in enumerate(outs):
        torch.testing.assert_close(logp[b, :len(o.token_ids)], torch.tensor(o.logprobs), rtol=0, atol=1e-3)


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize("family", ["qwen2", "llama", "qwen3"])
def test_a_shared_prompt_gives_the_padded_batchs_logprobs_and_gradients(family, attn):
    """Each group's prompt run once, its responses on the prompt's expanded keys and values: the same
    log-probs, entropies and gradients as every sample padded into one batch."""
    model = tiny_model(family, seed=3, attn_implementation=attn)
    samples = [s for g in make_groups(num_groups=3, n=4, seed=5, shared=True) for s in g.samples]
    assert_the_paths_agree(model, [s.prompt_ids for s in samples], [s.response_ids for s in samples])


def test_a_shared_prompt_at_the_edges():
    """Responses of one token (nothing to feed after the prompt) and of none, a group of one sample,
    a prompt that returns after another group, and a micro-batch whose responses are all that short."""
    a, b, c = (random_prompts([length], 256, seed=seed)[0] for length, seed in ((6, 1), (1, 2), (9, 3)))
    responses = [random_prompts([length], 256, seed=10 + i)[0] if length else []
                 for i, length in enumerate([1, 0, 5, 12, 3, 1, 4, 0, 7])]
    prompts = [a, a, a, a, b, c, c, a, a]
    model = tiny_model("qwen2", seed=3)
    assert_the_paths_agree(model, prompts, responses)
    assert_the_paths_agree(model, [a, a, a, b], [[5], [], [9], [4]])


def test_a_shared_prompt_under_a_sliding_window():
    """The model's own cache keeps only a sliding window's last keys; the prompt's must all be there."""
    model = tiny_model("qwen2", seed=3, use_sliding_window=True, sliding_window=4, max_window_layers=0)
    samples = [s for g in make_groups(num_groups=2, n=4, seed=5, shared=True) for s in g.samples]
    assert max(len(s.prompt_ids) for s in samples) > 4
    assert_the_paths_agree(model, [s.prompt_ids for s in samples], [s.response_ids for s in samples])


def test_a_shared_prompt_passes_its_cache_by_the_models_own_name():
    """transformers 5.x renamed the forward's `past_key_values` to `cache` and warns on the old name at every
    call: in the showcase that put a FutureWarning on the newcomer's console each run."""
    model = tiny_model("llama", seed=3)
    samples = [s for g in make_groups(num_groups=1, n=3, seed=5, shared=True) for s in g.samples]
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        shared_prompt_logprobs(model, [s.prompt_ids for s in samples], [s.response_ids for s in samples], 0.8)


def assert_the_paths_agree(model, prompts, responses) -> None:
    params = list(model.parameters())
    padded, padded_entropy = response_logprobs(model, pad_batch(prompts, responses), 0.8, with_entropy=True)
    padded_grads = torch.autograd.grad((padded * torch.linspace(-1, 1, padded.numel()).view_as(padded)).sum(),
                                       params, allow_unused=True)
    shared, shared_entropy = shared_prompt_logprobs(model, prompts, responses, 0.8, with_entropy=True)
    shared_grads = torch.autograd.grad((shared * torch.linspace(-1, 1, shared.numel()).view_as(shared)).sum(),
                                       params, allow_unused=True)
    assert shared.shape == padded.shape
    torch.testing.assert_close(shared, padded, rtol=0, atol=2e-5)
    torch.testing.assert_close(shared_entropy, padded_entropy, rtol=0, atol=2e-5)
    for a, b in zip(shared_grads, padded_grads):
        if b is None:
            assert a is None or not a.any()
            continue
        assert_same_up_to_rounding(a, b)


def assert_same_up_to_rounding(a: torch.Tensor, b: torch.Tensor) -> None:
    """Equal within float32 rounding of sums in another order: relative to the tensor's scale, since
    an element near zero has no relative precision of its own."""
    assert (a - b).abs().max() <= 1e-4 * b.abs().max() + 1e-7, ((a - b).abs().max(), b.abs().max())


@pytest.mark.parametrize("kl_coef", [0.0, 0.1])
def test_sharing_the_prompt_trains_to_the_same_weights(kl_coef):
    """A whole train step, micro-batches of two groups: the gradient the optimizer sees is the same."""
    groups = make_groups(num_groups=4, n=4, seed=6, shared=True)
    on = captured_grads(make_trainer(kl_coef=kl_coef, share_prompt=True, micro_batch_groups=2), copy.deepcopy(groups))
    off = captured_grads(make_trainer(kl_coef=kl_coef, share_prompt=False, micro_batch_groups=2), copy.deepcopy(groups))
    for a, b in zip(on, off):
        assert_same_up_to_rounding(a, b)


def test_a_train_step_with_a_shared_prompt_reports_and_updates_the_same():
    """Metrics and updated weights of a whole step (two mini-batches, micro-batches of two groups).
    SGD-like Adam settings: Adam's first update is lr * sign(grad), which float rounding can flip where a
    gradient is near zero; a large eps makes it lr * grad / eps, as continuous in the gradient as SGD."""
    groups = make_groups(num_groups=4, n=4, seed=8, shared=True)
    trainers = [make_trainer(kl_coef=0.1, share_prompt=share, micro_batch_groups=2, mini_batch_groups=2)
                for share in (True, False)]
    for t in trainers:
        for pg in t.optimizer.param_groups:
            pg["eps"] = 1.0
    before = [p.detach().clone() for p in trainers[0].params]
    on, off = (t.train_step(copy.deepcopy(groups), len(groups)) for t in trainers)
    assert on.keys() == off.keys()
    for key in on:
        assert on[key] == pytest.approx(off[key], rel=1e-4, abs=1e-7), key
    assert on["actor/optimizer_steps"] == 2
    moved = 0.0
    for a, b, w in zip(trainers[0].params, trainers[1].params, before):
        assert_same_up_to_rounding(a.detach() - w, b.detach() - w)
        moved = max(moved, (b.detach() - w).abs().max().item())
    assert moved > 1e-5  # the step did move the weights, so equality means something


# -- truncated importance sampling (trainer.tis_cap) and the rollout/trainer mismatch metrics --

def trainer_logprobs(groups: list[Group]) -> list[torch.Tensor]:
    """Each sample's response log-probs under `make_trainer()`'s starting weights."""
    model = make_trainer().model
    out = []
    with torch.no_grad():
        for s in (s for g in groups for s in g.samples):
            batch = pad_batch([s.prompt_ids], [s.response_ids])
            out.append(response_logprobs(model, batch, 0.8)[0][0, :len(s.response_ids)])
    return out


def with_rollout_logprobs(groups: list[Group], shifts: list[torch.Tensor]) -> list[Group]:
    """`groups` whose behaviour log-probs are the trainer's own minus `shifts` (log pi_trainer/pi_rollout):
    what an engine with other numerics streams."""
    groups = copy.deepcopy(groups)
    for s, lp, shift in zip((s for g in groups for s in g.samples), trainer_logprobs(groups), shifts):
        s.logprobs = (lp - shift).tolist()
    return groups


def tis_reference_grads(groups: list[Group], cap: float) -> list[torch.Tensor]:
    """token-mean of -A * min(pi_trainer/pi_rollout, cap) * log pi(token), written out from the definition
    (the PPO ratio against the trainer's own starting log-probs is 1: never clipped)."""
    trainer = make_trainer()
    samples = [s for g in groups for s in g.samples]
    adv = torch.cat([group_advantages(torch.tensor([s.reward for s in g.samples])) for g in groups])
    batch = pad_batch([s.prompt_ids for s in samples], [s.response_ids for s in samples])
    mask = batch["response_mask"].float()
    logp, _ = response_logprobs(trainer.model, batch, 0.8)
    rollout = torch.zeros_like(logp)
    for b, s in enumerate(samples):
        rollout[b, :len(s.logprobs)] = torch.tensor(s.logprobs)
    weight = (logp.detach() - rollout).exp().clamp(max=cap)
    loss = (-adv[:, None] * weight * logp * mask).sum() / mask.sum()
    loss.backward()
    return [p.grad.clone() for p in trainer.params]


def mismatch_shifts(groups: list[Group], seed: int = 0) -> list[torch.Tensor]:
    """log(pi_trainer/pi_rollout) per token: mostly bf16-sized noise, every fifth token far off either way."""
    gen = torch.Generator().manual_seed(seed)
    shifts = []
    for s in (s for g in groups for s in g.samples):
        shift = torch.randn(len(s.response_ids), generator=gen) * 0.03
        shift[::5] = torch.tensor([1.0, -1.0])[torch.arange(len(shift[::5])) % 2]
        shifts.append(shift)
    return shifts


def test_tis_weighs_each_token_by_the_truncated_ratio():
    groups = make_groups(seed=21)
    skewed = with_rollout_logprobs(groups, mismatch_shifts(groups))
    expected = tis_reference_grads(skewed, cap=2.0)
    for micro in (1, 3):
        got = captured_grads(make_trainer(tis_cap=2.0, micro_batch_groups=micro), skewed)
        for g, e in zip(got, expected):
            torch.testing.assert_close(g, e, rtol=1e-4, atol=1e-6)
    # the PPO ratio against the rollout's log-probs (tis off) is another gradient: it clips the far-off tokens
    plain = captured_grads(make_trainer(), skewed)
    assert max((p - e).abs().max().item() for p, e in zip(plain, expected)) > 1e-3


def test_tis_without_a_mismatch_is_the_plain_policy_gradient():
    groups = make_groups(seed=22)
    same = with_rollout_logprobs(groups, [torch.zeros(len(s.response_ids)) for g in groups for s in g.samples])
    plain = captured_grads(make_trainer(), same)
    for g, p in zip(captured_grads(make_trainer(tis_cap=2.0), same), plain):
        torch.testing.assert_close(g, p, rtol=1e-4, atol=1e-6)


def test_the_mismatch_and_tis_metrics():
    groups = make_groups(seed=23)
    shifts = mismatch_shifts(groups, seed=1)
    skewed = with_rollout_logprobs(groups, shifts)
    lp = torch.cat(trainer_logprobs(skewed))
    rollout = torch.tensor([x for g in skewed for s in g.samples for x in s.logprobs])
    shift = torch.cat(shifts)
    metrics = make_trainer(tis_cap=2.0).train_step(skewed, len(skewed))
    diff = (lp.exp() - rollout.exp()).abs()
    assert metrics["training/rollout_probs_diff_max"] == pytest.approx(diff.max().item(), rel=1e-4)
    assert metrics["training/rollout_probs_diff_mean"] == pytest.approx(diff.mean().item(), rel=1e-4)
    assert metrics["actor/tis_clipfrac"] == pytest.approx((shift > math.log(2.0)).float().mean().item())
    assert metrics["actor/tis_weight_mean"] == pytest.approx(shift.exp().clamp(max=2.0).mean().item(), rel=1e-4)
    assert metrics["actor/pg_clipfrac"] == 0.0  # the ratio to the trainer's own start is 1
    plain = make_trainer().train_step(copy.deepcopy(skewed), len(skewed))
    assert "actor/tis_clipfrac" not in plain
    assert plain["actor/pg_clipfrac"] > 0.1  # every fifth token is off by e: clipped where the advantage agrees
    assert plain["training/rollout_probs_diff_max"] == metrics["training/rollout_probs_diff_max"]


def test_the_mismatch_is_measured_before_the_first_update_only():
    """Later mini-batches see weights the rollout never had: their difference is not the engine's."""
    groups = make_groups(num_groups=4, seed=24)
    skewed = with_rollout_logprobs(groups, mismatch_shifts(groups, seed=2))
    first_two = make_trainer().train_step(copy.deepcopy(skewed[:2]), 2)
    by_mini = make_trainer(mini_batch_groups=2).train_step(copy.deepcopy(skewed), 4)
    assert by_mini["training/rollout_probs_diff_mean"] == pytest.approx(first_two["training/rollout_probs_diff_mean"])


def test_tis_refuses_several_optimizer_steps_per_step_before_any_update():
    trainer = make_trainer(tis_cap=2.0, mini_batch_groups=2)
    before = [p.detach().clone() for p in trainer.params]
    with pytest.raises(ValueError, match="trainer.tis_cap needs one optimizer step per RL step.*mini_batch_groups=0"):
        trainer.train_step(make_groups(num_groups=4), 4)
    assert all(torch.equal(b, p) for b, p in zip(before, trainer.params))
    with pytest.raises(ValueError, match="trainer.tis_cap must be 0 \\(off\\) or >= 1, got 0.5"):
        TrainerConfig(tis_cap=0.5).validate()


def test_a_group_with_an_unfinished_sample_is_refused_naming_it():
    groups = make_groups(num_groups=2)
    groups[1].samples[0].finish_reason = None
    with pytest.raises(ValueError, match="group 1 reached the trainer with unfinished samples"):
        make_trainer().train_step(groups, 2)
