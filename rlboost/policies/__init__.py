"""Pure policy objects (dispatch, balancing, throughput profile, offload controller, speculation
budget, HistoPipe ordering) shared by the runtime and the simulator; the runtime's launch backoff and
failure digest (`launch_backoff`, `failure_digest`)."""

from rlboost.policies.balance import Balancer, Move
from rlboost.policies.dispatch import JSQDispatcher, WorkerLoad
from rlboost.policies.histopipe import HistoPipe, HistoPipeConfig
from rlboost.policies.offload import OffloadConfig, OffloadController, StepTimings
from rlboost.policies.profile import ThroughputProfile
from rlboost.policies.spec_budget import SpecBudget

__all__ = ["Balancer", "Move", "HistoPipe", "HistoPipeConfig", "JSQDispatcher", "WorkerLoad", "OffloadConfig", "OffloadController", "SpecBudget",
           "StepTimings", "ThroughputProfile"]
