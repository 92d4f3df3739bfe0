"""Pure policy objects (dispatch, balancing, throughput profile) shared by the runtime and the simulator."""

from rlboost.policies.balance import Balancer, Move
from rlboost.policies.dispatch import JSQDispatcher, WorkerLoad
from rlboost.policies.profile import ThroughputProfile

__all__ = ["Balancer", "Move", "JSQDispatcher", "WorkerLoad", "ThroughputProfile"]
