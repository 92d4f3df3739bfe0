"""`make gpu-check`: what a GPU does for rlboost, measured in one short run on a bare machine, as one JSON.

Made for a lent GPU machine that reaches no package registry (docs/engine.md, "The GPU check"): it
needs only torch, transformers, safetensors and numpy (zstandard for the patch figures, carried as
an unpacked wheel where the machine lacks it), never OmegaConf, Ray or rich, downloads nothing, and
stops starting new measurements once `budget_s` is spent (each left out is named in `skipped`).
Models are random-initialised at real shapes (`SHAPES`), so no checkpoint travels.

Each figure stands beside its baseline, measured in the same run:
- `decode`: rlboost's engine decode tokens/s per batch, against HF `generate` on the same greedy batch
  and against the bandwidth roofline (weights and the KV read per step over the measured copy bandwidth);
- `verify`: the model forward of a verify step of n positions per request relative to a plain decode
  step at the same batch and context (the curve HistoSpec's budget weighs drafts with:
  `rlboost.policies.spec_budget`);
- `train`: a forward and backward over prompt+response sequences (`response_logprobs`, the trainer's),
  tokens/s; `weight_load`: an in-place load of a whole version from host memory (`LLMEngine.load_weights`);
- `patch`: `rlboost.cluster.patches` encode and apply GB/s on a bucket of the model's own weights after a
  small update (host-side work, beside the copy bandwidth).
The same code runs on a CPU with the `tiny` shape (`tests/test_gpu_check.py`), so it cannot rot while no
GPU is at hand. JSON keys: docs/engine.md.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import time
import traceback
from dataclasses import asdict
from pathlib import Path

import torch

from rlboost.bench import hardware
from rlboost.bench.gpu_sections import (SHAPES, GpuCheckConfig, BudgetClock, decode_rows, greedy_gap, model_size,
                                        patch_row, random_model, step_profile_row, train_row, verify_rows,
                                        weight_load_row)
from rlboost.engine.engine import resolve_device

def gpu_check(cfg: GpuCheckConfig, log=print, progress=None) -> dict:
    """Every figure, per shape in order; `progress(result)` after each shape (the partial result: what a run
    cut short by its lease still leaves). A section that raises is recorded in `errors` and the rest goes on."""
    import transformers

    device = resolve_device(cfg.device, key="gpu_check.device")
    dtype = getattr(torch, cfg.dtype)
    clock = BudgetClock(cfg.budget_s)
    bandwidth = hardware.memory_bandwidth(device)
    result: dict = {
        "device": str(device), "device_name": hardware.device_name(device), "torch": torch.__version__,
        "transformers": transformers.__version__, "python": sys.version.split()[0], "dtype": cfg.dtype,
        "copy_bytes_per_s": bandwidth, "matmul_flops": hardware.matmul_flops(device, dtype),
        "config": asdict(cfg), "shapes": [], "patch": None,
    }
    errors: list[dict] = []

    def measured(what: str, fn):
        """fn()'s figure, or None with the failure recorded: one broken section (the first CUDA run of a
        path) must not cost the figures of the others, on a lease that may not come again."""
        try:
            return fn()
        except Exception as e:  # noqa: BLE001 - recorded in the JSON and printed, then the next section
            errors.append({"what": what, "error": f"{type(e).__name__}: {e}",
                           "traceback": traceback.format_exc(limit=-8)})
            log(f"{what}: FAILED {type(e).__name__}: {e}")
            traceback.print_exc()
            return None
        finally:
            if device.type == "cuda":
                torch.cuda.empty_cache()

    result.update(errors=errors, skipped=clock.skipped)  # the same lists, filled as the check goes
    for shape in cfg.shapes:
        if not clock.allows(f"{shape}"):
            continue
        row: dict = {"shape": shape}
        size = measured(f"{shape} build", lambda: model_size(shape, dtype, device, cfg.seed))
        if size is None:
            continue
        row.update(size)
        log(f"{shape}: {row['parameters'] / 1e6:.0f}M parameters, decode ...")
        row["decode"] = measured(f"{shape} decode", lambda: decode_rows(cfg, shape, device, dtype, bandwidth, clock)) or []
        log(f"{shape}: verify curve ...")
        row["verify"] = measured(f"{shape} verify", lambda: verify_rows(cfg, shape, device, dtype, clock)) or []
        if clock.allows(f"{shape} step profile"):
            if (prof := measured(f"{shape} step profile", lambda: step_profile_row(shape, device, dtype, cfg.seed))):
                row["step_profile"] = prof
        if clock.allows(f"{shape} trainer step"):
            log(f"{shape}: trainer step ...")
            if (train := measured(f"{shape} trainer step", lambda: train_row(cfg, shape, device, dtype))) is not None:
                row["train"] = train
        if clock.allows(f"{shape} weight load"):
            if (load := measured(f"{shape} weight load", lambda: weight_load_row(cfg, shape, device, dtype))) is not None:
                row["weight_load"] = load
        result["shapes"].append(row)
        result["elapsed_s"] = time.perf_counter() - clock.start
        if progress is not None:
            progress(result)
    if cfg.shapes and clock.allows("patch encode/apply"):
        if importlib.util.find_spec("zstandard") is None:
            clock.skipped.append("patch encode/apply: zstandard is not installed for this Python (make gpu-check-deps "
                                 "where the registry is reachable, and carry .gpu-check)")
        else:
            result["patch"] = measured("patch encode/apply", lambda: patch_row(cfg, cfg.shapes[0], device, dtype))
    result["elapsed_s"] = time.perf_counter() - clock.start
    return result


def summary(result: dict) -> str:
    """A few lines for the log: each shape's decode and verify figures beside their baselines."""
    lines = [f"{result['device_name']} ({result['device']}, torch {result['torch']}, {result['dtype']}): copy "
             f"{result['copy_bytes_per_s'] / 1e9:.0f} GB/s, matmul {result['matmul_flops'] / 1e12:.1f} TFLOP/s"]
    for row in result["shapes"]:
        for d in row["decode"]:
            hf = f", {d['engine_vs_hf']:.2f}x HF" if "engine_vs_hf" in d else ""
            if "greedy_gap_max" in d:
                hf += f", greedy gap max {d['greedy_gap_max']:.3f} (logit spread {d['logit_spread']:.2f})"
            lines.append(f"  {row['shape']} decode b{d['batch']}: {d['engine_tokens_per_s']:,.0f} tok/s{hf}, "
                         f"{d['engine_vs_roofline']:.0%} of roofline")
        for v in row["verify"]:
            curve = " ".join(f"{n}:{r:.2f}" for n, r in zip(v["positions"], v["relative"]))
            lines.append(f"  {row['shape']} verify b{v['batch']} (n: step / plain step): {curve}")
        if "step_profile" in row:
            p = row["step_profile"]
            lines.append(f"  {row['shape']} b1 step {p['step_s'] * 1e3:.1f} ms: {p['launches']} launches x "
                         f"{p['launch_latency_s'] * 1e6:.1f} us = {p['launch_bound_share']:.0%} of it")
        if "train" in row:
            lines.append(f"  {row['shape']} trainer fwd+bwd: {row['train']['tokens_per_s']:,.0f} tok/s")
        if "weight_load" in row:
            lines.append(f"  {row['shape']} weight load: {row['weight_load']['bytes_per_s'] / 1e9:.1f} GB/s")
    if result["patch"]:
        p = result["patch"]
        lines.append(f"  patch: {p['changed_share']:.1%} changed, encode {p['encode_bytes_per_s'] / 1e9:.2f} GB/s, "
                     f"apply {p['apply_bytes_per_s'] / 1e9:.2f} GB/s")
    lines += [f"  skipped: {s}" for s in result["skipped"]]
    lines += [f"  FAILED {e['what']}: {e['error']}" for e in result.get("errors", [])]
    return "\n".join(lines)


QUICK_DTYPE = "float32"
"""--quick's dtype: a CPU's bf16 matmuls are emulated, tens of times slower than fp32."""


def _int_list(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rlboost.bench.gpu_check", description=__doc__.split("\n")[0])
    parser.add_argument("--json", required=True, help="where the result goes")
    parser.add_argument("--device", default=GpuCheckConfig.device)
    parser.add_argument("--dtype", default=None, help=f"default {GpuCheckConfig.dtype} ({QUICK_DTYPE} with --quick)")
    parser.add_argument("--shapes", default=None, help=f"comma-separated, from {', '.join(SHAPES)}")
    parser.add_argument("--decode-batches", type=_int_list, default=None)
    parser.add_argument("--verify-batches", type=_int_list, default=None)
    parser.add_argument("--verify-positions", type=_int_list, default=None)
    parser.add_argument("--budget-s", type=float, default=GpuCheckConfig.budget_s)
    parser.add_argument("--quick", action="store_true", help="the CPU test's sizes: tiny shape, small batches")
    args = parser.parse_args(argv)
    cfg = GpuCheckConfig(device=args.device, budget_s=args.budget_s)
    if args.quick:
        cfg.dtype = QUICK_DTYPE
        cfg.shapes, cfg.decode_batches, cfg.verify_batches, cfg.verify_positions = ["tiny"], [1, 4], [1, 4], [1, 2, 4]
        cfg.prompt_len, cfg.new_tokens, cfg.train_batch, cfg.train_response_len = 16, 8, 2, 16
        cfg.timing_iters, cfg.repeats, cfg.patch_bucket_mb = 3, 1, 1.0
    cfg.dtype = args.dtype or cfg.dtype
    for name in ("shapes",):
        if getattr(args, name) is not None:
            setattr(cfg, name, [s for s in getattr(args, name).split(",") if s])
    for name in ("decode_batches", "verify_batches", "verify_positions"):
        if getattr(args, name) is not None:
            setattr(cfg, name, getattr(args, name))
    bad = [s for s in cfg.shapes if s not in SHAPES]
    if bad:
        print(f"error: --shapes: unknown shape {bad[0]!r}; choose from {', '.join(SHAPES)}", file=sys.stderr)
        return 2
    try:
        dtype = getattr(torch, cfg.dtype)
        if not isinstance(dtype, torch.dtype):
            raise AttributeError
        device = resolve_device(cfg.device, key="--device")
        if device.type == "cuda" and (device.index or 0) >= torch.cuda.device_count():
            raise ValueError(f"--device={cfg.device!r} but this machine has {torch.cuda.device_count()} CUDA devices")
    except AttributeError:
        print(f"error: --dtype: {cfg.dtype!r} is not a torch dtype", file=sys.stderr)
        return 2
    except (ValueError, RuntimeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    result = gpu_check(cfg, log=lambda line: print(line, flush=True),
                       progress=lambda partial: out.write_text(json.dumps(partial, indent=1)))
    out.write_text(json.dumps(result, indent=1))
    print(summary(result))
    print(f"wrote {args.json} in {result['elapsed_s']:.0f} s")
    if result["errors"]:
        print(f"error: {len(result['errors'])} measurement(s) failed: "
              + "; ".join(f"{e['what']}: {e['error']}" for e in result["errors"]), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())


__all__ = ["SHAPES", "GpuCheckConfig", "gpu_check", "greedy_gap", "main", "random_model", "summary"]
