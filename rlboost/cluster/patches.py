"""Lossless weight patches: one bucket of version v as the difference from the same bucket of an
earlier version, in the bytes the weights travel in (the engine's dtype).

Contract:
- `encode(old, new, itemsize)` -> the patch's bytes. `old` and `new` are flat uint8 arrays of one
  bucket (the same tensors at the same offsets), `itemsize` the bytes per element (any size that
  divides every tensor's element size gives the same result; the dtype's own compresses best).
- `changed_share(old, new, itemsize)`: the share of elements that differ, a cheap look that lets a
  publisher skip encoding a patch that would be too large to pay (fp32 after Adam: nearly all).
- `apply(buf, patch)` turns `buf` (a writable copy of `old`) into `new` in place, bit for bit, and
  returns the indices of the elements it changed. A malformed patch raises `PatchError`; the caller
  still verifies the bucket's checksum, since a well-formed patch applied to the wrong base yields
  wrong bytes without any error here.

Encoding, and why: after an RL step most elements of a bf16 model keep every bit (the update is
below half a unit in the last place), so a patch names the positions that changed and what changed:
- positions as the gaps between changed element indices (uint32) when few change, or as a bitmap
  when many do (below about 1 in 50 the gaps compress smaller, above it the bitmap does; measured
  on SmolLM2 GRPO-like steps);
- values as old XOR new, split into byte planes: a small update flips low mantissa bits, so the high
  planes (sign, exponent) are almost all zero and compress several-fold, where the new values
  themselves hardly compress at all;
- each part through zstd (the `zstandard` library), which finds the runs and skewed bytes.
Pure numpy and zstandard: neither torch nor Ray.
"""

from __future__ import annotations

import struct

import numpy as np
import zstandard

MAGIC = b"RLBP1"
_HEADER = struct.Struct("<5sBBQQQ")
"""magic, itemsize, positions encoding, elements in the bucket, elements changed, bytes of positions."""
_GAPS, _BITMAP = 0, 1
GAPS_BELOW = 1 / 50
"""Changed share under which positions go as gaps, at or over which as a bitmap."""
_LEVEL = 3
"""zstd's level: 3 (its default) compresses SmolLM2's patches within a few percent of level 9 at several
times the speed; publishing sits on the step's critical path."""
_UINT = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


class PatchError(ValueError):
    """A patch that cannot be applied: not a patch, for another layout, or torn."""


def changed_share(old: np.ndarray, new: np.ndarray, itemsize: int) -> float:
    """The share of elements whose bits differ (a cheap look before encoding)."""
    a, b = _elements(old, itemsize), _elements(new, itemsize)
    return float(np.count_nonzero(a != b)) / max(a.size, 1)


def encode(old: np.ndarray, new: np.ndarray, itemsize: int) -> bytes:
    """The patch that turns `old` into `new` (see the module docstring)."""
    if old.nbytes != new.nbytes:
        raise PatchError(f"buckets of {old.nbytes} and {new.nbytes} bytes have different layouts")
    a, b = _elements(old, itemsize), _elements(new, itemsize)
    flips = np.bitwise_xor(a, b)
    where = np.flatnonzero(flips)
    if where.size < GAPS_BELOW * a.size:
        how = _GAPS
        positions = np.diff(where, prepend=-1).astype(np.uint32).tobytes()
    else:
        how = _BITMAP
        positions = np.packbits(flips != 0).tobytes()
    z = zstandard.ZstdCompressor(level=_LEVEL)
    positions = z.compress(positions)
    planes = np.ascontiguousarray(flips[where].view(np.uint8).reshape(-1, itemsize).T)
    header = _HEADER.pack(MAGIC, itemsize, how, a.size, where.size, len(positions))
    return header + positions + z.compress(planes.tobytes())


def apply(buf: np.ndarray, patch: bytes | np.ndarray) -> np.ndarray:
    """Apply `patch` to `buf` in place; returns the changed element indices (int64)."""
    patch = memoryview(patch).cast("B")
    if len(patch) < _HEADER.size:
        raise PatchError(f"a patch of {len(patch)} bytes is shorter than its header")
    magic, itemsize, how, count, changed, npos = _HEADER.unpack_from(patch)
    if magic != MAGIC or itemsize not in _UINT or how not in (_GAPS, _BITMAP):
        raise PatchError("not a weight patch (bad header)")
    if count * itemsize != buf.nbytes or changed > count or _HEADER.size + npos > len(patch):
        raise PatchError(f"a patch for {count} elements of {itemsize} bytes does not fit a bucket of {buf.nbytes} bytes")
    body = bytes(patch[_HEADER.size:])
    d = zstandard.ZstdDecompressor()
    try:
        positions = d.decompress(body[:npos])
        planes = d.decompress(body[npos:])
    except zstandard.ZstdError as e:
        raise PatchError(f"a patch's data is torn: {e}") from None
    if how == _GAPS:
        if len(positions) != 4 * changed:
            raise PatchError("a patch's positions are torn")
        where = np.cumsum(np.frombuffer(positions, dtype=np.uint32), dtype=np.int64) - 1
        if changed and (where[-1] >= count or where[0] < 0):
            raise PatchError("a patch names positions outside its bucket")
    else:
        bits = np.unpackbits(np.frombuffer(positions, dtype=np.uint8), count=count) if len(positions) * 8 >= count \
            else None
        if bits is None:
            raise PatchError("a patch's bitmap is torn")
        where = np.flatnonzero(bits)
        if where.size != changed:
            raise PatchError("a patch's bitmap is torn")
    if len(planes) != changed * itemsize:
        raise PatchError("a patch's values are torn")
    flips = np.frombuffer(planes, dtype=np.uint8).reshape(itemsize, changed).T.copy().view(_UINT[itemsize]).reshape(-1)
    elements = _elements(buf, itemsize)
    elements[where] ^= flips
    return where


def _elements(flat: np.ndarray, itemsize: int) -> np.ndarray:
    if itemsize not in _UINT:
        raise PatchError(f"no patches for elements of {itemsize} bytes")
    return flat.view(np.uint8).view(_UINT[itemsize])


__all__ = ["GAPS_BELOW", "PatchError", "apply", "changed_share", "encode"]
