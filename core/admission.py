"""Per-model FIFO admission of requests and management (reference §3.1-3.8).

One :class:`Admission` per registered model. Requests lease one slot each;
management (load, unload, reconfigure, registration, bulk unload, eviction, idle
retirement) leases the whole model exclusively. Both wait in one FIFO queue in
enqueue order, which gives the rules:

* fast path: with nothing exclusive, nothing queued and a free slot, a request is
  granted at once;
* no barging: when anything is queued, a new request joins the back, spare slots
  or not;
* a manager waits for every earlier admitted and queued request and blocks every
  later one (a barrier);
* grants are assigned here, before the caller wakes the waiter, so a later
  arrival can never take an older waiter's slot;
* the overdue rule: a request that cannot take the fast path is rejected at once
  when every occupied slot has overrun its timeout (or an exclusive holder has),
  whatever else is queued; a manager is rejected at once when any slot has;
* an unbounded timeout (None) waits forever and disables the overdue rule.

Time is ``now`` in seconds, passed by the caller; timeouts are positive seconds,
or None for unbounded (:mod:`core.policy`: the one spelling of "no limit"; the
HTTP and config value 0 is converted before it gets here). Beyond the original:
an optional queue-length bound for requests (None: no bound), cancellation of a
queued waiter whose client went away, and a
:class:`RetryAfter` on every refusal and expiry: when a slot would be free for
a client that joined the queue now, from the hold times observed so far, the
holders' time already spent and the requests queued ahead.
"""

from __future__ import annotations

import enum
import heapq
import math
from collections import deque
from collections.abc import Iterator

import attrs

from core.events import Reason, busy_message
from core.lease import Lease, LeaseKind, LeaseLedger
from core.policy import exceeds, overrun
from core.pool import MAX_BATCH_SLOTS


@attrs.define
class Waiter:
    """A queued request or manager, not yet granted."""

    ticket: int
    kind: LeaseKind
    enqueued_at: float
    deadline: float | None


@attrs.frozen
class Granted:
    """The caller holds ``lease`` now. ``fast`` is True when no queueing happened."""

    lease: Lease
    fast: bool = False

    @property
    def ticket(self) -> int:
        return self.lease.ticket


@attrs.frozen
class Queued:
    """The caller waits; a later :class:`Wakeups` grants or expires it by ``deadline``."""

    ticket: int
    kind: LeaseKind
    deadline: float | None
    position: int


class RetryBasis(enum.Enum):
    """What a :class:`RetryAfter` rests on."""

    OBSERVED = "observed"  # the moving average of finished holds
    RUNNING = "running"  # no hold has finished yet: the longest one still running
    DEFAULT = "default"  # nothing held and nothing finished: the configured default


@attrs.frozen
class RetryAfter:
    """When a refused client should come back: whole seconds (at least 1, rounded up)."""

    seconds: int
    basis: RetryBasis

    @classmethod
    def of(cls, estimate: float, basis: RetryBasis) -> RetryAfter:
        """``estimate`` seconds rounded up, at least 1."""
        return cls(max(1, math.ceil(estimate)) if math.isfinite(estimate) else 1, basis)


@attrs.frozen
class Rejected:
    """Refused at once (HTTP 503): why, the client-facing message, and when to come back."""

    ticket: int
    reason: Reason
    message: str
    retry_after: RetryAfter | None = None


@attrs.frozen
class Expired:
    """A queued waiter removed without a grant (its deadline passed)."""

    ticket: int
    kind: LeaseKind
    reason: Reason
    message: str
    retry_after: RetryAfter | None = None


@attrs.frozen
class Wakeups:
    """Who must be woken after a state change: new grants and expiries, in dispatch order."""

    granted: tuple[Lease, ...] = ()
    expired: tuple[Expired, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.granted or self.expired)

    def merge(self, other: Wakeups) -> Wakeups:
        """Both sets of wakeups, this one's first."""
        return Wakeups(self.granted + other.granted, self.expired + other.expired)


@attrs.frozen
class Released:
    """A release: the lease that ended (None if the ticket held none: a double release)."""

    lease: Lease | None
    wakeups: Wakeups
    double: bool = False


@attrs.frozen
class Cancelled:
    """A cancellation: ``was`` says whether the ticket was queued, granted, or unknown."""

    ticket: int
    was: str
    wakeups: Wakeups


@attrs.frozen
class AdmissionState:
    """The observable counters (``/v1/models`` maps active->active_slots, queued_requests)."""

    slots: int
    active: int
    queued_requests: int
    queued_management: int
    exclusive: bool
    generation: int


Decision = Granted | Queued | Rejected
NO_WAKEUPS = Wakeups()


def check_timeout(timeout: float | None) -> None:
    """A busy timeout is finite positive seconds, or None (unbounded); anything else (0, which
    external formats use for unbounded, or infinity) is a caller bug."""
    if timeout is not None and not (timeout > 0 and math.isfinite(timeout)):
        raise ValueError(f"a timeout is positive seconds or None (unbounded), got {timeout!r}")


class Admission:
    """The FIFO scheduler of one model's slots and its exclusive management lease."""

    def __init__(
        self,
        model: str,
        slots: int = 1,
        *,
        max_queue: int | None = None,
        generation: int = 0,
        default_retry_after: float = 1.0,
    ) -> None:
        if not 1 <= slots <= MAX_BATCH_SLOTS:
            raise ValueError(f"slots must be between 1 and {MAX_BATCH_SLOTS}")
        if max_queue is not None and max_queue < 0:
            raise ValueError("max_queue must be >= 0 or None")
        self.model = model
        self.count = slots
        self.max_queue = max_queue
        self.generation = generation
        self.default_retry_after = default_retry_after
        self.ledger = LeaseLedger()
        self._holder: list[int | None] = [None] * slots
        self._since: list[float | None] = [None] * slots
        self._exclusive: int | None = None
        self._exclusive_since: float | None = None
        self._queue: deque[Waiter] = deque()
        self._waiting: dict[int, Waiter] = {}
        self._active = 0
        self._queued_requests = 0
        self._queued_management = 0
        self._hold_ewma: float | None = None
        self._admitting = True

    # ------------------------------------------------------------------ reads
    def state(self) -> AdmissionState:
        """The counters: configured slots, occupied request slots, queued waiters by kind."""
        return AdmissionState(
            slots=self.count,
            active=self._active,
            queued_requests=self._queued_requests,
            queued_management=self._queued_management,
            exclusive=self._exclusive is not None,
            generation=self.generation,
        )

    def waiters(self) -> Iterator[Waiter]:
        """Queued waiters in FIFO order."""
        return iter(tuple(self._queue))

    def occupied(self) -> dict[int, tuple[int, float]]:
        """Occupied slot -> (ticket, granted_at)."""
        out: dict[int, tuple[int, float]] = {}
        for i, (ticket, since) in enumerate(zip(self._holder, self._since, strict=True)):
            if ticket is not None and since is not None:
                out[i] = (ticket, since)
        return out

    @property
    def exclusive_ticket(self) -> int | None:
        """The ticket holding the exclusive lease, if any."""
        return self._exclusive

    def is_queued(self, ticket: int) -> bool:
        """Whether ``ticket`` is still waiting in the queue."""
        return ticket in self._waiting

    def is_idle(self) -> bool:
        """No slot occupied, nothing exclusive and nothing queued."""
        return self._exclusive is None and not self._queue and self._active == 0

    def next_deadline(self) -> float | None:
        """The earliest deadline among queued waiters (when the caller must call :meth:`expire`)."""
        deadlines = [w.deadline for w in self._queue if w.deadline is not None]
        return min(deadlines) if deadlines else None

    # --------------------------------------------------------------- requests
    def request(self, ticket: int, now: float, timeout: float | None) -> Decision:
        """Admit one inference request: grant a slot, queue it, or reject it at once.

        Fast path first (no overrun checks); then the overdue rule; then the
        optional queue bound; otherwise the request queues behind everything
        already waiting, with a deadline ``now + timeout`` unless it is unbounded.
        """
        self._check_new_ticket(ticket)
        check_timeout(timeout)
        if not self._admitting:
            return self._reject(ticket, Reason.SHUTTING_DOWN, now)
        if self._exclusive is None and not self._queue:
            slot = self._free_slot()
            if slot is not None:
                return Granted(self._grant_slot(ticket, slot, now), fast=True)
        overdue = self._request_overdue(now, timeout)
        if overdue is not None:
            return self._reject(ticket, overdue, now)
        if exceeds(self._queued_requests + 1, self.max_queue):
            return self._reject(ticket, Reason.QUEUE_FULL, now)
        return self._enqueue(ticket, LeaseKind.REQUEST, now, timeout)

    def _request_overdue(self, now: float, timeout: float | None) -> Reason | None:
        """The overdue rule for a request that cannot take the fast path (reference §3.4).

        Rejected when the exclusive holder has overrun ``timeout``, or when no
        exclusive lease is held and *every occupied* slot has overrun it. Free
        slots and queued waiters (managers included) never suppress the rule;
        one healthy occupied slot permits bounded waiting; an unbounded timeout disables it.
        """
        if overrun(self._exclusive_since, now, timeout):
            return Reason.EXCLUSIVE_OVERDUE
        occupied = [s for s in self._since[: self.count] if s is not None]
        if (
            occupied
            and self._exclusive is None
            and timeout is not None
            and all(overrun(s, now, timeout) for s in occupied)
        ):
            return Reason.SLOTS_OVERDUE
        return None

    def manage(self, ticket: int, now: float, timeout: float | None) -> Decision:
        """Admit one management operation: exclusive use of the whole model.

        Fails fast when the exclusive holder or *any* slot has overrun ``timeout``
        (stricter than requests, as in the original); otherwise joins the queue and
        is granted once every earlier waiter is served and no slot is occupied.
        """
        self._check_new_ticket(ticket)
        check_timeout(timeout)
        if overrun(self._exclusive_since, now, timeout):
            return self._reject(ticket, Reason.EXCLUSIVE_OVERDUE, now)
        if any(overrun(s, now, timeout) for s in self._since):
            return self._reject(ticket, Reason.ACTIVE_SLOT_OVERDUE, now)
        decision = self._enqueue(ticket, LeaseKind.MANAGEMENT, now, timeout)
        return decision

    def try_acquire(self, ticket: int, now: float) -> Granted | Rejected:
        """Exclusive lease without waiting, only on an idle, queue-free model (eviction,
        retirement)."""
        self._check_new_ticket(ticket)
        if self.is_idle():
            return Granted(self._grant_exclusive(ticket, now), fast=True)
        return Rejected(ticket, Reason.BUSY, f"model '{self.model}': busy")

    # ---------------------------------------------------------- state changes
    def release(self, ticket: int, now: float) -> Released:
        """End the lease of ``ticket`` (exactly once) and dispatch the queue.

        A second release of the same ticket changes nothing and is reported as
        ``double=True`` (recorded in the ledger for the invariant checker).
        """
        lease = self.ledger.release(ticket)
        if lease is None:
            return Released(None, Wakeups(), double=True)
        if lease.kind is LeaseKind.MANAGEMENT:
            self._exclusive = None
            self._exclusive_since = None
        else:
            slot = lease.request_slot()
            held = now - lease.granted_at
            self._hold_ewma = (
                held if self._hold_ewma is None else 0.8 * self._hold_ewma + 0.2 * held
            )
            self._holder[slot] = None
            self._since[slot] = None
            self._active -= 1
        return Released(lease, self._dispatch(now) if self._queue else NO_WAKEUPS)

    def cancel(self, ticket: int, now: float) -> Cancelled:
        """Withdraw ``ticket``: a queued waiter leaves the queue, a granted one is released.

        Either way the queue is dispatched again, so work blocked only by a
        withdrawn barrier proceeds at once.
        """
        waiter = self._waiting.get(ticket)
        if waiter is not None:
            self._remove(waiter)
            return Cancelled(ticket, "queued", self._dispatch(now))
        if self.ledger.holds(ticket):
            return Cancelled(ticket, "granted", self.release(ticket, now).wakeups)
        return Cancelled(ticket, "unknown", Wakeups())

    def expire(self, now: float) -> Wakeups:
        """Remove every queued waiter whose deadline has come (``now >= deadline``), then
        dispatch."""
        expired: list[Expired] = []
        for waiter in tuple(self._queue):
            if waiter.deadline is not None and now >= waiter.deadline:
                self._remove(waiter)
                expired.append(self._expired(waiter))
        return Wakeups((), tuple(expired)).merge(self._dispatch(now))

    def configure(self, slots: int, *, bump_generation: bool = True) -> int:
        """Resize to ``slots`` and (by default) start a new configuration generation.

        Allowed only while no request slot is occupied (before publication, or
        under the exclusive management lease). Returns the new generation.
        """
        if not 1 <= slots <= MAX_BATCH_SLOTS:
            raise ValueError(f"slots must be between 1 and {MAX_BATCH_SLOTS}")
        if self._active:
            raise RuntimeError("cannot resize occupied slots")
        self.count = slots
        grow = slots - len(self._holder)
        if grow > 0:  # every slot is free here: the new ones too
            self._holder += [None] * grow
            self._since += [None] * grow
        if bump_generation:
            self.generation += 1
        return self.generation

    def stop_admitting(self) -> None:
        """Shutdown: refuse new requests; queued and admitted work still drains."""
        self._admitting = False

    def retry_after(self, now: float) -> RetryAfter:
        """When a slot would be free for a client that joined the back of the queue at ``now``.

        A hold is expected to last the moving average of finished holds (or, before
        any has finished, as long as the longest one running). A holder that has
        run ``e`` seconds frees its slot in ``mean - e``; one already past the mean
        is expected to need one more mean. Each request queued ahead takes the
        next slot to free up and holds it for a mean; the client's turn is the
        slot that frees after theirs.
        """
        plan = self._slot_plan(now)
        if plan is None:
            return RetryAfter.of(self.default_retry_after, RetryBasis.DEFAULT)
        free_at, basis = plan
        return RetryAfter.of(min(free_at), basis)

    def idle_after(self, now: float) -> RetryAfter:
        """When every slot would be free with the queue served (the same estimate as
        :meth:`retry_after`)."""
        plan = self._slot_plan(now)
        if plan is None:
            return RetryAfter.of(self.default_retry_after, RetryBasis.DEFAULT)
        free_at, basis = plan
        return RetryAfter.of(max(free_at), basis)

    def _slot_plan(self, now: float) -> tuple[list[float], RetryBasis] | None:
        """Expected seconds until each slot frees once the queued requests have had theirs (None: no
        basis)."""
        running = [now - since for since in self._since[: self.count] if since is not None]
        if self._hold_ewma is not None:
            mean, basis = self._hold_ewma, RetryBasis.OBSERVED
        elif running:
            mean, basis = max(running), RetryBasis.RUNNING
        else:
            return None
        free_at = [mean - e if e < mean else mean for e in running]
        free_at += [0.0] * (self.count - len(running))
        heapq.heapify(free_at)
        for _ in range(self._queued_requests):
            heapq.heappush(free_at, heapq.heappop(free_at) + mean)
        return free_at, basis

    # --------------------------------------------------------------- internal
    def _dispatch(self, now: float, *, expire: bool = True) -> Wakeups:
        """Grant from the head of the queue while the head can be served (reference §3.6).

        With ``expire=False`` a head whose deadline has come blocks instead of
        expiring: an enqueue cannot hand other waiters' wakeups back to the
        caller, so the due head is left to the caller's :meth:`expire` call.
        """
        granted: list[Lease] = []
        expired: list[Expired] = []
        while self._queue:
            head = self._queue[0]
            if head.deadline is not None and now >= head.deadline:
                if not expire:
                    break
                self._remove(head)
                expired.append(self._expired(head))
                continue
            if self._exclusive is not None:
                break
            if head.kind is LeaseKind.MANAGEMENT:
                if self._active:
                    break
                self._remove(head)
                granted.append(self._grant_exclusive(head.ticket, now))
            else:
                slot = self._free_slot()
                if slot is None:
                    break
                self._remove(head)
                granted.append(self._grant_slot(head.ticket, slot, now))
        if not granted and not expired:
            return NO_WAKEUPS
        return Wakeups(tuple(granted), tuple(expired))

    def _enqueue(self, ticket: int, kind: LeaseKind, now: float, timeout: float | None) -> Decision:
        deadline = None if timeout is None else now + timeout
        waiter = Waiter(ticket, kind, now, deadline)
        self._queue.append(waiter)
        self._waiting[ticket] = waiter
        if kind is LeaseKind.REQUEST:
            self._queued_requests += 1
        else:
            self._queued_management += 1
        wakeups = self._dispatch(now, expire=False)
        for lease in wakeups.granted:
            if lease.ticket == ticket:
                return Granted(lease)
        return Queued(ticket, kind, deadline, len(self._queue) - 1)

    def _remove(self, waiter: Waiter) -> None:
        if self._queue[0] is waiter:
            self._queue.popleft()
        else:
            self._queue.remove(waiter)
        del self._waiting[waiter.ticket]
        if waiter.kind is LeaseKind.REQUEST:
            self._queued_requests -= 1
        else:
            self._queued_management -= 1

    def _free_slot(self) -> int | None:
        for i in range(self.count):
            if self._holder[i] is None:
                return i
        return None

    def _grant_slot(self, ticket: int, slot: int, now: float) -> Lease:
        lease = Lease(self.model, ticket, LeaseKind.REQUEST, slot, self.generation, now)
        self._holder[slot] = ticket
        self._since[slot] = now
        self._active += 1
        self.ledger.grant(lease)
        return lease

    def _grant_exclusive(self, ticket: int, now: float) -> Lease:
        lease = Lease(self.model, ticket, LeaseKind.MANAGEMENT, None, self.generation, now)
        self._exclusive = ticket
        self._exclusive_since = now
        self.ledger.grant(lease)
        return lease

    def _reject(self, ticket: int, reason: Reason, now: float) -> Rejected:
        return Rejected(ticket, reason, busy_message(self.model, reason), self.retry_after(now))

    def _expired(self, waiter: Waiter) -> Expired:
        # expiry happens at the waiter's deadline (the driver's timer), after it left the queue
        now = waiter.deadline if waiter.deadline is not None else waiter.enqueued_at
        return Expired(
            waiter.ticket,
            waiter.kind,
            Reason.QUEUE_TIMEOUT,
            busy_message(self.model, Reason.QUEUE_TIMEOUT),
            self.retry_after(now),
        )

    def _check_new_ticket(self, ticket: int) -> None:
        if self.ledger.holds(ticket) or self.is_queued(ticket):
            raise ValueError(f"ticket {ticket} is already known to model '{self.model}'")
