"""The traced facade over the registry: every core call the runtime makes, recorded.

The runtime never calls the admission, lifecycle or residency machines directly:
it calls :class:`Core`, which forwards the call, turns the decision into a short
deterministic summary, and appends a :class:`~core.events.TraceRecord` with the
call's name and arguments. Because every input to core passes through here,
feeding the recorded calls to a fresh :class:`Core` (see :mod:`core.replay`)
must reproduce every decision; the first one that differs is a divergence.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

from core.admission import Cancelled, Decision, Granted, Queued, Rejected, Released, Wakeups
from core.bulk import BulkUnload
from core.entry import ModelEntry
from core.events import Reason, TraceRecord
from core.lease import LeaseKind
from core.lifecycle import Abandoned, LoadOutcome, Nothing, Proceed, StartLoad, Teardown, WaitLoad
from core.policy import RuntimeKind
from core.registry import Existing, Registered, Registry
from core.residency import Eviction, ResidencyLimits, RoomDecision, retire_idle

Sink = Callable[[TraceRecord], None]


def wakeup_fields(w: Wakeups) -> dict[str, Any]:
    """Grants as ``[ticket, slot]`` (slot None: a manager) and expiries as tickets, in dispatch
    order."""
    return {
        "granted": [[lease.ticket, lease.slot] for lease in w.granted],
        "expired": [e.ticket for e in w.expired],
    }


def decision_fields(d: Decision) -> dict[str, Any]:
    """An admission decision: granted (ticket, slot, generation, fast path), queued (position)
    or rejected (reason, Retry-After seconds)."""
    if isinstance(d, Granted):
        lease = d.lease
        return {
            "outcome": "granted",
            "ticket": lease.ticket,
            "slot": lease.slot,
            "generation": lease.generation,
            "fast": d.fast,
        }
    if isinstance(d, Queued):
        return {"outcome": "queued", "position": d.position}
    retry = None if d.retry_after is None else d.retry_after.seconds
    return {"outcome": "rejected", "reason": d.reason.value, "retry_after": retry}


def room_fields(d: RoomDecision) -> dict[str, Any]:
    """A cold-load decision: evictions as ``[model, ticket]``, the loader, the next initializer."""
    return {
        "outcome": "refused" if d.refused is not None else "room",
        "evict": [[e.model, e.lease.ticket] for e in d.evictions],
        "load": None if d.load is None else d.load.ticket,
        "retry": None if d.retry is None else d.retry.ticket,
    }


def teardown_fields(d: Teardown | Nothing) -> dict[str, Any]:
    """A retirement: the generation whose pool must be torn down (None: nothing to tear down)."""
    return {"teardown": d.generation if isinstance(d, Teardown) else None}


def describe_wakeups(w: Wakeups) -> str:
    """``granted=[t:slot...] expired=[t...]`` in dispatch order."""
    granted = ",".join(
        f"{lease.ticket}:{'x' if lease.slot is None else lease.slot}" for lease in w.granted
    )
    expired = ",".join(str(e.ticket) for e in w.expired)
    return f"granted=[{granted}] expired=[{expired}]"


def describe_decision(d: Decision) -> tuple[str, str]:
    """A decision as (summary, reason)."""
    if isinstance(d, Granted):
        slot = "x" if d.lease.slot is None else d.lease.slot
        return f"granted slot={slot} gen={d.lease.generation} fast={int(d.fast)}", ""
    if isinstance(d, Queued):
        return f"queued pos={d.position}", ""
    return "rejected", d.reason.value


def describe_room(d: RoomDecision) -> tuple[str, str]:
    """A cold-load decision as (summary, reason)."""
    ev = ",".join(f"{e.model}:{e.lease.ticket}" for e in d.evictions)
    retry = "" if d.retry is None else f" retry={d.retry.ticket}"
    if d.refused is not None:
        return f"refused evict=[{ev}]{retry}", d.refused[0].value
    load = "" if d.load is None else f" load={d.load.ticket}"
    return f"room evict=[{ev}]{load}{retry}", ""


class Core:
    """The registry plus a trace of every call made to it."""

    def __init__(
        self,
        limits: ResidencyLimits | None = None,
        *,
        max_queue: int | None = None,
        sink: Sink | None = None,
        kind: RuntimeKind = RuntimeKind.PARALLEL,
        choose: Callable[[Sequence[int]], int] | None = None,
    ) -> None:
        self.registry = Registry(limits, max_queue=max_queue, kind=kind, choose=choose)
        self._sink = sink
        self._seq = 0

    # ------------------------------------------------------------- recording
    def _record(
        self,
        now: float,
        model: str,
        event: str,
        args: dict[str, Any],
        decision: str,
        reason: str = "",
        fields: dict[str, Any] | None = None,
    ) -> None:
        if self._sink is None:
            return
        self._seq += 1
        self._sink(TraceRecord(self._seq, now, model, event, args, decision, reason, fields or {}))

    def entry(self, model: str) -> ModelEntry:
        """The entry of ``model`` (a KeyError for an unknown id is a caller bug)."""
        entry = self.registry.get(model)
        if entry is None:
            raise KeyError(model)
        return entry

    # --------------------------------------------------------------- tickets
    def new_ticket(self, now: float) -> int:
        ticket = self.registry.new_ticket()
        self._record(now, "", "new_ticket", {}, str(ticket), fields={"ticket": ticket})
        return ticket

    # ----------------------------------------------------------- registration
    def register(
        self, model: str, slots: int, memory_bytes: int, now: float
    ) -> Registered | Existing:
        r = self.registry.register(model, slots=slots, now=now, memory_bytes=memory_bytes)
        summary = f"registered ticket={r.lease.ticket}" if isinstance(r, Registered) else "existing"
        ticket = r.lease.ticket if isinstance(r, Registered) else None
        fields = {
            "outcome": "registered" if isinstance(r, Registered) else "existing",
            "ticket": ticket,
        }
        self._record(
            now,
            model,
            "register",
            {"slots": slots, "memory_bytes": memory_bytes},
            summary,
            fields=fields,
        )
        return r

    # -------------------------------------------------------------- admission
    def request(self, model: str, ticket: int, now: float, timeout: float) -> Decision:
        d = self.entry(model).admission.request(ticket, now, timeout)
        self._record(
            now,
            model,
            "request",
            {"ticket": ticket, "timeout": timeout},
            *describe_decision(d),
            decision_fields(d),
        )
        return d

    def manage(self, model: str, ticket: int, now: float, timeout: float) -> Decision:
        d = self.entry(model).admission.manage(ticket, now, timeout)
        self._record(
            now,
            model,
            "manage",
            {"ticket": ticket, "timeout": timeout},
            *describe_decision(d),
            decision_fields(d),
        )
        return d

    def try_acquire(self, model: str, ticket: int, now: float) -> Granted | Rejected:
        d = self.entry(model).admission.try_acquire(ticket, now)
        self._record(
            now, model, "try_acquire", {"ticket": ticket}, *describe_decision(d), decision_fields(d)
        )
        return d

    def release(self, model: str, ticket: int, now: float) -> Released:
        entry = self.entry(model)
        r = entry.admission.release(ticket, now)
        used = r.lease is not None and r.lease.kind is LeaseKind.REQUEST
        if used:  # the end of a use: idle retirement and LRU eviction count from here
            self.registry.touch(entry, now)
        summary = (
            ("double " if r.double else "")
            + describe_wakeups(r.wakeups)
            + (" used" if used else "")
        )
        self._record(
            now,
            model,
            "release",
            {"ticket": ticket},
            summary,
            fields={"double": r.double, "used": used, **wakeup_fields(r.wakeups)},
        )
        return r

    def cancel(self, model: str, ticket: int, now: float) -> Cancelled:
        c = self.entry(model).admission.cancel(ticket, now)
        self._record(
            now,
            model,
            "cancel",
            {"ticket": ticket},
            f"{c.was} {describe_wakeups(c.wakeups)}",
            fields={"was": c.was, **wakeup_fields(c.wakeups)},
        )
        return c

    def expire(self, model: str, now: float) -> Wakeups:
        w = self.entry(model).admission.expire(now)
        self._record(now, model, "expire", {}, describe_wakeups(w), fields=wakeup_fields(w))
        return w

    def stop_admitting(self, model: str, now: float) -> None:
        self.entry(model).admission.stop_admitting()
        self._record(now, model, "stop_admitting", {}, "ok")

    # -------------------------------------------------------------- lifecycle
    def ensure_loaded(
        self, model: str, ticket: int, now: float
    ) -> Proceed | WaitLoad | RoomDecision:
        d = self.registry.ensure_loaded(self.entry(model), ticket, now)
        if isinstance(d, Proceed):
            summary, reason = f"proceed gen={d.generation}", ""
            fields: dict[str, Any] = {"outcome": "proceed", "generation": d.generation}
        elif isinstance(d, WaitLoad):
            summary, reason = f"wait initializer={d.initializer}", ""
            fields = {"outcome": "wait", "initializer": d.initializer}
        else:
            (summary, reason), fields = describe_room(d), room_fields(d)
        self._record(now, model, "ensure_loaded", {"ticket": ticket}, summary, reason, fields)
        return d

    def begin_load(self, model: str, start: StartLoad, now: float) -> RoomDecision:
        d = self.registry.begin_load(self.entry(model), start, now)
        self._record(
            now,
            model,
            "begin_load",
            {"ticket": start.ticket, "generation": start.generation},
            *describe_room(d),
            room_fields(d),
        )
        return d

    def load_succeeded(self, model: str, ticket: int, capacity: int, now: float) -> LoadOutcome:
        entry = self.entry(model)
        outcome = entry.lifecycle.load_succeeded(ticket)
        entry.capacity = capacity
        self._record(
            now,
            model,
            "load_succeeded",
            {"ticket": ticket, "capacity": capacity},
            f"proceed={list(outcome.proceed)}",
            fields={"proceed": list(outcome.proceed)},
        )
        return outcome

    def load_failed(self, model: str, ticket: int, now: float) -> LoadOutcome:
        outcome = self.entry(model).lifecycle.load_failed(ticket)
        retry = "" if outcome.retry is None else str(outcome.retry.ticket)
        self._record(
            now,
            model,
            "load_failed",
            {"ticket": ticket},
            f"retry={retry}",
            fields={"retry": None if outcome.retry is None else outcome.retry.ticket},
        )
        return outcome

    def abandon_wait(self, model: str, ticket: int, now: float) -> Abandoned:
        left = self.entry(model).lifecycle.abandon_wait(ticket)
        retry = "" if left.retry is None else str(left.retry.ticket)
        fields = {
            "left": left.left.value,
            "retry": None if left.retry is None else left.retry.ticket,
        }
        self._record(
            now,
            model,
            "abandon_wait",
            {"ticket": ticket},
            f"{left.left.value} retry={retry}",
            fields=fields,
        )
        return left

    def begin_unload(self, model: str, now: float) -> Teardown | Nothing:
        d = self.entry(model).lifecycle.begin_unload()
        summary = f"teardown gen={d.generation}" if isinstance(d, Teardown) else "nothing"
        self._record(now, model, "begin_unload", {}, summary, fields=teardown_fields(d))
        return d

    def unload_finished(self, model: str, now: float) -> None:
        self.entry(model).lifecycle.unload_finished()
        self._record(now, model, "unload_finished", {}, "ok")

    def begin_reconfigure(self, model: str, now: float) -> None:
        self.entry(model).lifecycle.begin_reconfigure()
        self._record(now, model, "begin_reconfigure", {}, "ok")

    def reject_reconfigure(self, model: str, now: float, reason: Reason) -> None:
        self.entry(model).lifecycle.reject_reconfigure()
        self._record(now, model, "reject_reconfigure", {}, "ok", reason.value)

    def commit_reconfigure(
        self,
        model: str,
        slots: int,
        now: float,
        config: Any = None,
        memory_bytes: int | None = None,
    ) -> Teardown | Nothing:
        d = self.entry(model).commit_reconfigure(slots, config, memory_bytes)
        summary = f"teardown gen={d.generation}" if isinstance(d, Teardown) else "nothing"
        args: dict[str, Any] = {"slots": slots}
        if memory_bytes is not None:
            args["memory_bytes"] = memory_bytes
        self._record(now, model, "commit_reconfigure", args, summary, fields=teardown_fields(d))
        return d

    def set_memory(self, model: str, memory_bytes: int, now: float) -> bool:
        """An operational update of ``model``'s memory estimate (no reload); False if refused."""
        ok = self.registry.set_memory(self.entry(model), memory_bytes)
        self._record(
            now,
            model,
            "set_memory",
            {"memory_bytes": memory_bytes},
            "ok" if ok else "refused",
            fields={"ok": ok},
        )
        return ok

    # ------------------------------------------------------------ bulk, idle
    def bulk_publish(self, ids: Iterable[str] | None, now: float) -> BulkUnload:
        selection = None if ids is None else list(ids)
        bulk = BulkUnload.publish(self.registry, selection, now)
        summary = f"tickets={bulk.tickets} ready={bulk.ready} missing={list(bulk.not_found)}"
        fields = {
            "tickets": dict(bulk.tickets),
            "ready": list(bulk.ready),
            "missing": list(bulk.not_found),
        }
        self._record(now, "", "bulk_publish", {"ids": selection}, summary, fields=fields)
        return bulk

    def retire_idle(self, now: float, idle_seconds: float) -> tuple[Eviction, ...]:
        victims = retire_idle(self.registry, now, idle_seconds)
        summary = ",".join(f"{v.model}:{v.lease.ticket}" for v in victims)
        fields = {"evict": [[v.model, v.lease.ticket] for v in victims]}
        self._record(
            now, "", "retire_idle", {"idle_seconds": idle_seconds}, f"[{summary}]", fields=fields
        )
        return victims
