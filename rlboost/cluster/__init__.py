"""The cluster a run stands on, shared by the trainer ranks and the rollout workers: Ray's start-up
and security (`ray_setup`, and `node_process` for a local node of its own), the check of a running
cluster before joining it (`address`), its one owner (`ray_cluster.Cluster`), its draining nodes (a
cloud's preemption warning, `draining`), many hosts on one machine (`hosts`), the resource names
(`resources`), which GPUs each worker and rank owns (`placement`, counted in `gpus`), the weight
store (`weights`) and what it hands out (`manifest`), and their config (`cluster.*`, `config`).

Layering: beside `rlboost.rollout`, under `rlboost.hybrid` and `rlboost.trainer`; it imports neither
of them nor `rlboost.rollout` (the step's state machine names its worker kinds after `resources`).
Nothing is imported here, so configs and the step's state machine never load Ray.

Lifetime: the run's assembly (`rlboost.assembly`) builds one `Cluster` and hands it to the fleet
and the trainer group; only its `shutdown` ends Ray."""
