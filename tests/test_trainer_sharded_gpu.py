"""The sharded trainer's CUDA path on one GPU: NCCL, a one-rank device mesh, FSDP2's bf16 mixed
precision, DCP and the HF export. Multi-rank exactness is tested on CPU (test_trainer_sharded.py);
here the question is whether the CUDA-only branches run and agree with fp32 to bf16 precision.
No Ray: the rank's torch side (`trainer/sharding.py`) is driven directly."""

from __future__ import annotations

import copy
import socket
from datetime import timedelta

import pytest
import torch

from rlboost.models import ModelConfig, load_model
from rlboost.trainer import Trainer, TrainerConfig

from test_trainer import MAX_RESPONSE, make_groups

pytestmark = pytest.mark.gpu


@pytest.fixture
def nccl_world_of_one():
    import torch.distributed as dist

    torch.cuda.set_device(0)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1,
                            timeout=timedelta(seconds=120), device_id=torch.device("cuda", 0))
    try:
        yield
    finally:
        dist.destroy_process_group()


def test_a_cuda_rank_trains_in_bf16_close_to_fp32_and_checkpoints(nccl_world_of_one, tmp_path):
    from transformers import AutoModelForCausalLM

    from rlboost.trainer.sharding import ShardedTrainer, full_tensor, make_mesh

    policy = ModelConfig(path="tiny:qwen2", seed=3)
    kwargs = dict(temperature=0.8, max_response_length=MAX_RESPONSE, total_optimizer_steps=10)
    cfg = dict(lr=1e-3, grad_clip=0.0, share_prompt=False, kl_coef=0.1, micro_batch_groups=2)
    groups = make_groups(num_groups=4, n=3, seed=41)

    fp32 = Trainer(load_model(policy).model, TrainerConfig(device="cpu", dtype="float32", **cfg),
                   ref_model=load_model(ModelConfig(path="tiny:qwen2", seed=4)).model, **kwargs)
    want = []
    fp32.optimizer.register_step_pre_hook(lambda *_: want.append({n: p.grad.clone() for n, p in fp32.model.named_parameters()}))
    fp32.train_step(copy.deepcopy(groups), 4)

    def cuda_rank(dtype: str):
        return ShardedTrainer(load_model(policy).model, TrainerConfig(device="cuda:0", dtype=dtype, **cfg),
                              mesh=make_mesh("cuda", 1, 0),
                              ref_model=load_model(ModelConfig(path="tiny:qwen2", seed=4)).model, **kwargs)

    def one_step(rank) -> tuple[dict, dict]:
        got = []
        rank.optimizer.register_step_pre_hook(
            lambda *_: got.append({n: full_tensor(p.grad).float().cpu() for n, p in rank.model.named_parameters()}))
        rank.begin_step()
        rank.micro_batch(copy.deepcopy(groups[:2]))
        rank.micro_batch(copy.deepcopy(groups[2:]))
        rank.optimizer_step()
        return got[0], rank.end_step()

    exact, _ = one_step(cuda_rank("float32"))  # NCCL, CUDA, no mixed precision: fp32's gradient
    for name, g in exact.items():
        w = want[0][name]
        assert (g - w).abs().max() <= 1e-4 * w.abs().max(), name
    rank = cuda_rank("auto")  # bf16 compute, fp32 master weights and reductions
    got, metrics = one_step(rank)
    assert all(p.dtype == torch.float32 and p.device.type == "cuda" for p in rank.model.parameters())
    flat_got = torch.cat([g.flatten() for g in got.values()])
    flat_want = torch.cat([w.flatten() for w in want[0].values()])
    # bf16 has 8 bits of mantissa: compare the whole gradient's direction and size with fp32's, as
    # closely as the world-1 trainer's own bf16 autocast on the same GPU gets
    autocast = Trainer(load_model(policy).model, TrainerConfig(device="cuda:0", dtype="bfloat16", **cfg),
                       ref_model=load_model(ModelConfig(path="tiny:qwen2", seed=4)).model, **kwargs)
    ref = []
    autocast.optimizer.register_step_pre_hook(
        lambda *_: ref.append(torch.cat([p.grad.float().cpu().flatten() for p in autocast.model.parameters()])))
    autocast.train_step(copy.deepcopy(groups), 4)
    cosine = torch.nn.functional.cosine_similarity(flat_got, flat_want, dim=0).item()
    yardstick = torch.nn.functional.cosine_similarity(ref[0], flat_want, dim=0).item()
    print(f"bf16 gradient vs fp32: cosine {cosine:.4f} sharded, {yardstick:.4f} world-1 autocast")
    assert cosine > min(0.99, yardstick - 0.02)
    assert flat_got.norm().item() == pytest.approx(flat_want.norm().item(), rel=0.05)
    assert all(torch.isfinite(torch.tensor(metrics["grad_norms"])))

    rank.save_state(tmp_path / "dcp")
    rank.export_hf(tmp_path / "hf")
    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "hf")
    for name, p in rank.model.named_parameters():
        torch.testing.assert_close(exported.get_parameter(name), full_tensor(p).cpu(), rtol=0, atol=0)
    fresh = ShardedTrainer(load_model(policy).model, TrainerConfig(device="cuda:0", dtype="auto", **cfg),
                           mesh=make_mesh("cuda", 1, 0), ref_model=load_model(ModelConfig(path="tiny:qwen2", seed=4)).model,
                           **kwargs)
    fresh.load_state(tmp_path / "dcp")
    for (name, a), (_, b) in zip(fresh.model.named_parameters(), rank.model.named_parameters()):
        torch.testing.assert_close(full_tensor(a), full_tensor(b), rtol=0, atol=0)
