"""The configs that ship with the package (YAML, read by `rlboost.config.load_config`)."""

from pathlib import Path

SHOWCASE = Path(__file__).parent / "showcase.yaml"
"""The main job's config (`rlboost train` with no config file); the benchmarks that need real GRPO steps
run its task, reward and trainer settings."""
