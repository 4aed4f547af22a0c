"""Ray's pending requests in the fleet: routing tasks in arrival order, and a replica found
by any task given to the oldest request of its model (sim/fleet/pending.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from server.runtime import Runtime
from sim.fleet.pending import MAX_ROUTING_TASKS, Pending, PendingRequests
from sim.fleet.router import RoutingContext
from sim.fleet.run import run_fleet
from tests.sim.test_fleet_run import workload


def pending(model: str = "m") -> Pending:
    return Pending(model, RoutingContext(0.0), [])


class Fleet:
    """The two things PendingRequests asks of the fleet: how many replicas run, and a
    request counted as sent."""

    def __init__(self, replicas: int) -> None:
        self.replicas = replicas
        self.sent: list[int] = []

    def queue(self) -> PendingRequests:
        return PendingRequests(lambda: self.replicas, self.sent.append)


def test_two_routing_tasks_per_replica_taken_in_arrival_order() -> None:
    fleet = Fleet(replicas=1)
    q = fleet.queue()
    a, b, c, d = (pending() for _ in range(4))
    for p in (a, b, c, d):
        q.add(p)
    assert [p.routing for p in (a, b, c, d)] == [True, True, False, False]
    assert q.routing == q.capacity == 2 and len(q) == 4
    fleet.replicas = 3  # replicas came: more tasks, still oldest first
    q.wake()
    assert c.routing and d.routing and q.routing == 4
    assert PendingRequests(lambda: 1000, fleet.sent.append).capacity == MAX_ROUTING_TASKS


def test_a_replica_found_by_a_younger_requests_task_goes_to_the_oldest() -> None:
    fleet = Fleet(replicas=1)
    q = fleet.queue()
    a, b, c = pending(), pending(), pending()
    for p in (a, b, c):
        q.add(p)
    # b's task found room on replica 0: a, the oldest, gets it; a's task passes to c
    assert q.found("m", 0) is a
    assert a.replica == 0 and not a.routing and fleet.sent == [0]
    assert b.routing and b.replica is None and c.routing
    assert q.found("m", 0) is b and q.found("m", 0) is c and len(q) == 0 and q.routing == 0


def test_the_oldest_of_the_same_model_gets_it() -> None:
    q = Fleet(replicas=2).queue()
    a, b, c = pending("m"), pending("n"), pending("m")
    for p in (a, b, c):
        q.add(p)
    assert q.found("n", 1) is b
    assert q.found("m", 0) is a and q.found("m", 1) is c


def test_a_request_that_gives_up_leaves_the_order_and_frees_its_task() -> None:
    q = Fleet(replicas=1).queue()
    a, b, c = pending(), pending(), pending()
    for p in (a, b, c):
        q.add(p)
    q.remove(a)
    assert c.routing and q.routing == 2
    q.remove(c)
    assert q.found("m", 0) is b and len(q) == 0 and q.routing == 0


def test_a_backlog_on_one_replica_is_served_in_arrival_order(tmp_path: Path) -> None:
    """Ten requests behind a busy replica: each one's run starts in arrival order (each has
    its own duration, so the order the runtime saw them in names them), whatever the
    routing tasks' backoff does."""
    started: list[float] = []

    class Recording(Runtime):
        async def run(self, model: str, request: Any, *args: Any, **kwargs: Any) -> Any:
            started.append(request["duration"])
            return await super().run(model, request, *args, **kwargs)

    text = """
[replicas]
count = 1
max_ongoing_requests = 1
[[models]]
id = "a"
slots = 1
load_time_s = 0.0
"""
    trace = "".join(f"{0.05 * i:.2f},a,{1.0 + i / 1000:.3f}\n" for i in range(10))
    s = run_fleet(workload(text, tmp_path, trace), 0, runtime_factory=Recording)
    assert s.counts["ok"] == 10 and not s.violations
    assert started == sorted(started) and len(started) == 10
