"""rlboost: RL post-training of LLMs that harvests preemptible GPUs for rollout.

Layout (see docs/architecture.md for the map):
    rlboost.engine   the rollout engine: continuous batching, streaming, abort/resume
    rlboost.models   loading checkpoints (HF folders, the bundled GGUF) and tiny test models
    rlboost.bench    benchmarks behind `rlboost bench ...`
    rlboost.config   YAML + dotted overrides onto per-component config dataclasses
"""

__version__ = "0.1.0"
