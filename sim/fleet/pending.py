"""Ray Serve's pending requests: who looks for a replica, and who gets the one found.

A Ray router (``request_router.py``, with the ``FIFOMixin`` that
``PowerOfTwoChoicesRequestRouter`` composes) does not let every waiting request
race for replicas:

* requests wait in arrival order (``_pending_requests_to_route``); at most
  ``max_num_routing_tasks`` = min(50, 2 x running replicas) routing tasks each
  take the oldest request no task has, and try replicas for it with that
  request's candidates and its own backoff (``_fulfill_pending_requests``);
* a replica a task finds goes to the oldest pending request *of the same model*
  (``_fulfill_next_pending_request`` through
  ``_get_pending_request_matching_multiplexed_model_id``), which may be another
  task's request: that task's routing ends (its request was served), the
  finder goes on for its own request after its backoff step.

So a request behind a backlog waits its turn instead of racing it, and while
every routing task sleeps in its backoff a freed replica stays idle: both shape
the latency the fleet simulator must reproduce (docs/fleet.md).
:class:`PendingRequests` keeps that state; the fleet's clients drive it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

import attrs
import trio

from sim.clock import SimClock
from sim.fleet.router import RoutingContext

MAX_ROUTING_TASKS = 50
"""Ray's ``max_num_routing_tasks_cap``."""


@attrs.define(eq=False)
class Pending:
    """One request waiting for a replica: its routing state, and the replica it was given."""

    model: str
    ctx: RoutingContext
    avoid: list[int]
    replica: int | None = None
    routing: bool = False
    """A routing task works for it (else it waits for one, or for a replica)."""
    waiting: trio.CancelScope | None = None
    """The scope of its wait (for a task, or its backoff), cancelled when it gets a routing
    task or a replica (as the runtime wakes a queued request)."""

    async def wait(self, clock: SimClock, seconds: float | None) -> None:
        """Wait ``seconds`` on the virtual clock (None: until woken), or until woken."""
        with trio.CancelScope() as scope:
            self.waiting = scope
            if seconds is None:
                await trio.sleep_forever()
            else:
                await clock.sleep(seconds)
        self.waiting = None


class PendingRequests:
    """The requests waiting for a replica, in arrival order, and the routing tasks."""

    def __init__(self, replicas: Callable[[], int], sent: Callable[[int], None]) -> None:
        self._replicas = replicas
        self._sent = sent
        self._by_model: dict[str, deque[Pending]] = {}
        self._waiting: deque[Pending] = deque()
        self.routing = 0

    @property
    def capacity(self) -> int:
        """Ray's ``max_num_routing_tasks`` for the replicas running now."""
        return min(MAX_ROUTING_TASKS, 2 * self._replicas())

    def __len__(self) -> int:
        return sum(len(q) for q in self._by_model.values())

    def add(self, pending: Pending) -> None:
        """A request starts waiting (last in its model's order and in the routing order)."""
        self._by_model.setdefault(pending.model, deque()).append(pending)
        self._waiting.append(pending)
        self.wake()

    def found(self, model: str, replica: int) -> Pending:
        """A routing task found room on ``replica`` for ``model``: the oldest pending request
        of that model gets it (counted as sent to it now). Returns that request."""
        oldest = self._by_model[model].popleft()
        if not self._by_model[model]:
            del self._by_model[model]
        oldest.replica = replica
        self._sent(replica)
        self._stop_waiting(oldest)
        self._poke(oldest)
        return oldest

    def remove(self, pending: Pending) -> None:
        """A request gives up (cancelled) before it got a replica."""
        queue = self._by_model[pending.model]
        queue.remove(pending)
        if not queue:
            del self._by_model[pending.model]
        self._stop_waiting(pending)

    def wake(self) -> None:
        """Give free routing tasks to the oldest requests that have none (also when replicas
        came)."""
        while self._waiting and self.routing < self.capacity:
            pending = self._waiting.popleft()
            pending.routing = True
            self.routing += 1
            self._poke(pending)

    def _stop_waiting(self, pending: Pending) -> None:
        if pending.routing:
            pending.routing = False
            self.routing -= 1
            self.wake()
        else:
            self._waiting.remove(pending)

    @staticmethod
    def _poke(pending: Pending) -> None:
        if pending.waiting is not None:
            pending.waiting.cancel()
