"""Rollout: samples and groups, the step's decisions (`step_state`, pure, shared by the runtime's
manager and the simulator), the backend protocol the training loop uses and the colocated (veRL-style)
backend. The hybrid backend lives in `rlboost.hybrid`.

Names are imported on first use (PEP 562): `rlboost.rollout.step_state` and `sample` are torch-free,
and the simulator imports them without loading the colocated backend's engine (torch)."""

from rlboost._lazy import lazy_exports

_WHERE = {
    "ColocatedRollout": "colocated", "RolloutBackend": "colocated", "new_groups": "colocated",
    "run_colocated": "colocated", "sample_seed": "colocated",
    "Group": "sample", "RolloutProgress": "sample", "Sample": "sample",
}

__all__ = sorted(_WHERE)
__getattr__, __dir__ = lazy_exports(__name__, _WHERE, globals())
