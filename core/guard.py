"""The original runtime's busy guard (reference §3.9): one timed lock per model.

Without ``--parallel-jobs`` a model has one session and one lock. There is no
FIFO and no management priority: when the lock frees, *some* waiter gets it
(the caller's ``choose`` decides; the simulator passes its seeded choice). With a
timeout > 0 a caller fails fast when the current holder has overrun it;
otherwise it waits at most the timeout. Timeout 0 is a plain blocking lock.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import attrs

from core.admission import Expired, Granted, Queued, Rejected, Wakeups
from core.events import Reason
from core.lease import Lease, LeaseKind, LeaseLedger
from core.policy import overrun


def _first(candidates: Sequence[int]) -> int:
    return candidates[0]


@attrs.define
class _Waiter:
    ticket: int
    deadline: float | None
    timeout: float


class BusyGuard:
    """One lock per model, shared by requests and management alike."""

    def __init__(self, model: str) -> None:
        self.model = model
        self.ledger = LeaseLedger()
        self._holder: int | None = None
        self._since: float | None = None
        self._waiters: list[_Waiter] = []

    @property
    def held(self) -> bool:
        """Whether someone holds the lock."""
        return self._holder is not None

    @property
    def waiting(self) -> int:
        """How many callers wait for the lock."""
        return len(self._waiters)

    def acquire(self, ticket: int, now: float, timeout: float) -> Granted | Queued | Rejected:
        """Take the lock, wait for it, or fail fast because the holder has overrun ``timeout``."""
        if self._holder is None:
            return Granted(self._grant(ticket, now), fast=True)
        if overrun(self._since, now, timeout):
            since = now if self._since is None else self._since
            ran_ms = round((now - since) * 1000)
            message = (
                f"model '{self.model}' is busy: current inference has run {ran_ms} ms "
                f"(busy_timeout_ms={round(timeout * 1000)}); the previous request has likely "
                "wedged and cannot be cancelled"
            )
            return Rejected(ticket, Reason.SLOTS_OVERDUE, message)
        deadline = now + timeout if timeout > 0 else None
        self._waiters.append(_Waiter(ticket, deadline, timeout))
        return Queued(ticket, LeaseKind.REQUEST, deadline, len(self._waiters) - 1)

    def release(
        self, ticket: int, now: float, choose: Callable[[Sequence[int]], int] = _first
    ) -> Wakeups:
        """Free the lock and hand it to the waiter ``choose`` picks among those still in time."""
        if self.ledger.release(ticket) is None:
            return Wakeups()
        self._holder = None
        self._since = None
        expired = self._expire(now)
        if not self._waiters:
            return Wakeups((), expired)
        chosen = choose([w.ticket for w in self._waiters])
        waiter = next(w for w in self._waiters if w.ticket == chosen)
        self._waiters.remove(waiter)
        return Wakeups((self._grant(chosen, now),), expired)

    def expire(self, now: float) -> Wakeups:
        """Time out every waiter whose deadline has come."""
        return Wakeups((), self._expire(now))

    def cancel(self, ticket: int) -> bool:
        """Drop a waiting caller; True if it was waiting."""
        for w in self._waiters:
            if w.ticket == ticket:
                self._waiters.remove(w)
                return True
        return False

    def _expire(self, now: float) -> tuple[Expired, ...]:
        gone = [w for w in self._waiters if w.deadline is not None and now >= w.deadline]
        for w in gone:
            self._waiters.remove(w)
        return tuple(
            Expired(
                w.ticket,
                LeaseKind.REQUEST,
                Reason.QUEUE_TIMEOUT,
                f"model '{self.model}' is busy: timed out after "
                f"{round(w.timeout * 1000)} ms waiting for the inference lock",
            )
            for w in gone
        )

    def _grant(self, ticket: int, now: float) -> Lease:
        lease = Lease(self.model, ticket, LeaseKind.REQUEST, 0, 0, now)
        self._holder = ticket
        self._since = now
        self.ledger.grant(lease)
        return lease
