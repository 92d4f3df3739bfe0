"""Pure policy objects (dispatch, balancing, throughput profile, speculation budget) shared by the
runtime and the simulator."""

from rlboost.policies.balance import Balancer, Move
from rlboost.policies.dispatch import JSQDispatcher, WorkerLoad
from rlboost.policies.profile import ThroughputProfile
from rlboost.policies.spec_budget import SpecBudget

__all__ = ["Balancer", "Move", "JSQDispatcher", "WorkerLoad", "SpecBudget", "ThroughputProfile"]
