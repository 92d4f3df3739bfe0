"""Spot-availability traces and their replay (`rollout.hybrid.trace.*`).

A `SpotTrace` is a step function of time: `counts[i]` preemptible instances are available from
`times_s[i]` until the next row; before the first row the first count holds, after the last row the
last count holds. The trace spans [0, times_s[-1]]: the last row marks its end (its count still counts
as a change, so a drop on the last row is a preemption event, but it has no duration in the mean).

`load_trace` turns a `TraceConfig` into the trace a run replays: file -> window -> sample -> compress.
`TraceReplay` decides, from that trace and the instances the runtime reports, what to start, warn,
kill and give back; `advance` steps it at every change a clock that jumps has passed over, so a
replay meets the same events however coarsely it is ticked. Everything here is pure: no clock (the
caller passes `now_s`: wall seconds, or the run's progress, `rlboost.spot.replay_clock`), no global
randomness (victims come from the replay's own seeded `random.Random`), no Ray, no torch; the real
provider (`rlboost.hybrid.providers.TraceProvider`) and a simulator drive the same objects.
"""

from __future__ import annotations

import bisect
import csv
import io
import math
import random
import re
from dataclasses import dataclass, field
from pathlib import Path

BUNDLED_TRACE = Path(__file__).with_name("traces") / "bamboo_aws_p3.csv"
"""Bamboo's AWS P3 spot trace (NSDI'23, MIT licence); see traces/README.md."""

SEGMENTS: dict[str, tuple[float, float]] = {"A": (2.0, 4.0), "B": (5.0, 7.0), "C": (8.0, 10.0)}
"""Named 2-hour windows of the bundled trace, (start, end) in hours: A abundant, B fluctuating, C scarce."""

HEADER = ("time_s", "available_instances")


@dataclass(frozen=True)
class SpotTrace:
    """Step function: `counts[i]` instances available from `times_s[i]` until the next time."""

    times_s: tuple[float, ...]
    counts: tuple[int, ...]

    def __post_init__(self) -> None:
        # Coerce lists to tuples so a trace is hashable and cannot be changed behind a replay's back.
        object.__setattr__(self, "times_s", tuple(float(t) for t in self.times_s))
        object.__setattr__(self, "counts", tuple(int(c) for c in self.counts))
        if not self.times_s:
            raise ValueError("a SpotTrace needs at least one row")
        if len(self.times_s) != len(self.counts):
            raise ValueError(f"SpotTrace: {len(self.times_s)} times but {len(self.counts)} counts")
        if self.times_s[0] < 0 or not all(math.isfinite(t) for t in self.times_s):
            raise ValueError("SpotTrace: times must be finite and >= 0")
        if any(b <= a for a, b in zip(self.times_s, self.times_s[1:])):
            raise ValueError("SpotTrace: times must be strictly increasing")
        if min(self.counts) < 0:
            raise ValueError("SpotTrace: counts must be >= 0")

    @classmethod
    def from_csv(cls, path: str | Path) -> SpotTrace:
        """Read a `time_s,available_instances` file; a bad file raises ValueError naming file and line."""
        path = Path(path)
        times: list[float] = []
        counts: list[int] = []
        rows = _csv_rows(path)
        if not rows:
            raise ValueError(f"{path}: empty file; expected the header `{','.join(HEADER)}` and data rows")
        line, header = rows[0]
        if tuple(c.strip() for c in header) != HEADER:
            raise ValueError(f"{path}:{line}: header is {','.join(header)!r}, expected `{','.join(HEADER)}`")
        for line, row in rows[1:]:
            if len(row) != 2:
                raise ValueError(f"{path}:{line}: expected 2 columns ({','.join(HEADER)}), got {len(row)}: {row}")
            t = _parse_time(path, line, row[0].strip())
            c = _parse_count(path, line, row[1].strip())
            if times and t <= times[-1]:
                raise ValueError(f"{path}:{line}: time_s {t:g} does not increase (previous row: {times[-1]:g})")
            times.append(t)
            counts.append(c)
        if not times:
            raise ValueError(f"{path}: no data rows after the header")
        return cls(tuple(times), tuple(counts))

    @property
    def duration_s(self) -> float:
        """The trace spans [0, duration_s]; the last row marks its end."""
        return self.times_s[-1]

    def available_at(self, t_s: float) -> int:
        """Instances available at `t_s`: the count of the last row at or before it (the first before the first)."""
        i = bisect.bisect_right(self.times_s, t_s) - 1
        return self.counts[max(i, 0)]

    def change_points(self, after_s: float, until_s: float) -> list[float]:
        """Row times in (after_s, until_s]: the moments the count may change."""
        lo = bisect.bisect_right(self.times_s, after_s)
        hi = bisect.bisect_right(self.times_s, until_s)
        return list(self.times_s[lo:hi])

    def segment(self, start_s: float, end_s: float) -> SpotTrace:
        """The window [start_s, end_s), rebased to start at 0 with the count in force at start_s.

        `end_s` beyond the trace's end is clipped to it; a window reaching the end keeps the final row
        as it is. A window ending earlier gets a closing row at its end repeating the count in force,
        so its duration is exactly end_s - start_s and a change at end_s belongs to the next window.
        """
        end = min(end_s, self.duration_s)
        if start_s < 0 or start_s >= end:
            raise ValueError(f"segment [{start_s:g}, {end_s:g}) s is empty or outside the trace "
                             f"[0, {self.duration_s:g}] s")
        times, counts = [0.0], [self.available_at(start_s)]
        for t, c in zip(self.times_s, self.counts):
            if start_s < t < end:
                times.append(t - start_s)
                counts.append(c)
        at_trace_end = end == self.duration_s
        times.append(end - start_s)
        counts.append(self.counts[-1] if at_trace_end else counts[-1])
        return _normalised(times, counts)

    def sampled(self, fraction: float) -> SpotTrace:
        """Keep `fraction` of the instances: floor(n * fraction) per row (the paper keeps 50%)."""
        if not 0 < fraction <= 1:
            raise ValueError(f"sample fraction must be in (0, 1], got {fraction}")
        # The epsilon keeps e.g. 0.29 * 100 = 28.999999999999996 from flooring to 28.
        counts = [math.floor(n * fraction + 1e-9) for n in self.counts]
        return _normalised(list(self.times_s), counts)

    def regrouped(self, trace_gpus: int, instance_gpus: int) -> SpotTrace:
        """The same GPUs counted in instances of another size: floor(n * trace_gpus / instance_gpus)
        per row. A trace of single-GPU VMs (the Bamboo P3 trace) offers half as many 2-GPU instances:
        a market with 15 free GPUs has 7 free pairs, not 15."""
        if trace_gpus < 1 or instance_gpus < 1:
            raise ValueError(f"GPUs per instance must be >= 1, got {trace_gpus} and {instance_gpus}")
        return _normalised(list(self.times_s), [n * trace_gpus // instance_gpus for n in self.counts])

    def compressed(self, factor: float) -> SpotTrace:
        """Times divided by `factor` (trace seconds per run second), so hours replay in minutes."""
        if not (factor > 0 and math.isfinite(factor)):
            raise ValueError(f"compression factor must be > 0, got {factor}")
        return SpotTrace(tuple(t / factor for t in self.times_s), self.counts)

    def stats(self) -> dict[str, float]:
        """mean (time-weighted over [0, duration_s]), min, max, preemption_events (decreases),
        instances_lost (their total size), additions (increases)."""
        if self.duration_s > 0:
            # Before the first row the first count holds, so [0, times_s[0]) weighs counts[0] too.
            area = self.counts[0] * self.times_s[0]
            area += sum(c * (b - a) for c, a, b in zip(self.counts, self.times_s, self.times_s[1:]))
            mean = area / self.duration_s
        else:
            mean = float(self.counts[0])
        deltas = [b - a for a, b in zip(self.counts, self.counts[1:])]
        return {
            "mean": mean,
            "min": min(self.counts),
            "max": max(self.counts),
            "preemption_events": sum(1 for d in deltas if d < 0),
            "instances_lost": -sum(d for d in deltas if d < 0),
            "additions": sum(1 for d in deltas if d > 0),
        }


def _csv_rows(path: Path) -> list[tuple[int, list[str]]]:
    """(line, cells) of each row of the file that is not blank; a file that is unreadable, not UTF-8
    text or not CSV raises ValueError naming it (and the line, where there is one)."""
    try:
        data = path.read_bytes()
    except OSError as e:
        raise ValueError(f"{path}: cannot read the trace file: {e.strerror or e}") from None
    try:
        text = data.decode("utf-8-sig")  # a spreadsheet's byte-order mark is not part of the header
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise ValueError(f"{path}:{line}: not UTF-8 text (byte {data[e.start]:#04x}); expected a CSV file with "
                         f"the header `{','.join(HEADER)}`") from None
    reader = csv.reader(io.StringIO(text, newline=""))
    try:
        return [(reader.line_num, row) for row in reader if any(c.strip() for c in row)]
    except csv.Error as e:
        raise ValueError(f"{path}:{reader.line_num}: not a CSV row: {e}") from None


def _parse_time(path: Path, line: int, text: str) -> float:
    try:
        t = float(text)
    except ValueError:
        raise ValueError(f"{path}:{line}: time_s {text!r} is not a number") from None
    if not math.isfinite(t) or t < 0:
        raise ValueError(f"{path}:{line}: time_s must be a finite number >= 0, got {text!r}")
    return t


def _parse_count(path: Path, line: int, text: str) -> int:
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{path}:{line}: available_instances {text!r} is not a number") from None
    if not value.is_integer():
        raise ValueError(f"{path}:{line}: available_instances must be a whole number, got {text!r}")
    if value < 0:
        raise ValueError(f"{path}:{line}: available_instances must be >= 0, got {text!r}")
    return int(value)


def _normalised(times: list[float], counts: list[int]) -> SpotTrace:
    """Drop interior rows that repeat the previous count (sampling and windows create them); the last
    row stays, since it marks the end of the trace."""
    keep_t, keep_c = [times[0]], [counts[0]]
    for i in range(1, len(times)):
        if counts[i] != keep_c[-1] or i == len(times) - 1:
            keep_t.append(times[i])
            keep_c.append(counts[i])
    return SpotTrace(tuple(keep_t), tuple(keep_c))


@dataclass
class TraceConfig:
    """The spot trace the `trace` provider replays (`rollout.hybrid.trace.*`)."""

    path: str = ""
    """CSV file with header `time_s,available_instances`; empty: the bundled Bamboo AWS P3 trace."""
    segment: str = ""
    """A named window of the bundled trace: A (abundant), B (fluctuating), C (scarce); empty: use
    start_h/end_h."""
    start_h: float = 0.0
    """Start of the replayed window, in hours into the trace (ignored if `segment` is given)."""
    end_h: float = 0.0
    """End of the replayed window, in hours into the trace; 0: to the end (ignored if `segment` is given)."""
    sample: float = 0.5
    """Fraction of the trace's instances to keep, floor(n * sample) per row; the paper keeps 0.5."""
    time_scale: float = 60.0
    """Trace seconds per run second: 60 replays a 2-hour window in 2 minutes; 1 replays in real time."""
    tokens_per_s: float = 0.0
    """The replay's clock. 0: wall time, run seconds since the provider started, so where in the run
    an event lands depends on how fast the machine is. > 0: the run's progress: the replay's run
    second is this many response tokens generated (by every worker, evaluations included;
    `rlboost.spot.replay_clock.ProgressClock`), so a fast machine and a slow one meet each preemption
    and each join at the same token of the run, and always while the run generates (mid-step), never
    while it only trains. `notice_s` then counts these seconds too, and the manager is given the
    warning's length as wall seconds."""
    seed: int = 0
    """Seeds the choice of which running instances a decrease preempts."""
    notice_s: float = 0.0
    """Advance warning before a preemption, in run seconds (after compression); 0: kills come
    unannounced. Clouds give 120 s (AWS) or 30 s (GCP) of real time, i.e. 120 / time_scale run seconds."""
    max_instances: int = 0
    """Extra limit on available instances (a local run may cap how many processes it starts); 0: none."""

    def validate(self) -> None:
        """Raise ValueError naming the offending field."""
        if self.segment and self.segment not in SEGMENTS:
            raise ValueError(f"rollout.hybrid.trace.segment={self.segment!r}; choose one of "
                             f"{', '.join(SEGMENTS)} or leave empty")
        for name in ("start_h", "end_h", "notice_s", "tokens_per_s"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"rollout.hybrid.trace.{name} must be >= 0, got {value}")
        if not self.segment and self.end_h and self.end_h <= self.start_h:
            raise ValueError(f"rollout.hybrid.trace.end_h ({self.end_h}) must exceed start_h ({self.start_h}), "
                             f"or be 0 for the end of the trace")
        if not 0 < self.sample <= 1:
            raise ValueError(f"rollout.hybrid.trace.sample must be in (0, 1], got {self.sample}")
        if not (math.isfinite(self.time_scale) and self.time_scale > 0):
            raise ValueError(f"rollout.hybrid.trace.time_scale must be > 0, got {self.time_scale}")
        if self.max_instances < 0:
            raise ValueError(f"rollout.hybrid.trace.max_instances must be >= 0, got {self.max_instances}")


def load_trace(cfg: TraceConfig) -> SpotTrace:
    """The trace a run replays: read the file, cut the window, sample the instances, compress time."""
    cfg.validate()
    trace = SpotTrace.from_csv(Path(cfg.path) if cfg.path else BUNDLED_TRACE)
    start_h, end_h = SEGMENTS[cfg.segment] if cfg.segment else (cfg.start_h, cfg.end_h)
    if start_h or end_h:
        field_name = "segment" if cfg.segment else "start_h"
        if start_h * 3600 >= trace.duration_s:
            raise ValueError(f"rollout.hybrid.trace.{field_name}: the window starts at {start_h} h, past the "
                             f"trace's end ({trace.duration_s / 3600:.2f} h)")
        trace = trace.segment(start_h * 3600, end_h * 3600 if end_h else trace.duration_s)
    if cfg.sample != 1:
        trace = trace.sampled(cfg.sample)
    if cfg.time_scale != 1:
        trace = trace.compressed(cfg.time_scale)
    return trace


@dataclass
class ReplayActions:
    """What the runtime should do now, as decided by `TraceReplay.step`."""

    start: int = 0
    """New instances to request now."""
    notify: list[tuple[str, float]] = field(default_factory=list)
    """(instance name, run time it will be killed at): advance notice of a preemption."""
    kill: list[str] = field(default_factory=list)
    """Hard-preempt these now (the trace decreased)."""
    release: list[str] = field(default_factory=list)
    """Surplus beyond the cap, given back gracefully (not a preemption)."""


def _natural_key(name: str) -> list:
    # "w10" after "w9": released instances are then the most recently numbered ones.
    return [(0, int(part), "") if part.isdigit() else (1, 0, part) for part in re.split(r"(\d+)", name)]


class TraceReplay:
    """The pure decision-maker of the trace-replay instance provider.

    Each `step(now_s, running, starting, cap)`:
    1. kills the instances whose announced kill time has come;
    2. if the live, not-doomed instances exceed what the trace offers now, preempts the excess at once
       (victims drawn with the replay's seeded RNG among them, in natural-sorted name order);
    3. with notice_s > 0, looks ahead over (now_s, now_s + notice_s]: at every change of the trace
       there, victims for any excess are doomed and announced, to be killed at that change's time;
    4. releases live, not-doomed instances beyond `cap` (the last in natural-sorted order);
    5. starts instances up to min(available now, cap).

    Doomed instances are not preemption targets twice and are not counted as survivors when a later
    decrease is planned, but they still hold a slot until killed, so no replacement starts for them
    before their kill time (the trace's availability at now_s includes them). Instances the replay
    has killed or released are ignored while the runtime still lists them. Instance names must not be
    reused while still listed. `now_s` must not decrease between steps.
    """

    def __init__(self, trace: SpotTrace, seed: int, notice_s: float = 0.0, max_instances: int = 0):
        if notice_s < 0:
            raise ValueError(f"notice_s must be >= 0, got {notice_s}")
        if max_instances < 0:
            raise ValueError(f"max_instances must be >= 0, got {max_instances}")
        self.trace = trace
        self.notice_s = notice_s
        self.max_instances = max_instances
        self.rng = random.Random(seed)
        self.preemptions = 0
        """Instances killed (hard preemptions, announced or not)."""
        self.notices = 0
        """Advance notices sent."""
        self.releases = 0
        """Instances given back because they exceeded the cap."""
        self._doomed: dict[str, float] = {}  # name -> announced kill time
        self._gone: set[str] = set()  # killed or released, possibly still listed by the runtime
        self._last_now: float | None = None
        self._decision_times = self.decision_times()

    @classmethod
    def from_config(cls, cfg: TraceConfig) -> TraceReplay:
        return cls(load_trace(cfg), cfg.seed, cfg.notice_s, cfg.max_instances)

    @property
    def doomed(self) -> dict[str, float]:
        """Announced but not yet killed instances and their kill times."""
        return dict(self._doomed)

    def available_at(self, t_s: float) -> int:
        """The trace's count at `t_s`, limited by max_instances."""
        n = self.trace.available_at(t_s)
        return min(n, self.max_instances) if self.max_instances > 0 else n

    def decision_times(self) -> list[float]:
        """When an event-driven caller must ask `step`: it looks ahead `notice_s` from each call, so at
        every change of the trace and `notice_s` before it (positive times, sorted)."""
        times = {when for t in self.trace.times_s for when in (t, t - self.notice_s) if when > 0}
        return sorted(times)

    def advance(self, now_s: float, running: list[str], starting: int,
                cap: int | None) -> list[tuple[float, ReplayActions]]:
        """`step` at every decision time passed since the last call (in order), then at `now_s`:
        (time, actions) of each. A clock that jumps over several changes of the trace between two
        calls (a fast machine's progress, a busy driver's late tick) still plays each of them, as a
        slow one ticked finely would: a drop and the rise after it are a kill and a start, not
        nothing. Instances started by an earlier sub-step count as starting in the later ones."""
        after = self._last_now if self._last_now is not None else 0.0
        lo = bisect.bisect_right(self._decision_times, after)
        hi = bisect.bisect_left(self._decision_times, now_s)
        played = []
        for t in [*self._decision_times[lo:hi], now_s]:
            actions = self.step(t, running, starting, cap)
            starting += actions.start
            played.append((t, actions))
        return played

    def step(self, now_s: float, running: list[str], starting: int, cap: int | None) -> ReplayActions:
        if self._last_now is not None and now_s < self._last_now:
            raise ValueError(f"TraceReplay.step: time went back from {self._last_now} to {now_s}")
        if len(set(running)) != len(running):
            raise ValueError(f"TraceReplay.step: duplicate instance names in {running}")
        if starting < 0 or (cap is not None and cap < 0):
            raise ValueError(f"TraceReplay.step: starting ({starting}) and cap ({cap}) must be >= 0")
        self._last_now = now_s
        listed = set(running)
        # Forget what the runtime no longer lists: a doomed instance that died on its own, or a kill
        # or release the runtime has carried out.
        self._gone &= listed
        self._doomed = {n: t for n, t in self._doomed.items() if n in listed}
        actions = ReplayActions()

        due = sorted((n for n, t in self._doomed.items() if t <= now_s), key=_natural_key)
        for name in due:
            del self._doomed[name]
        self._kill(actions, due)

        available = self.available_at(now_s)
        excess = len(self._survivors(listed)) - available
        if excess > 0:
            self._kill(actions, self.rng.sample(self._survivors(listed), excess))

        if self.notice_s > 0:
            for t in self.trace.change_points(now_s, now_s + self.notice_s):
                survivors = self._survivors(listed)
                excess = len(survivors) - self.available_at(t)
                if excess > 0:
                    for name in self.rng.sample(survivors, excess):
                        self._doomed[name] = t
                        actions.notify.append((name, t))
                    self.notices += excess

        survivors = self._survivors(listed)
        if cap is not None and len(survivors) > cap:
            surplus = survivors[cap:]
            actions.release.extend(surplus)
            self._gone.update(surplus)
            self.releases += len(surplus)

        # Doomed instances still occupy a slot of today's availability until their kill time.
        desired = available if cap is None else min(available, cap)
        occupied = len(self._survivors(listed)) + len(self._doomed) + starting
        actions.start = max(0, desired - occupied)
        return actions

    def _survivors(self, listed: set[str]) -> list[str]:
        """Listed instances neither killed, released nor doomed, in natural-sorted order."""
        return sorted((n for n in listed if n not in self._gone and n not in self._doomed), key=_natural_key)

    def _kill(self, actions: ReplayActions, names: list[str]) -> None:
        actions.kill.extend(names)
        self._gone.update(names)
        self.preemptions += len(names)
