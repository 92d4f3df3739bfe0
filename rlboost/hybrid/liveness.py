"""Telling a dead or frozen worker from a busy one (docs/hybrid.md, "How a death is found out";
invariants 6 and 7 of its "Invariants and the tests that check them").

Contract: `Liveness.watch_from(handles, now)` starts a watch (a step, a wait between steps);
`Liveness.check(handles, now)` returns (handle, reason) for every worker to declare dead: its
Ray node left the cluster (checked every `node_check_s`), a liveness ping failed, or it showed no sign
of life (a report, or an answered ping) for `heartbeat_timeout_s`. A stream that has been quiet for
twice `heartbeat_interval_s` (at most halfway from the interval to the timeout) gets a ping, which
another thread of the worker answers even during a long engine step (a big prefill on one CPU
thread): a quiet stream alone never kills a worker, and a broken stream is never the only death
signal. Not after one interval: an idle worker's heartbeat comes every interval by its own clock, and
reaches the manager a relay's hop and a turn later, so every idle worker would be pinged every
interval (64 idle reserved engines: 64 actor calls a second from the manager's loop).
Non-blocking; runs in the thread that owns the manager's state.
"""

from __future__ import annotations

from rlboost.hybrid.handles import Call, WorkerHandle, first_line

NODE_CHECK_S = 1.0


class Liveness:
    def __init__(self, heartbeat_interval_s: float, heartbeat_timeout_s: float, node_check_s: float = NODE_CHECK_S):
        self.interval_s, self.timeout_s, self.node_check_s = heartbeat_interval_s, heartbeat_timeout_s, node_check_s
        self.ping_after_s = min(2 * heartbeat_interval_s, (heartbeat_interval_s + heartbeat_timeout_s) / 2)
        """Silence after which a worker is pinged: past the heartbeat an idle worker sends anyway."""
        self._last_node_check = 0.0

    def watch_from(self, handles: list[WorkerHandle], now: float) -> None:
        """A watch begins at `now` (a step, or a wait between steps): nobody read the streams since the
        last one ended, so a worker's silence counts from `now`; except that of a worker whose ping is
        still unanswered, which has been silent since that ping was sent (a healthy worker answers in
        milliseconds). Without that exception a worker that vanished while idle would be found only by
        a watch longer than `heartbeat_timeout_s`, and a run of short steps would never find it."""
        pings = [h.ping.ref for h in handles if h.ping is not None]
        answered = set()
        if pings:  # else Ray is not needed: a step with no worker (the Ray-free tests) never loads it
            import ray

            answered = set(ray.wait(pings, num_returns=len(pings), timeout=0)[0])
        for h in handles:
            unanswered = h.ping is not None and h.ping.ref not in answered
            h.last_report = max(h.last_report, h.ping.sent if unanswered else now)

    def check(self, handles: list[WorkerHandle], now: float) -> list[tuple[WorkerHandle, str]]:
        import ray

        dead: list[tuple[WorkerHandle, str]] = []
        live = [h for h in handles if h.alive]
        pings = [h.ping.ref for h in live if h.ping is not None]
        answered = set(ray.wait(pings, num_returns=len(pings), timeout=0)[0]) if pings else set()
        heard_since = now - self.ping_after_s
        for h in live:
            if h.ping is None and h.last_report >= heard_since:
                continue  # heard from lately (most workers, every check): nothing to decide
            if h.ping is not None and h.ping.ref in answered:
                try:
                    ray.get(h.ping.ref)
                    h.last_report = max(h.last_report, h.ping.sent)
                except ray.exceptions.RayError as e:
                    dead.append((h, f"it died: {first_line(e)}"))
                    continue
                h.ping = None
            if now - h.last_report > self.timeout_s:
                dead.append((h, f"no sign of life for {now - h.last_report:.1f}s (rollout.hybrid.heartbeat_timeout_s)"))
            elif h.ping is None and now - h.last_report > self.ping_after_s:
                h.ping = Call(h.actor.ping.remote(), now)
        if live and now - self._last_node_check >= self.node_check_s:  # no worker, no node to look for
            self._last_node_check = now
            nodes = {n["NodeID"] for n in ray.nodes() if n["Alive"]}
            gone = {id(h) for h, _ in dead}
            for h in live:
                if h.node_id and h.node_id not in nodes and id(h) not in gone:
                    dead.append((h, f"its Ray node {h.node_id[:12]} left the cluster"))
        return dead


__all__ = ["NODE_CHECK_S", "Liveness"]
