"""Discrete-event simulation of whole RL training runs at cluster scale (DESIGN.md 2.9): datasheets
(`specs`), the roofline performance profiles of rollout engines and training (`profile`), how an engine
batches samples through time (`batching`), the veRL baseline (`baselines`), the response-length
workload (`workload`), the event-driven cluster (`cluster`, a shell around the runtime's own
`rlboost.rollout.step_state.StepState`) and the runs of every policy (`simulator`:
`simulate(SimConfig(...))`). Pure: no clock, no torch, no Ray. The emulated engine (`emulated`) lets
the real runtime run at the profile's speed; it is the one module here that the runtime loads."""

from __future__ import annotations

import importlib

# Re-exports resolve on first use (PEP 562): `import rlboost.sim.X` loads X and what it needs, not every module.
_EXPORTS = {
    "H100": "specs", "MODELS": "specs", "GPUSpec": "specs", "ModelSpec": "specs",
    "EngineProfile": "profile", "ProfileConfig": "profile", "TrainProfile": "profile", "make_profiles": "profile",
    "EngineRollout": "batching", "EngineState": "batching", "engine_rollout": "batching",
    "colocated_run": "baselines", "colocated_step": "baselines",
    "Workload": "workload", "WorkloadConfig": "workload",
    "ClusterRun": "cluster", "StepRecord": "cluster", "POLICIES": "simulator", "SimConfig": "simulator",
    "SimResult": "simulator", "simulate": "simulator",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
