"""What a verify step costs on some hardware, as HistoSpec's budget takes it before it has measured any:
the prior of `SpecBudget` (docs/engine.md, "The GPU check").

A verify curve gives, per batch size, the cost of a verify step of n positions per request relative to
a plain decode step of that batch (`relative`, 1.0 = a plain step's time). On a memory-bound GPU step
it stays near 1 for small n (every accepted draft token nearly free); on a CPU it grows about linearly
with the positions computed. `make gpu-check` measures it (`shapes[].verify[]` of its JSON); any JSON
with the same rows serves. Between measured batch sizes the relative cost is interpolated in log batch,
and between measured n linearly; outside them the nearest measured value holds.

Pure: no torch, no clock; `load_verify_curve` is the one function that reads a file.
"""

from __future__ import annotations

import bisect
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class VerifyCurve:
    rows: Mapping[int, tuple[tuple[int, float], ...]]
    """Batch size -> (positions per request n, verify step's time over a plain step's), n ascending."""
    source: str = ""
    """Where it came from (a file and shape), for the run's log."""

    def __post_init__(self):
        if not self.rows:
            raise ValueError("a verify curve needs at least one batch size")
        for batch, points in self.rows.items():
            if batch < 1 or not points:
                raise ValueError(f"verify curve: batch {batch} needs a batch >= 1 and at least one point")
            for n, relative in points:
                if n < 1 or not math.isfinite(relative) or relative <= 0:
                    raise ValueError(f"verify curve: batch {batch}, n={n}: relative cost {relative} is not a "
                                     "positive number")

    @classmethod
    def from_rows(cls, rows: Sequence[Mapping], source: str = "") -> VerifyCurve:
        """From `make gpu-check`'s rows: each {"batch": b, "positions": [n...], "relative": [r...]}."""
        parsed = {}
        for row in rows:
            if len(row["positions"]) != len(row["relative"]):
                raise ValueError(f"verify curve: batch {row.get('batch')}: positions and relative differ in length")
            points = sorted(zip(row["positions"], row["relative"]))
            parsed[int(row["batch"])] = tuple((int(n), float(r)) for n, r in points)
        return cls(parsed, source)

    def relative(self, batch: int, n: int) -> float:
        """A verify step of `n` positions per request over a plain step, at `batch` requests."""
        batches = sorted(self.rows)
        if batch <= batches[0] or batch >= batches[-1]:
            return _along(self.rows[batches[0] if batch <= batches[0] else batches[-1]], n)
        upper = bisect.bisect_left(batches, batch)  # a measured batch is its own `hi` (t = 1)
        lo, hi = batches[upper - 1], batches[upper]
        t = (math.log(batch) - math.log(lo)) / (math.log(hi) - math.log(lo))
        return (1 - t) * _along(self.rows[lo], n) + t * _along(self.rows[hi], n)

    def positions(self, batch: int) -> list[int]:
        """The n measured at the batch size nearest `batch` (in log batch): where the prior has points."""
        nearest = min(self.rows, key=lambda b: abs(math.log(b) - math.log(max(batch, 1))))
        return [n for n, _ in self.rows[nearest]]


def _along(points: Sequence[tuple[int, float]], n: int) -> float:
    if n <= points[0][0]:
        return points[0][1]
    if n >= points[-1][0]:
        return points[-1][1]
    i = bisect.bisect_left([p for p, _ in points], n)
    (n0, r0), (n1, r1) = points[i - 1], points[i]
    return r0 + (r1 - r0) * (n - n0) / (n1 - n0)


def load_verify_curve(spec: str, setting: str = "engine.spec_verify_curve") -> VerifyCurve:
    """`PATH` or `PATH:SHAPE`: a `make gpu-check` JSON and the shape whose curve to take (default: its
    first shape with one). ValueError naming the `setting`, the file and what is wrong."""
    path, _, shape = spec.partition(":") if not Path(spec).is_file() else (spec, "", "")
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"{setting}={spec}: cannot read a JSON from {path}: {e}") from None
    shapes = [s for s in data.get("shapes", []) if s.get("verify")]
    chosen = [s for s in shapes if not shape or s.get("shape") == shape]
    if not chosen:
        have = ", ".join(str(s.get("shape")) for s in shapes) or "none"
        raise ValueError(f"{setting}={spec}: no verify curve for shape {shape or '(any)'!r} in "
                         f"{path} (shapes with one: {have})")
    return VerifyCurve.from_rows(chosen[0]["verify"], f"{path}:{chosen[0].get('shape')}")


__all__ = ["VerifyCurve", "load_verify_curve"]
