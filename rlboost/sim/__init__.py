"""Discrete-event simulation of whole RL training runs at cluster scale (DESIGN.md 2.9): the
performance profiles of rollout engines and training (`profile`), the response-length workload
(`workload`) it runs on, the event-driven cluster (`cluster`) and the runs of every policy
(`simulator`: `simulate(SimConfig(...))`). Pure: no clock, no torch, no Ray."""

from __future__ import annotations

import importlib

# Re-exports resolve on first use (PEP 562) rather than at package import: importing the submodules
# here would make `python -m rlboost.sim.profile` run a second copy of a module already imported.
_EXPORTS = {
    "H100": "profile", "MODELS": "profile", "EngineProfile": "profile", "EngineRollout": "profile",
    "GPUSpec": "profile", "ModelSpec": "profile", "ProfileConfig": "profile", "TrainProfile": "profile",
    "colocated_run": "profile", "colocated_step": "profile", "engine_rollout": "profile",
    "make_profiles": "profile", "EngineState": "profile", "Workload": "workload", "WorkloadConfig": "workload",
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
