"""The traced facade over the registry: every core call the runtime makes, recorded.

The runtime never calls the admission, lifecycle or residency machines directly:
it calls :class:`Core`, which forwards the call, turns the decision into typed
``fields`` (one ``*_fields`` function per kind of decision), renders the short
summary people read from those fields alone (:data:`SUMMARIES`, so the two can
never disagree), and appends a :class:`~core.events.TraceRecord` with the call's
name and arguments. Because every input to core passes through here,
feeding the recorded calls to a fresh :class:`Core` (see :mod:`core.replay`)
must reproduce every decision; the first one that differs is a divergence.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from core.admission import Cancelled, Decision, Granted, Queued, Rejected, Released, Wakeups
from core.bulk import BulkUnload
from core.entry import ModelEntry
from core.events import Reason, TraceRecord
from core.lease import LeaseKind
from core.lifecycle import Abandoned, LoadOutcome, Nothing, Proceed, StartLoad, Teardown, WaitLoad
from core.policy import RuntimeKind, unbound_as_zero
from core.registry import Existing, Registered, Registry
from core.residency import Eviction, ResidencyLimits, RoomDecision, retire_idle

Sink = Callable[[TraceRecord], None]


Fields = Mapping[str, Any]
"""A decision as typed, JSON-serialisable values (a :class:`~core.events.TraceRecord`'s
``fields``)."""


# ------------------------------------------------------------------ fields
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


def decision_reason(d: Decision) -> str:
    """The reason code of an admission decision (empty unless rejected)."""
    return d.reason.value if isinstance(d, Rejected) else ""


def room_fields(d: RoomDecision) -> dict[str, Any]:
    """A cold-load decision: evictions as ``[model, ticket]``, the loader, the next initializer."""
    return {
        "outcome": "refused" if d.refused is not None else "room",
        "evict": [[e.model, e.lease.ticket] for e in d.evictions],
        "load": None if d.load is None else d.load.ticket,
        "retry": None if d.retry is None else d.retry.ticket,
    }


def room_reason(d: RoomDecision) -> str:
    """The reason code of a cold-load decision (empty unless refused)."""
    return "" if d.refused is None else d.refused[0].value


def ensure_fields(d: Proceed | WaitLoad | RoomDecision) -> dict[str, Any]:
    """A first-holder decision: proceed (generation), wait (the initializer) or a room decision."""
    if isinstance(d, Proceed):
        return {"outcome": "proceed", "generation": d.generation}
    if isinstance(d, WaitLoad):
        return {"outcome": "wait", "initializer": d.initializer}
    return room_fields(d)


def teardown_fields(d: Teardown | Nothing) -> dict[str, Any]:
    """A retirement: the generation whose pool must be torn down (None: nothing to tear down)."""
    return {"teardown": d.generation if isinstance(d, Teardown) else None}


def eviction_fields(victims: Iterable[Eviction]) -> dict[str, Any]:
    """Models taken for eviction or retirement, as ``[model, ticket]``."""
    return {"evict": [[v.model, v.lease.ticket] for v in victims]}


# --------------------------------------------------------------- summaries
# The summary of a record is a function of its fields: one renderer per decision kind, so the
# text people read can never say something the typed decision does not.
def _slot(slot: int | None) -> str:
    return "x" if slot is None else str(slot)


def _blank(value: Any) -> str:
    return "" if value is None else str(value)


def summarize_wakeups(f: Fields) -> str:
    """``granted=[t:slot...] expired=[t...]`` in dispatch order (``x``: a manager's grant)."""
    granted = ",".join(f"{ticket}:{_slot(slot)}" for ticket, slot in f["granted"])
    expired = ",".join(str(ticket) for ticket in f["expired"])
    return f"granted=[{granted}] expired=[{expired}]"


def summarize_decision(f: Fields) -> str:
    """``granted slot= gen= fast=``, ``queued pos=`` or ``rejected`` (the reason has its own
    column)."""
    if f["outcome"] == "granted":
        return f"granted slot={_slot(f['slot'])} gen={f['generation']} fast={int(f['fast'])}"
    if f["outcome"] == "queued":
        return f"queued pos={f['position']}"
    return "rejected"


def summarize_room(f: Fields) -> str:
    """``room evict=[model:ticket...] load= retry=`` or ``refused evict=[...] retry=``."""
    evict = ",".join(f"{model}:{ticket}" for model, ticket in f["evict"])
    retry = "" if f["retry"] is None else f" retry={f['retry']}"
    if f["outcome"] == "refused":
        return f"refused evict=[{evict}]{retry}"
    load = "" if f["load"] is None else f" load={f['load']}"
    return f"room evict=[{evict}]{load}{retry}"


def summarize_ensure(f: Fields) -> str:
    """``proceed gen=``, ``wait initializer=`` or a room decision."""
    if f["outcome"] == "proceed":
        return f"proceed gen={f['generation']}"
    if f["outcome"] == "wait":
        return f"wait initializer={f['initializer']}"
    return summarize_room(f)


def summarize_teardown(f: Fields) -> str:
    """``teardown gen=`` or ``nothing``."""
    return "nothing" if f["teardown"] is None else f"teardown gen={f['teardown']}"


def summarize_register(f: Fields) -> str:
    """``registered ticket=`` or ``existing``."""
    return "existing" if f["outcome"] == "existing" else f"registered ticket={f['ticket']}"


def summarize_release(f: Fields) -> str:
    """The wake-ups, after ``double`` for a second release, then ``used`` for the end of a use."""
    double = "double " if f["double"] else ""
    used = " used" if f["used"] else ""
    return f"{double}{summarize_wakeups(f)}{used}"


def summarize_bulk(f: Fields) -> str:
    """``tickets={model: ticket} ready=[...] missing=[...]``."""
    tickets, ready, missing = dict(f["tickets"]), list(f["ready"]), list(f["missing"])
    return f"tickets={tickets} ready={ready} missing={missing}"


def _ok(f: Fields) -> str:
    return "ok"


SUMMARIES: Mapping[str, Callable[[Fields], str]] = {
    "new_ticket": lambda f: str(f["ticket"]),
    "register": summarize_register,
    "request": summarize_decision,
    "manage": summarize_decision,
    "try_acquire": summarize_decision,
    "release": summarize_release,
    "cancel": lambda f: f"{f['was']} {summarize_wakeups(f)}",
    "expire": summarize_wakeups,
    "stop_admitting": _ok,
    "ensure_loaded": summarize_ensure,
    "begin_load": summarize_room,
    "load_succeeded": lambda f: f"proceed={list(f['proceed'])}",
    "load_failed": lambda f: f"retry={_blank(f['retry'])}",
    "abandon_wait": lambda f: f"{f['left']} retry={_blank(f['retry'])}",
    "begin_unload": summarize_teardown,
    "unload_finished": _ok,
    "begin_reconfigure": _ok,
    "reject_reconfigure": _ok,
    "commit_reconfigure": summarize_teardown,
    "set_memory": lambda f: "ok" if f["ok"] else "refused",
    "bulk_publish": summarize_bulk,
    "retire_idle": lambda f: "[" + ",".join(f"{m}:{t}" for m, t in f["evict"]) + "]",
}
"""The renderer of each core call's summary, by event name (``ok``: a call with no decision)."""


def summarize(event: str, fields: Fields) -> str:
    """The summary of a ``event`` record whose decision is ``fields`` (see :data:`SUMMARIES`)."""
    return SUMMARIES[event](fields)


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
        fields: dict[str, Any] | None = None,
        reason: str = "",
    ) -> None:
        """Append the record of one call: its decision is ``fields``, its summary their rendering
        (:func:`summarize`), ``reason`` the decision's reason code."""
        if self._sink is None:
            return
        fields = fields or {}
        self._seq += 1
        summary = summarize(event, fields)
        self._sink(TraceRecord(self._seq, now, model, event, args, summary, reason, fields))

    def entry(self, model: str) -> ModelEntry:
        """The entry of ``model`` (a KeyError for an unknown id is a caller bug)."""
        entry = self.registry.get(model)
        if entry is None:
            raise KeyError(model)
        return entry

    # --------------------------------------------------------------- tickets
    def new_ticket(self, now: float) -> int:
        ticket = self.registry.new_ticket()
        self._record(now, "", "new_ticket", {}, {"ticket": ticket})
        return ticket

    # ----------------------------------------------------------- registration
    def register(
        self, model: str, slots: int, memory_bytes: int, now: float
    ) -> Registered | Existing:
        r = self.registry.register(model, slots=slots, now=now, memory_bytes=memory_bytes)
        fields = (
            {"outcome": "registered", "ticket": r.lease.ticket}
            if isinstance(r, Registered)
            else {"outcome": "existing", "ticket": None}
        )
        self._record(now, model, "register", {"slots": slots, "memory_bytes": memory_bytes}, fields)
        return r

    # -------------------------------------------------------------- admission
    def request(self, model: str, ticket: int, now: float, timeout: float | None) -> Decision:
        d = self.entry(model).admission.request(ticket, now, timeout)
        args = {"ticket": ticket, "timeout": unbound_as_zero(timeout)}
        self._record(now, model, "request", args, decision_fields(d), decision_reason(d))
        return d

    def manage(self, model: str, ticket: int, now: float, timeout: float | None) -> Decision:
        d = self.entry(model).admission.manage(ticket, now, timeout)
        args = {"ticket": ticket, "timeout": unbound_as_zero(timeout)}
        self._record(now, model, "manage", args, decision_fields(d), decision_reason(d))
        return d

    def try_acquire(self, model: str, ticket: int, now: float) -> Granted | Rejected:
        d = self.entry(model).admission.try_acquire(ticket, now)
        args = {"ticket": ticket}
        self._record(now, model, "try_acquire", args, decision_fields(d), decision_reason(d))
        return d

    def release(self, model: str, ticket: int, now: float) -> Released:
        entry = self.entry(model)
        r = entry.admission.release(ticket, now)
        used = r.lease is not None and r.lease.kind is LeaseKind.REQUEST
        if used:  # the end of a use: idle retirement and LRU eviction count from here
            self.registry.touch(entry, now)
        fields = {"double": r.double, "used": used, **wakeup_fields(r.wakeups)}
        self._record(now, model, "release", {"ticket": ticket}, fields)
        return r

    def cancel(self, model: str, ticket: int, now: float) -> Cancelled:
        c = self.entry(model).admission.cancel(ticket, now)
        fields = {"was": c.was, **wakeup_fields(c.wakeups)}
        self._record(now, model, "cancel", {"ticket": ticket}, fields)
        return c

    def expire(self, model: str, now: float) -> Wakeups:
        w = self.entry(model).admission.expire(now)
        self._record(now, model, "expire", {}, wakeup_fields(w))
        return w

    def stop_admitting(self, model: str, now: float) -> None:
        self.entry(model).admission.stop_admitting()
        self._record(now, model, "stop_admitting", {})

    # -------------------------------------------------------------- lifecycle
    def ensure_loaded(
        self, model: str, ticket: int, now: float
    ) -> Proceed | WaitLoad | RoomDecision:
        d = self.registry.ensure_loaded(self.entry(model), ticket, now)
        reason = room_reason(d) if isinstance(d, RoomDecision) else ""
        self._record(now, model, "ensure_loaded", {"ticket": ticket}, ensure_fields(d), reason)
        return d

    def begin_load(self, model: str, start: StartLoad, now: float) -> RoomDecision:
        d = self.registry.begin_load(self.entry(model), start, now)
        args = {"ticket": start.ticket, "generation": start.generation}
        self._record(now, model, "begin_load", args, room_fields(d), room_reason(d))
        return d

    def load_succeeded(self, model: str, ticket: int, capacity: int, now: float) -> LoadOutcome:
        entry = self.entry(model)
        outcome = entry.lifecycle.load_succeeded(ticket)
        entry.capacity = capacity
        args = {"ticket": ticket, "capacity": capacity}
        self._record(now, model, "load_succeeded", args, {"proceed": list(outcome.proceed)})
        return outcome

    def load_failed(self, model: str, ticket: int, now: float) -> LoadOutcome:
        outcome = self.entry(model).lifecycle.load_failed(ticket)
        fields = {"retry": None if outcome.retry is None else outcome.retry.ticket}
        self._record(now, model, "load_failed", {"ticket": ticket}, fields)
        return outcome

    def abandon_wait(self, model: str, ticket: int, now: float) -> Abandoned:
        left = self.entry(model).lifecycle.abandon_wait(ticket)
        fields = {
            "left": left.left.value,
            "retry": None if left.retry is None else left.retry.ticket,
        }
        self._record(now, model, "abandon_wait", {"ticket": ticket}, fields)
        return left

    def begin_unload(self, model: str, now: float) -> Teardown | Nothing:
        d = self.entry(model).lifecycle.begin_unload()
        self._record(now, model, "begin_unload", {}, teardown_fields(d))
        return d

    def unload_finished(self, model: str, now: float) -> None:
        self.entry(model).lifecycle.unload_finished()
        self._record(now, model, "unload_finished", {})

    def begin_reconfigure(self, model: str, now: float) -> None:
        self.entry(model).lifecycle.begin_reconfigure()
        self._record(now, model, "begin_reconfigure", {})

    def reject_reconfigure(self, model: str, now: float, reason: Reason) -> None:
        self.entry(model).lifecycle.reject_reconfigure()
        self._record(now, model, "reject_reconfigure", {}, reason=reason.value)

    def commit_reconfigure(
        self,
        model: str,
        slots: int,
        now: float,
        config: Any = None,
        memory_bytes: int | None = None,
    ) -> Teardown | Nothing:
        d = self.entry(model).commit_reconfigure(slots, config, memory_bytes)
        args: dict[str, Any] = {"slots": slots}
        if memory_bytes is not None:
            args["memory_bytes"] = memory_bytes
        self._record(now, model, "commit_reconfigure", args, teardown_fields(d))
        return d

    def set_memory(self, model: str, memory_bytes: int, now: float) -> bool:
        """An operational update of ``model``'s memory estimate (no reload); False if refused."""
        ok = self.registry.set_memory(self.entry(model), memory_bytes)
        self._record(now, model, "set_memory", {"memory_bytes": memory_bytes}, {"ok": ok})
        return ok

    # ------------------------------------------------------------ bulk, idle
    def bulk_publish(self, ids: Iterable[str] | None, now: float) -> BulkUnload:
        selection = None if ids is None else list(ids)
        bulk = BulkUnload.publish(self.registry, selection, now)
        fields = {
            "tickets": dict(bulk.tickets),
            "ready": list(bulk.ready),
            "missing": list(bulk.not_found),
        }
        self._record(now, "", "bulk_publish", {"ids": selection}, fields)
        return bulk

    def retire_idle(self, now: float, idle_seconds: float | None) -> tuple[Eviction, ...]:
        victims = retire_idle(self.registry, now, idle_seconds)
        args = {"idle_seconds": unbound_as_zero(idle_seconds)}
        self._record(now, "", "retire_idle", args, eviction_fields(victims))
        return victims
