"""What this device can do at best: dense matmul FLOP/s and memory copy bandwidth, measured now."""

from __future__ import annotations

import platform
import time
from pathlib import Path

import torch


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timings(fn, device: torch.device, repeats: int) -> list[float]:
    """Seconds of each of `repeats` calls of `fn`, after one warm-up call, the device synchronised."""
    fn()
    _sync(device)
    out = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        _sync(device)
        out.append(time.perf_counter() - start)
    return out


def _best_time(fn, device: torch.device, repeats: int) -> float:
    return min(timings(fn, device, repeats))


def matmul_flops(device: torch.device, dtype: torch.dtype) -> float:
    """Peak-ish FLOP/s of a large square matmul in `dtype` (best of several runs)."""
    n = 2048 if device.type == "cpu" else 8192
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    return 2 * n**3 / _best_time(lambda: a @ b, device, repeats=5 if device.type == "cpu" else 20)


def memory_bandwidth(device: torch.device) -> float:
    """Bytes per second moved by a large tensor copy (read + write), STREAM-copy style."""
    numel = (256 if device.type == "cpu" else 2048) * 2**20 // 4
    src = torch.empty(numel, device=device, dtype=torch.float32).fill_(1.0)
    dst = torch.empty_like(src)
    return 2 * src.numel() * 4 / _best_time(lambda: dst.copy_(src), device, repeats=5)


def launch_latency(device: torch.device, launches: int = 2000) -> float:
    """Seconds per launch of a tiny op, queued back to back (one sync at the end): the host's cost of a
    kernel, which bounds a step of many small kernels whatever the device's speed."""
    x = torch.zeros(16, device=device)
    def queue():
        for _ in range(launches):
            x.add_(1.0)
    return _best_time(queue, device, repeats=3) / launches


def device_name(device: torch.device) -> str:
    """The GPU's name, or the CPU model with its core count."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    cpuinfo = Path("/proc/cpuinfo")
    model = platform.processor() or "cpu"
    if cpuinfo.is_file():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    return f"{model}, {torch.get_num_threads()} threads"
