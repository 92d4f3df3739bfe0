"""Slot-based KV cache with compaction.

Slot i holds the keys and values of the i-th running sequence, for every layer, in one tensor of shape
[layers, slots, kv_heads, capacity, head_dim]. The engine keeps running sequences in slots
0..n-1 with no holes (a leaving sequence's slot is filled by the last one), so a decode step reads
the batch's keys as the contiguous view `k[layer, :n, :, :length]`: no gather, no block tables.
Both dimensions grow by doubling on demand (up to max_slots and max_len), so a short workload does
not pay for the model's full context. New memory is zeroed: stale positions are masked out, but
attention multiplies them by zero, and 0 * NaN from uninitialised memory would poison the output.
"""

from __future__ import annotations

import torch


class KVCache:
    def __init__(self, num_layers: int, num_kv_heads: int, head_dim: int, max_slots: int, max_len: int,
                 dtype: torch.dtype, device: torch.device, init_len: int = 256):
        self.shape_tail = (num_kv_heads, head_dim)
        self.num_layers = num_layers
        self.max_slots = max_slots
        self.max_len = max_len
        self.init_len = min(init_len, max_len)
        self.dtype = dtype
        self.device = device
        self.k: torch.Tensor | None = None
        self.v: torch.Tensor | None = None

    @property
    def slots(self) -> int:
        return 0 if self.k is None else self.k.shape[1]

    @property
    def capacity(self) -> int:
        return 0 if self.k is None else self.k.shape[3]

    @property
    def nbytes(self) -> int:
        return 0 if self.k is None else 2 * self.k.numel() * self.k.element_size()

    def reserve(self, slots: int, length: int) -> None:
        """Make room for `slots` sequences of up to `length` tokens each."""
        if slots > self.max_slots or length > self.max_len:
            raise ValueError(f"KV cache request ({slots} slots x {length} tokens) exceeds its limits "
                             f"({self.max_slots} x {self.max_len})")
        if slots <= self.slots and length <= self.capacity:
            return
        new_slots = max(self.slots, 1)
        while new_slots < slots:
            new_slots = min(2 * new_slots, self.max_slots)
        new_len = max(self.capacity, self.init_len)
        while new_len < length:
            new_len = min(2 * new_len, self.max_len)
        kv_heads, head_dim = self.shape_tail
        shape = (self.num_layers, new_slots, kv_heads, new_len, head_dim)
        k = torch.zeros(shape, dtype=self.dtype, device=self.device)
        v = torch.zeros(shape, dtype=self.dtype, device=self.device)
        if self.k is not None:
            k[:, : self.slots, :, : self.capacity] = self.k
            v[:, : self.slots, :, : self.capacity] = self.v
        self.k, self.v = k, v

    def move(self, src: int, dst: int, length: int) -> None:
        """Copy the first `length` positions of slot `src` into slot `dst` (all layers)."""
        self.k[:, dst, :, :length] = self.k[:, src, :, :length]
        self.v[:, dst, :, :length] = self.v[:, src, :, :length]

    def release(self) -> None:
        self.k = self.v = None
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
