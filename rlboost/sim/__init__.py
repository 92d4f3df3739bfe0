"""Discrete-event simulation of whole RL training runs at cluster scale (docs/simulator.md): datasheets
(`specs`), the roofline performance profiles of rollout engines and training (`profile`), how an engine
batches samples through time (`batching`), the veRL baseline (`baselines`), the response-length
workload (`workload`), the event-driven cluster (`cluster`, a shell around the runtime's own
`rlboost.rollout.step_state.StepState`, with the books of its engines `engine_pool`, of its rented
instances `spot_instances`, of a step's trainer `step_trainer` and totals `step_totals`, recording
`records`; what its weight pulls move: `pulls`) and the runs of every policy (`simulator`:
`simulate(SimConfig(...))`; full pulls against patches: `patch_table`). Speculative decoding (HistoSpec)
in the engines' timing is `speculation`, with and without it per model `histospec_table`. Pure: no
clock, no torch, no Ray. The emulated engine (`emulated`, what it generates: `emulated_content`) lets
the real runtime run at the profile's speed; it is the one part here that the runtime loads."""

from rlboost._lazy import lazy_exports

_EXPORTS = {
    "H100": "specs", "MODELS": "specs", "GPUSpec": "specs", "ModelSpec": "specs",
    "EngineProfile": "profile", "ProfileConfig": "profile", "TrainProfile": "profile", "make_profiles": "profile",
    "SpecConfig": "speculation", "SpeculativeProfile": "speculation",
    "EngineRollout": "batching", "EngineState": "batching", "engine_rollout": "batching",
    "colocated_run": "baselines", "colocated_step": "baselines",
    "Workload": "workload", "WorkloadConfig": "workload",
    "ClusterRun": "cluster", "StepRecord": "records", "POLICIES": "simulator", "SimConfig": "simulator",
    "SimResult": "simulator", "simulate": "simulator",
}

__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
