"""Config: defaults <- YAML <- dotted overrides; unknown keys and bad values are errors naming them."""

import dataclasses
import math
import re

import pytest

from rlboost.config import ALLOWS_NON_FINITE, ConfigError, RLBoostConfig, load_config


def test_defaults_yaml_then_overrides(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("engine:\n  stream_interval: 4\n  max_num_seqs: 16\nmodel:\n  path: tiny:qwen3\n")
    cfg = load_config(RLBoostConfig, path, ["engine.stream_interval=2", "model.seed=5"])
    assert isinstance(cfg, RLBoostConfig)
    assert cfg.engine.stream_interval == 2      # override beats YAML
    assert cfg.engine.max_num_seqs == 16        # YAML beats default
    assert cfg.model.path == "tiny:qwen3" and cfg.model.seed == 5
    assert cfg.engine.kv_cache_init_len == 256  # default kept
    assert load_config(RLBoostConfig).engine.stream_interval == 8


def test_unknown_key_in_yaml_lists_valid_keys(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("engine:\n  stream_intervl: 4\n")
    with pytest.raises(ConfigError) as err:
        load_config(RLBoostConfig, path)
    msg = str(err.value)
    assert "unknown config key `engine.stream_intervl`" in msg and str(path) in msg
    assert "Did you mean `engine.stream_interval`" in msg
    assert "max_num_seqs" in msg and "kv_cache_init_len" in msg  # the valid keys are listed


def test_unknown_override_and_section():
    with pytest.raises(ConfigError, match="unknown config key `optim`.*Valid keys: algorithm, cluster, cost, data, "
                                          "engine, model, reward, rollout, run, tracking, trainer"):
        load_config(RLBoostConfig, overrides=["optim.lr=1"])
    with pytest.raises(ConfigError, match="`engine` is a section"):
        load_config(RLBoostConfig, overrides=["engine=3"])


def test_bad_values_and_malformed_overrides(tmp_path):
    with pytest.raises(ConfigError, match="engine.max_num_seqs") as e:
        load_config(RLBoostConfig, overrides=["engine.max_num_seqs=many"])
    assert "\n" not in str(e.value), str(e.value)  # one line, not OmegaConf's trailer of key and types
    with pytest.raises(ConfigError, match="`rollout.hybrid.notice_keep`: .*not a valid bool") as e:
        load_config(RLBoostConfig, overrides=["rollout.hybrid.notice_keep=maybe"])
    assert "\n" not in str(e.value), str(e.value)
    with pytest.raises(ConfigError, match="not of the form key=value"):
        load_config(RLBoostConfig, overrides=["engine.max_num_seqs"])
    with pytest.raises(ConfigError, match="not found"):
        load_config(RLBoostConfig, tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("engine: [1, 2\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(RLBoostConfig, bad)


def test_shipped_configs_are_valid_and_complete():
    import typing
    from pathlib import Path

    from omegaconf import OmegaConf

    configs = Path(__file__).parent.parent / "configs"
    path = configs / "engine.yaml"
    assert load_config(RLBoostConfig, path) == RLBoostConfig()  # it documents the defaults, exactly
    data = OmegaConf.to_container(OmegaConf.load(path))
    hints = typing.get_type_hints(RLBoostConfig)
    for name in ("model", "engine"):  # the sections `rlboost generate` and `bench` use, field by field
        assert set(data[name]) == {f.name for f in dataclasses.fields(hints[name])}
    for run_config in ("smoke.yaml", "hybrid_smoke.yaml", "smollm2_arithmetic.yaml"):
        load_config(RLBoostConfig, configs / run_config).rollout.validate()  # known keys, right types, valid


@pytest.mark.parametrize("override, message", [
    ("rollout.hybrid.num_reserved=0", "rollout.hybrid.num_reserved must be >= 1"),
    ("rollout.hybrid.preempt_with=node", "rollout.hybrid.preempt_with='node'; choose one of instance, process"),
    ("rollout.hybrid.instances=vms", "rollout.hybrid.instances='vms'; choose one of processes, nodes"),
    ("rollout.hybrid.heartbeat_timeout_s=0.5", "heartbeat_timeout_s must exceed heartbeat_interval_s"),
    ("rollout.hybrid.seed_window_s=-1", "rollout.hybrid.seed_window_s must be >= 0"),
    ("rollout.hybrid.max_unacked_reports=-1", "rollout.hybrid.max_unacked_reports must be an integer >= 0"),
    ("rollout.hybrid.launch_backoff_max_s=0.5", "rollout.hybrid.launch_backoff_max_s must be >= launch_backoff_s (1.0)"),
    ("rollout.hybrid.failure_summary_s=-1", "rollout.hybrid.failure_summary_s must be >= 0"),
    ("rollout.hybrid.failure_summary_max_s=10", "rollout.hybrid.failure_summary_max_s must be >= failure_summary_s"),
    ("rollout.mode=spot", "rollout.mode='spot'; choose one of colocated, hybrid"),
    ("rollout.histopipe.overrun_factor=0.5", "rollout.histopipe.overrun_factor must be a finite number >= 1"),
    ("rollout.histospec.min_order=9", "rollout.histospec.max_order must be >= min_order"),
    ("rollout.histospec.drafter=tree", "rollout.histospec.drafter must be one of ngram, suffix, suffix_tree, got 'tree'"),
    ("rollout.histospec.suffix_spec_factor=0", "rollout.histospec.suffix_spec_factor must be > 0"),
    ("rollout.histospec.sibling_tokens_per_step=-1",
     "rollout.histospec.sibling_tokens_per_step must be an integer >= 0 (0: off), got -1"),
])
def test_hybrid_settings_are_checked(override, message):
    cfg = load_config(RLBoostConfig, overrides=["rollout.mode=hybrid", override])
    with pytest.raises(ValueError, match=re.escape(message)):
        cfg.rollout.validate()
    with pytest.raises(ConfigError, match="unknown config key `rollout.hybrid.seed_window`. Did you mean `rollout.hybrid.seed_window_s`"):
        load_config(RLBoostConfig, overrides=["rollout.hybrid.seed_window=1"])


@pytest.mark.parametrize("override, message", [
    ("cluster.ray.worker_niceness=-5", "cluster.ray.worker_niceness must be an integer from 0 to 19"),
    ("cluster.ray.bind_host=0.0.0.0", "cluster.ray.bind_host='0.0.0.0' is not an address other machines can reach"),
    ("cluster.weights.bucket_mb=0", "cluster.weights.bucket_mb must be > 0"),
    ("rollout.hybrid.provider=ray_cluster", "rollout.hybrid.provider=ray_cluster needs cluster.ray_address"),
])
def test_cluster_settings_are_checked_before_anything_starts(override, message):
    from rlboost.checks import validate

    with pytest.raises(ConfigError, match=re.escape(message)):
        validate(load_config(RLBoostConfig, overrides=[override]))
    validate(load_config(RLBoostConfig, overrides=["cluster.ray.worker_niceness=19", "cluster.weights.bucket_mb=8"]))


@pytest.mark.parametrize("old, new", [
    ("rollout.hybrid.ray_address=HEAD:6379", "cluster.ray_address"),
    ("rollout.hybrid.ray.worker_niceness=5", "cluster.ray.worker_niceness"),
    ("rollout.hybrid.weights.pull_timeout_s=30", "cluster.weights.pull_timeout_s"),
])
def test_a_key_that_moved_to_the_cluster_section_is_named_with_its_new_place(old, new, tmp_path):
    key = old.split("=")[0]
    with pytest.raises(ConfigError, match=re.escape(f"`{key}` moved to `{new}`")):
        load_config(RLBoostConfig, overrides=[old])
    yaml = tmp_path / "old.yaml"
    yaml.write_text("rollout:\n  hybrid:\n    ray:\n      worker_niceness: 5\n")
    with pytest.raises(ConfigError, match=re.escape("`rollout.hybrid.ray.worker_niceness` moved to "
                                                    "`cluster.ray.worker_niceness`")):
        load_config(RLBoostConfig, yaml)


def test_tis_with_several_optimizer_steps_per_step_is_refused_before_anything_starts():
    from rlboost.checks import validate

    cfg = load_config(RLBoostConfig, overrides=["trainer.tis_cap=2", "trainer.mini_batch_groups=1",
                                                "data.train_batch_size=4"])
    with pytest.raises(ConfigError, match="trainer.tis_cap needs one optimizer step per RL step, but "
                                          "trainer.mini_batch_groups=1 splits data.train_batch_size=4"):
        validate(cfg)
    validate(load_config(RLBoostConfig, overrides=["trainer.tis_cap=2", "data.train_batch_size=4"]))


def test_histospec_on_vllm_is_refused_across_tensor_parallel_processes_and_with_draft_trees(monkeypatch):
    """vLLM verifies HistoSpec's drafts in the engine's process; its tensor-parallel workers run in
    others, where the drafter cannot answer: that pair is refused before anything starts. vLLM
    verifies single paths, so the tree drafter is refused there too, by name."""
    import importlib.util

    from rlboost.checks import validate

    find_spec = importlib.util.find_spec  # vLLM counts as installed here (its absence is test_cli's)
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: object() if name == "vllm" else find_spec(name, *a))

    validate(load_config(RLBoostConfig, overrides=["engine.backend=vllm", "rollout.histospec.enabled=true"]))
    cfg = load_config(RLBoostConfig, overrides=["engine.backend=vllm", "rollout.histospec.enabled=true",
                                                "engine.vllm_tensor_parallel_size=2"])
    with pytest.raises(ConfigError, match="rollout.histospec.enabled with engine.backend=vllm needs "
                                          "engine.vllm_tensor_parallel_size=1 \\(got 2\\)"):
        validate(cfg)
    tree = ["rollout.histospec.enabled=true", "rollout.histospec.drafter=suffix_tree"]
    validate(load_config(RLBoostConfig, overrides=tree))
    with pytest.raises(ConfigError, match="rollout.histospec.drafter=suffix_tree needs engine.backend=rlboost"):
        validate(load_config(RLBoostConfig, overrides=tree + ["engine.backend=vllm"]))


# --- nan and inf --------------------------------------------------------------------------------------

def float_keys(schema: type, prefix: str = "") -> list[tuple[str, str]]:
    """(override, the dotted key it must be reported under) for every float of `schema` and of the
    dataclasses under it: float fields, the first item of a list of floats, an entry of a dict of floats."""
    import typing

    keys = []
    hints = typing.get_type_hints(schema)
    for f in dataclasses.fields(schema):
        kind, key = hints[f.name], prefix + f.name
        if dataclasses.is_dataclass(kind):
            keys += float_keys(kind, key + ".")
        elif f.metadata.get(ALLOWS_NON_FINITE):
            continue
        elif kind is float or kind == float | None:
            keys.append((key + "={}", key))
        elif kind == list[float]:
            keys.append((key + "=[{},1.0]", key + "[0]"))
        elif kind == dict[str, float]:
            keys.append((key + ".extra={}", key + ".extra"))
    return keys


def schemas():
    from rlboost.sim.simulator import SimConfig

    return [RLBoostConfig, SimConfig]  # `rlboost train` / `generate`, and `rlboost simulate`


@pytest.mark.parametrize("schema", schemas(), ids=lambda s: s.__name__)
def test_every_number_of_a_config_refuses_nan_and_inf(schema):
    keys = float_keys(schema)
    names = {key for _, key in keys}
    if schema is RLBoostConfig:  # the walk reaches every section, the nested ones included
        assert {"trainer.lr", "rollout.hybrid.heartbeat_timeout_s", "rollout.hybrid.trace.time_scale",
                "rollout.hybrid.offload.eta", "cluster.weights.pull_timeout_s", "trainer.betas[0]",
                "cost.instance_usd_per_hour.extra"} <= names
    assert len(keys) >= 25
    for override, key in keys:
        for value in ("nan", "inf", "-inf"):
            with pytest.raises(ConfigError, match=re.escape(f"{key} must be a finite number, got {value}")):
                load_config(schema, overrides=[override.format(value)])


def test_the_sibling_budget_refuses_what_is_not_a_whole_number_of_tokens():
    from rlboost.histospec.config import HistoSpecConfig

    for value in ("nan", "inf", "-inf", "1.5"):
        with pytest.raises(ConfigError, match=re.escape("rollout.histospec.sibling_tokens_per_step")):
            load_config(RLBoostConfig, overrides=[f"rollout.histospec.sibling_tokens_per_step={value}"])
    for value in (float("nan"), float("inf"), -1, True):  # built in code: the config's own check
        with pytest.raises(ValueError, match="sibling_tokens_per_step must be an integer >= 0"):
            HistoSpecConfig(sibling_tokens_per_step=value).validate()
    HistoSpecConfig(sibling_tokens_per_step=0).validate()  # 0: off


def test_a_config_built_in_code_is_checked_too():
    from rlboost.checks import validate

    cfg = RLBoostConfig()
    cfg.rollout.hybrid.heartbeat_timeout_s = float("nan")
    with pytest.raises(ConfigError, match="rollout.hybrid.heartbeat_timeout_s must be a finite number, got nan"):
        validate(cfg)


@dataclasses.dataclass
class Limits:
    limit_s: float = dataclasses.field(default=math.inf, metadata={ALLOWS_NON_FINITE: True})
    rate: float = 1.0


def test_a_field_may_declare_that_it_allows_inf():
    assert load_config(Limits).limit_s == math.inf
    assert math.isnan(load_config(Limits, overrides=["limit_s=nan"]).limit_s)
    with pytest.raises(ConfigError, match="rate must be a finite number, got inf"):
        load_config(Limits, overrides=["rate=inf"])
