"""Hybrid rollout on Ray: workers on reserved and preemptible resources (`worker`, `fleet`), the
manager that owns every sample token by token (`manager`: seeding window, migration, fencing,
balancing) and the backend the training loop uses (`rollout.HybridRollout`).

Nothing is imported here, so configs and colocated runs never load Ray."""
