"""Leases: a grant that binds one holder to one slot (or the whole model) and one generation.

A request lease holds exactly one slot index of one model's pool, under the
configuration generation current when it was granted, so the runtime can check
that it runs on that configuration and no other. A management lease holds the
whole model exclusively and has no slot. Every lease is released exactly once:
the ledger turns a second release into a recorded error rather than a second
free of the slot.
"""

from __future__ import annotations

import enum

import attrs


class LeaseKind(enum.Enum):
    """A request takes one slot; management takes the whole model exclusively."""

    REQUEST = "request"
    MANAGEMENT = "management"


@attrs.frozen
class Lease:
    """One grant. ``slot`` is None for management; ``generation`` is the configuration it binds."""

    model: str
    ticket: int
    kind: LeaseKind
    slot: int | None
    generation: int
    granted_at: float

    def request_slot(self) -> int:
        """The slot of a request lease; a management lease has none (a logic error to ask)."""
        if self.slot is None:
            raise ValueError("management lease has no request slot")
        return self.slot


@attrs.define
class LeaseLedger:
    """The live leases of one model, by ticket, and every double release seen."""

    active: dict[int, Lease] = attrs.field(factory=dict)
    double_releases: list[int] = attrs.field(factory=list)

    def grant(self, lease: Lease) -> None:
        """Record a new lease; a ticket can hold one lease at a time."""
        if lease.ticket in self.active:
            raise ValueError(f"ticket {lease.ticket} already holds a lease")
        self.active[lease.ticket] = lease

    def release(self, ticket: int) -> Lease | None:
        """Forget the lease of ``ticket`` and return it; None (and a recorded error) if it had
        none."""
        lease = self.active.pop(ticket, None)
        if lease is None:
            self.double_releases.append(ticket)
        return lease

    def holds(self, ticket: int) -> bool:
        """Whether ``ticket`` holds a live lease."""
        return ticket in self.active
