"""Bulk unload (reference §4.9): one barrier per selected model, published in one step.

The selection is a snapshot (deduplicated; unknown ids reported apart). Every
barrier is enqueued in one synchronous step, so two overlapping bulk calls with
reversed selections cannot each hold one model while waiting for the other:
every shared model sees the first call's barrier before the second's. Barriers
have no timeout (None: never fail fast, never expire). Models whose barrier is granted at
once (ready and idle, or unloaded) are unloaded before the call waits for any
busy or loading model; the rest are unloaded as their barriers are granted.
"""

from __future__ import annotations

from collections.abc import Iterable

import attrs

from core.admission import Granted
from core.lifecycle import ModelState
from core.policy import RuntimeKind
from core.registry import Registry


@attrs.frozen
class UnloadNow:
    """Unload ``model`` under the lease of ``ticket`` (already granted), then release it."""

    model: str
    ticket: int


@attrs.frozen
class WaitForGrant:
    """Nothing is ready: wait until one of ``models``' barriers is granted."""

    models: tuple[str, ...]


@attrs.frozen
class BulkDone:
    """Every selected model is unloaded."""

    unloaded: tuple[str, ...]
    not_found: tuple[str, ...]


@attrs.define
class BulkUnload:
    """The progress of one bulk unload."""

    selected: tuple[str, ...]
    not_found: tuple[str, ...]
    tickets: dict[str, int]
    ready: list[str]
    waiting: list[str]
    in_progress: list[str] = attrs.field(factory=list)
    done: list[str] = attrs.field(factory=list)
    started: list[str] = attrs.field(factory=list)
    ready_at_publication: tuple[str, ...] = ()

    @classmethod
    def publish(cls, registry: Registry, ids: Iterable[str] | None, now: float) -> BulkUnload:
        """Snapshot the selection and enqueue every barrier now, in selection order."""
        entries, missing = registry.snapshot(ids)
        if registry.kind is RuntimeKind.ORIGINAL:
            # the original runtime's bulk unload skips models whose first load is unpublished
            entries = tuple(e for e in entries if e.lifecycle.state is not ModelState.LOADING)
        tickets: dict[str, int] = {}
        ready: list[str] = []
        waiting: list[str] = []
        for entry in entries:
            ticket = registry.new_ticket()
            tickets[entry.id] = ticket
            decision = entry.admission.manage(ticket, now, None)
            (ready if isinstance(decision, Granted) else waiting).append(entry.id)
        return cls(
            selected=tuple(e.id for e in entries),
            not_found=missing,
            tickets=tickets,
            ready=ready,
            waiting=waiting,
            ready_at_publication=tuple(ready),
        )

    def owns(self, ticket: int) -> str | None:
        """The model whose barrier is ``ticket``, if it is one of this call's."""
        for model, t in self.tickets.items():
            if t == ticket:
                return model
        return None

    def granted(self, model: str) -> None:
        """A waiting barrier was granted: that model is ready to unload."""
        if model in self.waiting:
            self.waiting.remove(model)
            self.ready.append(model)

    def next_action(self) -> UnloadNow | WaitForGrant | BulkDone | None:
        """What to do next: unload a ready model first, else wait, else done.

        None means unloads are in progress and nothing else can start yet.
        """
        if self.ready:
            model = self.ready.pop(0)
            self.in_progress.append(model)
            self.started.append(model)
            return UnloadNow(model, self.tickets[model])
        if self.waiting:
            return WaitForGrant(tuple(self.waiting))
        if self.in_progress:
            return None
        return BulkDone(tuple(m for m in self.selected if m in self.done), self.not_found)

    def finished(self, model: str) -> None:
        """The unload of ``model`` is complete (its lease released by the caller)."""
        self.in_progress.remove(model)
        self.done.append(model)

    def order_violation(self) -> str | None:
        """Invariant 9: every model ready at publication starts unloading before any waited-for
        one."""
        first_waited = next(
            (i for i, m in enumerate(self.started) if m not in self.ready_at_publication), None
        )
        if first_waited is None:
            return None
        late = [m for m in self.started[first_waited:] if m in self.ready_at_publication]
        if late:
            return f"bulk unload freed busy model(s) before ready idle {late}"
        return None
