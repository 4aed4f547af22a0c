"""Per-ticket wait state: how a task parked on core's decision learns the outcome.

Core assigns a grant before anyone wakes; the runtime records it here and wakes
exactly that waiter (per-waiter wakeups, never a broadcast).
"""

from __future__ import annotations

import anyio
import attrs

from core.admission import Expired, Wakeups
from core.lease import Lease
from core.lifecycle import StartLoad


@attrs.define
class AdmissionWait:
    """A queued request or manager: its grant or expiry, and the scope to cut its sleep short."""

    model: str
    event: anyio.Event = attrs.field(factory=anyio.Event)
    lease: Lease | None = None
    expired: Expired | None = None
    scope: anyio.CancelScope | None = None
    watchers: list[anyio.Event] = attrs.field(factory=list)

    def resolve(self) -> None:
        self.event.set()
        if self.scope is not None:
            self.scope.cancel()
        for w in self.watchers:
            w.set()


@attrs.define
class LoadWait:
    """A lease holder waiting for another holder's first load: proceed, or load it yourself."""

    event: anyio.Event = attrs.field(factory=anyio.Event)
    proceed: bool = False
    retry: StartLoad | None = None


class WaitTable:
    """Every parked ticket, by ticket number."""

    def __init__(self) -> None:
        self.admission: dict[int, AdmissionWait] = {}
        self.loads: dict[int, LoadWait] = {}

    def park(self, model: str, ticket: int) -> AdmissionWait:
        wait = AdmissionWait(model)
        self.admission[ticket] = wait
        return wait

    def deliver(self, wakeups: Wakeups) -> None:
        """Hand each grant and expiry to its waiter (assigned before the wake)."""
        for lease in wakeups.granted:
            wait = self.admission.get(lease.ticket)
            if wait is not None:
                wait.lease = lease
                wait.resolve()
        for expired in wakeups.expired:
            wait = self.admission.get(expired.ticket)
            if wait is not None:
                wait.expired = expired
                wait.resolve()

    def park_load(self, ticket: int) -> LoadWait:
        wait = LoadWait()
        self.loads[ticket] = wait
        return wait

    def load_proceed(self, tickets: tuple[int, ...]) -> None:
        for t in tickets:
            wait = self.loads.pop(t, None)
            if wait is not None:
                wait.proceed = True
                wait.event.set()

    def load_retry(self, start: StartLoad) -> None:
        wait = self.loads.pop(start.ticket, None)
        if wait is not None:
            wait.retry = start
            wait.event.set()
