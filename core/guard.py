"""The original runtime's busy guard (reference §3.9), as an admission.

Without ``--parallel-jobs`` a model has one session and one timed lock, taken by
requests and management alike. There is no FIFO and no management priority:
when the lock frees, *some* waiter gets it; ``choose`` decides which (the
oldest by default; the simulator passes a seeded choice, and replay forces the
recorded one). With a timeout a caller fails fast when the current holder has
overrun it; otherwise it waits at most the timeout. An unbounded timeout (None)
is a plain blocking lock.

It subclasses :class:`~core.admission.Admission` so that leases, lifecycle,
residency, bulk unload, the recorder and the invariant checker work unchanged:
the lock is slot 0 for a request holder and the exclusive lease for a manager.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from core.admission import (
    NO_WAKEUPS,
    Admission,
    Decision,
    Expired,
    Granted,
    Rejected,
    Waiter,
    Wakeups,
    check_timeout,
)
from core.events import Reason
from core.lease import Lease, LeaseKind
from core.policy import overrun


def oldest(candidates: Sequence[int]) -> int:
    """The default choice: the waiter that came first."""
    return candidates[0]


class GuardAdmission(Admission):
    """One lock per model: no FIFO, no management priority, overrun fail-fast."""

    def __init__(
        self,
        model: str,
        *,
        choose: Callable[[Sequence[int]], int] | None = None,
        generation: int = 0,
    ) -> None:
        super().__init__(model, 1, generation=generation)
        self.choose = choose or oldest
        self.forced: list[int] = []

    @property
    def held(self) -> bool:
        """Whether someone holds the lock."""
        return not self._lock_free()

    def request(self, ticket: int, now: float, timeout: float | None) -> Decision:
        """Take the lock for one inference, wait for it, or fail fast on an overrun holder."""
        return self._acquire(ticket, LeaseKind.REQUEST, now, timeout)

    def manage(self, ticket: int, now: float, timeout: float | None) -> Decision:
        """Management takes the same lock, with no priority over requests."""
        return self._acquire(ticket, LeaseKind.MANAGEMENT, now, timeout)

    def configure(self, slots: int, *, bump_generation: bool = True) -> int:
        """The original runtime has exactly one session per model."""
        if slots != 1:
            raise ValueError(
                "the original runtime has one session per model (slots requires --parallel-jobs)"
            )
        return super().configure(1, bump_generation=bump_generation)

    def _lock_free(self) -> bool:
        return self._exclusive is None and self._active == 0

    def _acquire(self, ticket: int, kind: LeaseKind, now: float, timeout: float | None) -> Decision:
        self._check_new_ticket(ticket)
        check_timeout(timeout)
        if kind is LeaseKind.REQUEST and not self._admitting:
            return self._reject(ticket, Reason.SHUTTING_DOWN, now)
        if self._lock_free():
            return Granted(self._grant(ticket, kind, now), fast=True)
        since = self._since[0] if self._since[0] is not None else self._exclusive_since
        if overrun(since, now, timeout):
            assert since is not None and timeout is not None
            message = (
                f"model '{self.model}' is busy: current inference has run "
                f"{round((now - since) * 1000)} ms (busy_timeout_ms={round(timeout * 1000)}); "
                "the previous request has likely wedged and cannot be cancelled"
            )
            return Rejected(ticket, Reason.SLOTS_OVERDUE, message, self.retry_after(now))
        return self._enqueue(ticket, kind, now, timeout)

    def _grant(self, ticket: int, kind: LeaseKind, now: float) -> Lease:
        if kind is LeaseKind.REQUEST:
            return self._grant_slot(ticket, 0, now)
        return self._grant_exclusive(ticket, now)

    def _dispatch(self, now: float, *, expire: bool = True) -> Wakeups:
        """Expire late waiters; if the lock is free, hand it to the chosen waiter.

        ``expire=False`` (an enqueue): late waiters are left for :meth:`expire`
        and are not candidates.
        """
        expired: list[Expired] = []
        for waiter in tuple(self._queue) if expire else ():
            if waiter.deadline is not None and now >= waiter.deadline:
                self._remove(waiter)
                expired.append(self._expired(waiter))
        granted: list[Lease] = []
        candidates = [w.ticket for w in self._queue if w.deadline is None or now < w.deadline]
        if self._lock_free() and candidates:
            if self.forced and self.forced[0] in candidates:
                chosen = self.forced.pop(0)
            else:
                chosen = self.choose(candidates)
            waiter = self._waiting[chosen]
            self._remove(waiter)
            granted.append(self._grant(chosen, waiter.kind, now))
        if not granted and not expired:
            return NO_WAKEUPS
        return Wakeups(tuple(granted), tuple(expired))

    def _expired(self, waiter: Waiter) -> Expired:
        timeout_ms = round(((waiter.deadline or waiter.enqueued_at) - waiter.enqueued_at) * 1000)
        at = waiter.deadline if waiter.deadline is not None else waiter.enqueued_at
        return Expired(
            waiter.ticket,
            waiter.kind,
            Reason.QUEUE_TIMEOUT,
            f"model '{self.model}' is busy: timed out after {timeout_ms} ms waiting for the "
            "inference lock",
            self.retry_after(at),
        )
