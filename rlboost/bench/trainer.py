"""`rlboost bench trainer`: the trainer at several world sizes, on the same groups, in one run.

For each world size: the bytes of parameters, gradients and AdamW state one rank holds right after an
optimizer step (`param_grad_optim_bytes_per_rank`, the largest rank's; about 16 bytes per parameter at
world 1, 1/N of it sharded), the mean time of a training step after a warm-up step (`step_s`), and the
largest difference between the gradient the first optimizer step sees and world 1's, relative to each
tensor's scale (`grad_max_rel_diff_vs_world1`). World 1 is the in-process `Trainer`; N > 1 runs N
FSDP2 ranks on a local Ray (gloo on CPU, NCCL on CUDA). Both use one padded batch per micro-batch,
the path every rank takes (`trainer/sharding.py`). On a CPU machine the ranks share its cores, so
step time does not improve with N; memory per rank is what sharding buys there.
"""

from __future__ import annotations

import dataclasses
import os
import random
import time
from dataclasses import dataclass

import torch
from rich.table import Table

from rlboost.models import ModelConfig, load_model
from rlboost.rollout import Group, Sample
from rlboost.trainer import Trainer, TrainerConfig


@dataclass
class TrainerBenchConfig:
    world_sizes: list[int] = dataclasses.field(default_factory=lambda: [1, 2])
    """World sizes to measure; 1 (the reference for the gradient) is always measured first."""
    model: str = "smollm2"
    """Model (any `model.path` value), trained in fp32."""
    groups: int = 4
    """GRPO groups per step (one optimizer step per training step)."""
    n: int = 4
    """Responses per group."""
    prompt_len: int = 32
    response_len: int = 48
    micro_batch_groups: int = 1
    steps: int = 2
    """Timed steps after the warm-up step."""
    device: str = "cpu"
    """trainer.device of every rank: cpu, or cuda (one GPU per rank)."""
    seed: int = 0


def bench_trainer(cfg: TrainerBenchConfig, log=None) -> dict:
    sizes = [1] + [n for n in cfg.world_sizes if n != 1]
    model_cfg = ModelConfig(path=cfg.model)
    vocab = load_model(model_cfg).model.config.vocab_size
    steps = [make_groups(cfg, vocab, step) for step in range(cfg.steps + 1)]
    tcfg = dict(lr=1e-6, grad_clip=0.0, share_prompt=False, micro_batch_groups=cfg.micro_batch_groups,
                device=cfg.device)
    kwargs = dict(temperature=1.0, max_response_length=cfg.response_len, total_optimizer_steps=cfg.steps + 1)
    results, reference = [], None
    for size in sizes:
        if log:
            log(f"world size {size}...")
        if size == 1:
            trainer = Trainer(load_model(model_cfg).model, TrainerConfig(**tcfg), **kwargs)
            grads, held = [], []
            trainer.optimizer.register_step_pre_hook(
                lambda *_: grads.append({n: p.grad.clone() for n, p in trainer.model.named_parameters()}))
            trainer.optimizer.register_step_post_hook(lambda *_: held.append(world1_bytes(trainer)))
            step_s = timed_steps(lambda g: trainer.train_step(g, len(g)), steps)
            reference = grads[0]
            results.append(result(1, held[-1], step_s, 0.0))
            del trainer, grads
            continue
        results.append(sharded(size, model_cfg, tcfg, kwargs, steps, reference))
    return {"config": dataclasses.asdict(cfg), "machine": {"cpus": os.cpu_count(), "torch": torch.__version__},
            "results": results}


def sharded(size: int, model_cfg: ModelConfig, tcfg: dict, kwargs: dict, steps: list, reference: dict) -> dict:
    from rlboost.cluster.config import ClusterConfig
    from rlboost.cluster.ray_cluster import Cluster
    from rlboost.trainer.ranks import TrainerGroup

    cluster = Cluster(ClusterConfig())  # a local Ray of its own, all of it reserved, as a colocated run's
    group = None
    try:
        group = TrainerGroup(TrainerConfig(world_size=size, **tcfg), model_cfg, cluster=cluster, **kwargs)
        group.capture_grads()
        group.train_step(steps[0], len(steps[0]))  # warm-up, and the gradient to compare
        first = group.take_captured()[0]
        group.stop_capturing()
        step_s = timed_steps(lambda g: group.train_step(g, len(g)), steps[1:], warm_up=False)
        return result(size, max(group.state_bytes()), step_s, max_rel_diff(first, reference))
    finally:
        if group is not None:
            group.close()
        cluster.shutdown()


def timed_steps(train, steps: list, warm_up: bool = True) -> float:
    if warm_up:
        train(steps[0])
        steps = steps[1:]
    times = []
    for groups in steps:
        t0 = time.perf_counter()
        train(groups)
        times.append(time.perf_counter() - t0)
    return sum(times) / len(times)


def result(size: int, nbytes: int, step_s: float, diff: float) -> dict:
    return {"world_size": size, "param_grad_optim_bytes_per_rank": nbytes, "step_s": step_s,
            "grad_max_rel_diff_vs_world1": diff}


def world1_bytes(trainer: Trainer) -> int:
    tensors = [*trainer.params, *(p.grad for p in trainer.params if p.grad is not None),
               *(v for s in trainer.optimizer.state.values() for v in s.values() if torch.is_tensor(v))]
    return sum(t.numel() * t.element_size() for t in tensors)


def max_rel_diff(got: dict, want: dict) -> float:
    """Largest difference relative to each tensor's largest magnitude (an element near zero has no
    relative precision of its own)."""
    return max(((got[n] - want[n]).abs().max() / want[n].abs().max().clamp(min=1e-30)).item() for n in want)


def make_groups(cfg: TrainerBenchConfig, vocab: int, step: int) -> list[Group]:
    """Random prompts and responses of the configured lengths, rewards and behaviour log-probs: the
    trainer's cost does not depend on what the tokens say."""
    rng = random.Random(cfg.seed * 1000 + step)
    groups = []
    for g in range(cfg.groups):
        prompt = [rng.randrange(3, vocab) for _ in range(cfg.prompt_len)]
        samples = []
        for j in range(cfg.n):
            length = rng.randint(cfg.response_len // 2, cfg.response_len)
            samples.append(Sample(uid=f"{step}:{g}:{j}", prompt_ids=prompt,
                                  response_ids=[rng.randrange(3, vocab) for _ in range(length)],
                                  logprobs=[-rng.uniform(0.5, 8.0) for _ in range(length)], versions=[step] * length,
                                  finish_reason="length", reward=float(rng.random() < 0.5)))
        groups.append(Group(index=g, row_index=g, data_source="bench", ground_truth=None, extra_info={},
                            samples=samples))
    return groups


def render(result: dict) -> Table:
    c = result["config"]
    table = Table(title=f"trainer, {c['model']} fp32, {c['groups']} groups x {c['n']} of {c['prompt_len']}+"
                        f"{c['response_len']} tokens, {result['machine']['cpus']} CPUs")
    for col in ("world size", "params+grads+AdamW per rank (MiB)", "vs world 1", "step s", "grad rel diff vs world 1"):
        table.add_column(col, justify="right")
    base = result["results"][0]["param_grad_optim_bytes_per_rank"]
    for r in result["results"]:
        nbytes = r["param_grad_optim_bytes_per_rank"]
        table.add_row(str(r["world_size"]), f"{nbytes / 2**20:.1f}", f"{nbytes / base:.3f}", f"{r['step_s']:.2f}",
                      f"{r['grad_max_rel_diff_vs_world1']:.1e}")
    return table


__all__ = ["TrainerBenchConfig", "bench_trainer", "render"]
