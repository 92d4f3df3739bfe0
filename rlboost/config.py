"""Config loading: one dataclass per component, YAML files plus dotted `key=value` overrides.

`RLBoostConfig` assembles the run's sections (`cluster.*` at the top: the trainer's ranks and the
hybrid rollout's workers share one Ray); `RolloutConfig` (the `rollout` section) lives here too,
as it holds the hybrid backend's section (`rollout.hybrid`), which sits above the rollout package.

Every component owns a config dataclass documented field by field (see `EngineConfig`). This module
only merges sources onto such a dataclass, in order: the dataclass defaults, then the YAML file, then
the command-line overrides. Unknown keys are errors that list the valid keys at that level, so a typo
never silently falls back to a default; a key that moved (`MOVED`) is an error naming its new place.
Every number of the loaded config must be finite (`check_finite`): `nan` and `inf` parse as floats,
and would pass most range checks (`nan < 0` is False) to freeze or poison a run. A field that gives
`inf` or `nan` a meaning declares it in its metadata (`ALLOWS_NON_FINITE`).
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import typing
from pathlib import Path
from typing import Callable, Iterator, Sequence, TypeVar

from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from rlboost.cluster.config import ClusterConfig
from rlboost.data.config import DataConfig
from rlboost.engine.config import EngineConfig
from rlboost.histospec.config import HistoSpecConfig
from rlboost.hybrid.config import HybridConfig
from rlboost.models.config import ModelConfig
from rlboost.policies.histopipe import HistoPipeConfig
from rlboost.rollout.step_data import START_AHEAD
from rlboost.rewards.config import RewardConfig
from rlboost.run_dir import RunConfig
from rlboost.spot.cost import CostConfig
from rlboost.tracking.config import TrackingConfig
from rlboost.trainer.config import TrainerConfig

T = TypeVar("T")


ROLLOUT_MODES = ("colocated", "hybrid")


@dataclasses.dataclass
class RolloutConfig:
    mode: str = "colocated"
    """`colocated`: rollout and training take turns on the reserved resources (the veRL baseline).
    `hybrid`: rollout runs on reserved and preemptible workers (Ray actors) with a seeding window,
    migration and load balancing, and the trainer consumes groups as they finish (`rollout.hybrid`)."""
    n: int = 4
    """Responses per prompt, i.e. the GRPO group size (veRL: rollout.n)."""
    temperature: float = 1.0
    """Sampling temperature; the trainer computes log-probs at the same temperature."""
    top_p: float = 1.0
    """Nucleus sampling threshold (1 disables it)."""
    top_k: int = -1
    """Keep the k most likely tokens (-1 disables it)."""
    val_n: int = 1
    """Responses per held-out prompt at evaluation."""
    val_temperature: float = 0.0
    """Evaluation temperature (0: greedy, veRL's default for validation)."""
    hybrid: HybridConfig = dataclasses.field(default_factory=HybridConfig)
    """Workers, seeding window, balancing and liveness of `mode=hybrid` (ignored when colocated)."""
    histospec: HistoSpecConfig = dataclasses.field(default_factory=HistoSpecConfig)
    """Speculative decoding from the history of earlier rollouts."""
    histopipe: HistoPipeConfig = dataclasses.field(default_factory=HistoPipeConfig)
    """Scheduling from the previous epoch's response lengths: longest first, long groups spread over
    workers, alternating order across steps, samples far past their history moved first."""

    def validate(self) -> None:
        """Raise ValueError naming the offending field."""
        if self.mode not in ROLLOUT_MODES:
            raise ValueError(f"rollout.mode={self.mode!r}; choose one of {', '.join(ROLLOUT_MODES)}")
        if self.n < 1 or self.val_n < 1:
            raise ValueError(f"rollout.n and rollout.val_n must be >= 1, got {self.n} and {self.val_n}")
        if self.temperature <= 0:
            raise ValueError(f"rollout.temperature must be > 0 for RL (sampling), got {self.temperature}")
        if self.val_temperature < 0:
            raise ValueError(f"rollout.val_temperature must be >= 0, got {self.val_temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"rollout.top_p must be in (0, 1], got {self.top_p}")
        self.hybrid.validate()
        self.histospec.validate()
        self.histopipe.validate()


@dataclasses.dataclass
class AlgorithmConfig:
    """How far rollout may run ahead of the trainer (docs/staleness.md)."""

    max_staleness: int = 0
    """k: every token a step trains on comes from weights at most k versions behind the ones the step
    starts from (AReaL's `max_head_offpolicyness`). 0 (the default): the synchronous step, every token
    from exactly those weights. k >= 1 needs rollout.mode=hybrid: the instances start the next batch
    before the step's trainer is done (`start_ahead` says when) and go on with it while the trainer
    trains, swapping each new version in between tokens; one batch runs ahead, so a token is at most
    one version stale. Pair it with trainer.loss=decoupled (or m2po) to correct for the stale tokens."""
    start_ahead: str = "tail"
    """With max_staleness >= 1 (at 0 nothing starts ahead, whatever it says), when the instances start
    the next batch. `tail` (the default): once the step has nothing left to place and its trainer holds
    the reserved GPUs (its last, longest samples run): the next batch takes what those leave free on each
    instance, in sequences and, where the engine's KV cache binds first, in its tokens, and gives it back
    at once when the step needs it. `rollout_end`: once the step's rollout is over (docs/staleness.md,
    "The tail": 1.24x the tokens/s of `rollout_end` on the emulated control plane, 1.02x to 1.16x in the
    simulator at paper scale)."""

    def validate(self) -> None:
        if self.max_staleness < 0:
            raise ValueError(f"algorithm.max_staleness must be >= 0 (versions), got {self.max_staleness}")
        if self.start_ahead not in START_AHEAD:
            raise ValueError(f"algorithm.start_ahead={self.start_ahead!r}; choose one of {', '.join(START_AHEAD)}")


@dataclasses.dataclass
class RLBoostConfig:
    """The whole run's config: one section per component, each documented field by field."""

    model: ModelConfig = dataclasses.field(default_factory=ModelConfig)
    """The policy checkpoint."""
    engine: EngineConfig = dataclasses.field(default_factory=EngineConfig)
    """The rollout engine."""
    data: DataConfig = dataclasses.field(default_factory=DataConfig)
    """Training and held-out prompts, batch size, prompt and response lengths."""
    rollout: RolloutConfig = dataclasses.field(default_factory=RolloutConfig)
    """Where rollout runs and how responses are sampled."""
    trainer: TrainerConfig = dataclasses.field(default_factory=TrainerConfig)
    """Optimizer and GRPO loss."""
    algorithm: AlgorithmConfig = dataclasses.field(default_factory=AlgorithmConfig)
    """Bounded staleness: how far rollout may run ahead of the trainer."""
    cluster: ClusterConfig = dataclasses.field(default_factory=ClusterConfig)
    """The Ray the trainer ranks and the hybrid rollout's workers share, and the weight store."""
    reward: RewardConfig = dataclasses.field(default_factory=RewardConfig)
    """The reward function."""
    cost: CostConfig = dataclasses.field(default_factory=CostConfig)
    """GPU prices the run is charged at (cost/* metrics: dollars and tokens per dollar)."""
    tracking: TrackingConfig = dataclasses.field(default_factory=TrackingConfig)
    """Metric sinks, console and the end-of-run report."""
    run: RunConfig = dataclasses.field(default_factory=RunConfig)
    """The run's folder, length, checkpoint/eval schedule, resume and seed."""


MOVED = {"rollout.hybrid.ray_address": "cluster.ray_address", "rollout.hybrid.ray": "cluster.ray",
         "rollout.hybrid.weights": "cluster.weights"}
"""Keys of earlier versions -> where they are now: a config that uses one is told the new key."""


class ConfigError(ValueError):
    """A config file or override is malformed, names an unknown key, or has a value of the wrong type."""


def load_config(schema: type[T], path: str | Path | None = None, overrides: Sequence[str] = ()) -> T:
    """Build a `schema` instance from its defaults, an optional YAML file and dotted overrides."""
    sources: list[tuple[str, dict]] = []
    if path is not None:
        path = Path(path)
        if not path.is_file():
            raise ConfigError(f"config file not found: {path}")
        try:
            data = OmegaConf.to_container(OmegaConf.load(path), resolve=False)
        except Exception as e:  # yaml.YAMLError and friends
            raise ConfigError(f"{path}: not valid YAML: {e}") from e
        if data is None:
            data = {}
        if not isinstance(data, dict):
            raise ConfigError(f"{path}: the top level must be a mapping of config sections")
        sources.append((str(path), data))
    if overrides:
        sources.append(("command line", _parse_overrides(overrides)))

    for origin, data in sources:
        check_keys(schema, data, origin)

    try:
        merged = OmegaConf.merge(OmegaConf.structured(schema), *(OmegaConf.create(d) for _, d in sources))
        config = OmegaConf.to_object(merged)
    except OmegaConfBaseException as e:
        key = getattr(e, "full_key", None)
        where = f" at `{key}`" if key else ""
        # OmegaConf's message goes on with full_key / reference_type / object_type lines: the first says it all
        said = str(e.msg if hasattr(e, "msg") else e).strip().splitlines()
        raise ConfigError(f"invalid config value{where}: {said[0] if said else type(e).__name__}") from e
    check_finite(config)
    return config  # type: ignore[return-value]


ALLOWS_NON_FINITE = "allows_non_finite"
"""Metadata key of a config field that may hold `inf` or `nan`, declared where the field is, e.g.
`limit_s: float = dataclasses.field(default=math.inf, metadata={ALLOWS_NON_FINITE: True})`, with a
docstring that says what the value means ("inf: no limit"). No field declares it today."""


def check_finite(config, name: Callable[[str], str] = str) -> None:
    """Raise ConfigError if a number of the dataclass instance `config` is `nan` or `inf`, naming it
    by its dotted key (`rollout.hybrid.heartbeat_timeout_s`), passed through `name` (a command-line
    flag, say). Nested dataclasses, lists (`trainer.betas[0]`) and dicts (`cost.instance_usd_per_hour.NAME`)
    are walked; a field declaring `ALLOWS_NON_FINITE` is skipped."""
    found = next(non_finite_numbers(config), None)
    if found is not None:
        key, value = found
        raise ConfigError(f"{name(key)} must be a finite number, got {value}")


def non_finite_numbers(config, prefix: str = "") -> Iterator[tuple[str, float]]:
    """(dotted key, value) of each `nan` or `inf` in the dataclass instance `config`, in field order."""
    for f in dataclasses.fields(config):
        if not f.metadata.get(ALLOWS_NON_FINITE):
            yield from _non_finite(getattr(config, f.name), prefix + f.name)


def _non_finite(value, key: str) -> Iterator[tuple[str, float]]:
    if dataclasses.is_dataclass(value):
        yield from non_finite_numbers(value, key + ".")
    elif isinstance(value, float) and not math.isfinite(value):
        yield key, value
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            yield from _non_finite(item, f"{key}[{i}]")
    elif isinstance(value, dict):
        for name, item in value.items():
            yield from _non_finite(item, f"{key}.{name}")


def _parse_overrides(overrides: Sequence[str]) -> dict:
    for item in overrides:
        if "=" not in item or item.startswith("="):
            raise ConfigError(f"override {item!r} is not of the form key=value (e.g. engine.stream_interval=4)")
    try:
        return OmegaConf.to_container(OmegaConf.from_dotlist(list(overrides)), resolve=False)  # type: ignore
    except OmegaConfBaseException as e:
        raise ConfigError(f"cannot parse overrides {list(overrides)}: {e}") from e


def check_keys(schema: type, data: dict, origin: str, prefix: str = "") -> None:
    """Raise ConfigError naming the first key of `data` that `schema` does not have."""
    fields = {f.name: f for f in dataclasses.fields(schema)}
    hints = typing.get_type_hints(schema)
    for key, value in data.items():
        dotted = f"{prefix}{key}"
        if key not in fields and dotted in MOVED:
            leaf = _first_leaf(value)
            raise ConfigError(f"{origin}: `{dotted}{leaf}` moved to `{MOVED[dotted]}{leaf}` (Ray and the weight "
                              f"store serve the trainer too, so their section is the top-level `cluster`)")
        if key not in fields:
            close = difflib.get_close_matches(str(key), fields, n=1)
            hint = f" Did you mean `{prefix}{close[0]}`?" if close else ""
            raise ConfigError(
                f"{origin}: unknown config key `{dotted}`.{hint} "
                f"Valid keys{' under `' + prefix[:-1] + '`' if prefix else ''}: {', '.join(sorted(fields))}"
            )
        sub = hints[key]
        if dataclasses.is_dataclass(sub):
            if not isinstance(value, dict):
                raise ConfigError(f"{origin}: `{dotted}` is a section; give its keys, e.g. {dotted}.<key>=...")
            check_keys(sub, value, origin, prefix=f"{dotted}.")


def _first_leaf(value) -> str:
    """`.a.b` for {"a": {"b": 1}}: the first full key under a section, "" for a plain value."""
    path = ""
    while isinstance(value, dict) and value:
        key, value = next(iter(value.items()))
        path += f".{key}"
    return path
