"""`rlboost bench weights --patches`: what lossless patches save on real GRPO steps, and what that
buys a rollout instance behind a link.

1. Bytes (`results` rows without `link`): for each model and learning rate, `steps` real GRPO steps
   (`rlboost.bench.grpo`, the showcase's task). After each, the trainer's fp32 weights are published as
   version `step` by two publishers side by side, one per wire dtype (bf16, fp32). A row per
   (model, lr, dtype, step): `changed_share` (elements whose bits moved since the step before),
   `full_bytes`, `patch_bytes` (from the version before), `from_base_bytes` (cumulative, from the model
   as loaded) and `bit_identical`: a worker that reached the version by patch, and a joiner that reached
   it from its base, hold bit for bit what a full pull gives.
2. Fan-out (rows with `fanout`): 1, 4 and 16 hosts fetch the same version at once, every link and the
   trainer's own uplink at `link`: `full_s` the slowest fetch of the full version (bf16), `patch_s` of a
   patch; `source_floor_s` is fanout x bytes over the trainer's uplink (every byte from the trainer),
   `link_floor_s` bytes over one link (every host fed at its own rate at once, as peers serving peers
   at best would).
3. Links (rows with `link` and `mode`): in a room of emulated hosts (`rlboost.cluster.hosts`), one reserved host
   and spot hosts behind a `tbf`-shaped link of each rate: the base model is version 0, the first
   model's weights after `steps - 1` and `steps` GRPO steps at the first lr are versions 1 and 2 (bf16).
   `join_s`: a spot instance from launch to serving version 1 (host, Ray node, worker, weights), `mode`
   `from_base` (its base read from its disk, the cumulative patch pulled) or `full`; `pull_s` the pull
   alone, `pulled_bytes` what it fetched; `refresh_s`: the same instance from serving version 1 to
   serving version 2, by `patch` or `full`.
"""

from __future__ import annotations

import dataclasses
import gc
import json
import zlib
from pathlib import Path

import numpy as np

from rlboost.cluster.config import ClusterConfig, WeightsConfig
from rlboost.cluster.host_copy import HostCopy
from rlboost.cluster.hosts import HostEntry, link_bits_s
from rlboost.cluster.publisher import Publisher
from rlboost.cluster.ray_cluster import Cluster
from rlboost.cluster.resources import PREEMPTIBLE, RESERVED
from rlboost.data import arithmetic_rows
from rlboost.engine import EngineConfig, LLMEngine
from rlboost.bench.grpo import grpo_steps
from rlboost.hybrid.config import HybridConfig
from rlboost.hybrid.fleet import Fleet
from rlboost.hybrid.manager import RolloutManager
from rlboost.hybrid.worker import WorkerSpec
from rlboost.models import ModelConfig, load_model

DTYPES = ("bfloat16", "float32")
LINK_DTYPE = "bfloat16"
"""The wire dtype of the fan-out and link parts (a bf16 engine's)."""


def save_versions(folder: str, versions: dict[int, dict], about: dict) -> None:
    """The link parts' versions in `folder` (one safetensors file per step, in LINK_DTYPE: the bytes
    those parts publish) with `about` (model, lr, steps, seed) beside them."""
    import torch
    from safetensors.torch import save_file

    path = Path(folder)
    path.mkdir(parents=True, exist_ok=True)
    for step, weights in versions.items():
        save_file({n: t.to(getattr(torch, LINK_DTYPE)).contiguous() for n, t in weights.items()},
                  path / f"step{step}.safetensors")
    (path / "about.json").write_text(json.dumps({**about, "steps_kept": sorted(versions)}) + "\n")


def saved_steps(folder: str, about: dict) -> list[int] | None:
    """The steps `save_versions` left in `folder`, or None where it left none; ValueError where they
    are of another model, lr, step count or seed than `about` says."""
    path = Path(folder) / "about.json"
    if not path.exists():
        return None
    saved = json.loads(path.read_text())
    if {k: saved.get(k) for k in about} != about:
        raise ValueError(f"--versions-dir {folder} holds the versions of {saved}, not of {about}")
    return saved["steps_kept"]


def load_versions(folder: str, steps: list[int]) -> dict[int, dict]:
    from safetensors.torch import load_file

    return {step: load_file(Path(folder) / f"step{step}.safetensors") for step in steps}


def byte_rows(model: str, lr: float, steps: int, max_tokens: int, seed: int, keep: tuple[int, ...] = (),
              per_step: int = 8, on_rows=lambda rows: None):
    """Rows of part 1 for one model and lr (in a Ray the caller started); also the weights after each
    step in `keep` (and the base, as step 0), for the link rows. `on_rows(rows so far)` after each step."""
    loaded = load_model(ModelConfig(path=model))
    rows = arithmetic_rows(64, seed, "train")
    prompts = [list(loaded.tokenizer.apply_chat_template(r.prompt, add_generation_prompt=True, tokenize=True,
                                                         return_dict=True)["input_ids"]) for r in rows]
    engine = LLMEngine(load_model(ModelConfig(path=model)).model, EngineConfig(device="cpu", max_num_seqs=32),
                       eos_token_ids=loaded.eos_token_ids)
    base = {n: p.detach().clone() for n, p in loaded.model.named_parameters()}
    kept = {0: base} if 0 in keep else {}
    # every patch is encoded and counted, however large (max_patch_share=1)
    store = WeightsConfig(max_patch_share=1.0)
    publishers = {d: Publisher(store, d) for d in DTYPES}
    workers = {d: HostCopy() for d in DTYPES}
    for d in DTYPES:
        m = publishers[d].publish(list(base.items()), 0).manifest
        workers[d].pull(m, m.fingerprint, 600)
    out = []
    for step, grpo in enumerate(grpo_steps(loaded, engine, rows, prompts, lr=lr, steps=steps,
                                           max_tokens=max_tokens, seed=seed, per_step=per_step), start=1):
        weights = grpo.weights
        if step in keep:
            kept[step] = {n: t.clone() for n, t in weights.items()}
        for d in DTYPES:
            p = publishers[d]
            m = p.publish(list(weights.items()), step).manifest
            full = p.last_bytes  # what was put in the store, byte for byte
            by_patch = workers[d].pull(m, m.fingerprint, 600)
            joiner = HostCopy(load_base=lambda: base).pull(m, m.fingerprint, 600)
            identical = all(np.array_equal(a, b) and np.array_equal(a, c) for a, b, c in
                            zip(full, by_patch.weights.arrays, joiner.weights.arrays))
            out.append({"model": model, "dtype": d, "lr": lr, "step": step, "reward_mean": grpo.reward_mean,
                        "groups_with_signal": grpo.groups_with_signal, "grad_norm": grpo.grad_norm,
                        "changed_share": p.stats.changed_share,
                        "full_bytes": p.stats.full_bytes, "patch_bytes": p.stats.patch_bytes,
                        "from_base_bytes": p.stats.from_base_bytes, "encode_s": p.stats.encode_s,
                        "patch_mode": by_patch.result.mode, "joiner_mode": joiner.result.mode,
                        "bit_identical": identical and [zlib.crc32(a) for a in full] == [b.crc32 for b in m.buckets]})
            del full, by_patch, joiner, m
            gc.collect()  # the joiner's copies and fetched parts go now, not at some later collection
        on_rows(out)
    return out, kept


def fanout_rows(model: str, versions: dict[int, dict], counts: list[int], link: str, bucket_mb: float) -> list[dict]:
    """Rows of part 2 (the caller is inside a room)."""
    import ray

    from rlboost.bench.weights import _Fetcher

    steps, bits, out = sorted(versions), link_bits_s(link), []
    for count in counts:
        hosts = [HostEntry(kind="reserved", name="res-0", cpus=2), HostEntry(kind="preemptible", count=count, link=link)]
        cluster = Cluster(dataclasses.replace(ClusterConfig(), hosts=hosts), "hosts")
        try:
            cluster.room.set_head_link(bits)
            publisher = Publisher(WeightsConfig(bucket_mb=bucket_mb), LINK_DTYPE)
            publisher.publish(list(versions[steps[1]].items()), 1)
            m = publisher.publish(list(versions[steps[2]].items()), 2).manifest
            patch = next((p for p in m.patches if not p.base), None)
            nodes = [cluster.start_node({f"probe-{i}": 1}) for i in range(count)]
            fetchers = [_Fetcher.options(resources={f"probe-{i}": 1}).remote() for i in range(count)]
            ray.get([f.__ray_ready__.remote() for f in fetchers])
            full_s = max(ray.get([f.fetch.remote([b.ref for b in m.buckets]) for f in fetchers]))
            patch_s = max(ray.get([f.fetch.remote(patch.parts) for f in fetchers])) if patch else float("nan")
            out.append({"model": model, "fanout": count, "fanout_link": link, "full_bytes": m.nbytes,
                        "patch_bytes": patch.nbytes if patch else 0, "full_s": full_s, "patch_s": patch_s,
                        "source_floor_s": count * m.nbytes * 8 / bits, "link_floor_s": m.nbytes * 8 / bits})
            del fetchers
            for node in nodes:
                node.end()
        finally:
            cluster.shutdown()
    return out


def link_rows(model: str, versions: dict[int, dict], links: list[str], bucket_mb: float) -> list[dict]:
    """Rows of part 2: one room per link rate (the caller is inside a room)."""
    out = []
    for link in links:
        for mode in ("from_base", "full"):
            out.append(_join_and_refresh(model, versions, link, mode, bucket_mb))
    return out


def _join_and_refresh(model: str, versions: dict[int, dict], link: str, mode: str, bucket_mb: float) -> dict:
    patches = mode == "from_base"
    hosts = [HostEntry(kind="reserved", name="res-0", cpus=2), HostEntry(kind="preemptible", count=1, link=link)]
    weights = WeightsConfig(bucket_mb=bucket_mb, patches=patches, join_from_base=patches)
    cluster = Cluster(dataclasses.replace(ClusterConfig(), hosts=hosts, weights=weights), "hosts")
    hybrid = HybridConfig(num_preemptible=1, instances="hosts")
    spec = WorkerSpec(ModelConfig(path=model), EngineConfig(device="cpu", max_num_seqs=4, dtype=LINK_DTYPE), [],
                      heartbeat_interval_s=0.5, join_from_base=patches)
    fleet = Fleet(hybrid, spec, RolloutManager(hybrid, cluster.cfg.weights), cluster)
    try:
        steps = sorted(versions)
        fleet.publish(versions[steps[0]], 0)  # the base: what every host has on its disk
        fleet.start(RESERVED, 1)
        fleet.wait_ready(timeout_s=1800)
        fleet.publish(versions[steps[1]], 1)
        fleet.wait_ready(timeout_s=1800)
        fleet.manager.pulls.take_stats()
        fleet.start(PREEMPTIBLE, 1)
        fleet.wait_ready(timeout_s=1800)
        joined = fleet.manager.pulls.take_stats()
        (_, join_pull_s, join_bytes, join_mode), = [p for p in joined.pulls if p[0].startswith("pree")]
        fleet.publish(versions[steps[2]], 2)
        fleet.wait_ready(timeout_s=1800)
        refreshed = [p for p in fleet.manager.pulls.take_stats().pulls if p[0].startswith("pree")]
        (_, refresh_s, refresh_bytes, refresh_mode), = refreshed
        return {"model": model, "link": link, "mode": join_mode, "join_s": joined.provision_s[0],
                "pull_s": join_pull_s, "pulled_bytes": join_bytes, "refresh_mode": refresh_mode,
                "refresh_s": refresh_s, "refresh_bytes": refresh_bytes, "full_bytes": fleet.manifest.nbytes}
    finally:
        fleet.shutdown()
        cluster.shutdown()
