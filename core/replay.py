"""Replay a trace: re-feed its recorded core calls to a fresh :class:`~core.recorder.Core`.

Every decision core makes is a function of the calls made to it, so replaying
the calls in order must reproduce every recorded decision. :func:`replay`
returns the first record whose decision differs (a divergence: the trace came
from different code, or from a run whose calls were not all recorded), or None
when all match. Trace files write "no limit" as 0 (the config record's limits, timeouts,
idle seconds), as :mod:`core.recorder` writes it; it is read back as None here.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

import attrs

from core.events import Reason, TraceRecord
from core.guard import GuardAdmission
from core.lifecycle import StartLoad
from core.policy import RuntimeKind, bound
from core.recorder import Core
from core.residency import ResidencyLimits

PASSIVE_EVENTS = frozenset({"config", "note", "action", "action_end", "batch_step"})
"""Records that describe the run (config, client actions, a batched model's step boundaries)
rather than core calls."""


@attrs.frozen
class Divergence:
    """The first record whose replayed decision differs from the recorded one."""

    record: TraceRecord
    replayed_decision: str
    replayed_reason: str

    def __str__(self) -> str:
        r = self.record
        return (
            f"seq {r.seq} t={r.t} {r.model or '-'} {r.event} {dict(r.args)}: recorded "
            f"'{r.decision}' ({r.reason or '-'}), replayed '{self.replayed_decision}' "
            f"({self.replayed_reason or '-'})"
        )


@attrs.frozen
class ReplayResult:
    """How many records were replayed and the first divergence, if any."""

    replayed: int
    divergence: Divergence | None


def replay(
    records: Iterable[TraceRecord],
    limits: ResidencyLimits | None = None,
    max_queue: int | None = None,
) -> ReplayResult:
    """Feed ``records`` to a fresh core in order and compare every decision.

    A leading ``config`` record (written by the runtime) supplies the residency
    limits and queue bound when they are not given.
    """
    records = list(records)
    kind = RuntimeKind.PARALLEL
    if records and records[0].event == "config":
        cfg = records[0].args
        kind = RuntimeKind(cfg.get("runtime", "parallel"))
        if limits is None:
            limits = ResidencyLimits.from_config(
                int(cfg.get("max_loaded_models", 0)), int(cfg.get("memory_budget", 0))
            )
            raw_queue = cfg.get("max_queue")
            max_queue = None if raw_queue is None else int(raw_queue)
    out: list[TraceRecord] = []
    core = Core(limits, max_queue=max_queue, sink=out.append, kind=kind)
    count = 0
    for rec in records:
        if rec.event in PASSIVE_EVENTS:
            continue
        before = len(out)
        _apply(core, rec)
        count += 1
        if len(out) != before + 1:
            return ReplayResult(count, Divergence(rec, "<no decision>", ""))
        got = out[-1]
        same_fields = not rec.fields or _plain(got.fields) == _plain(
            rec.fields
        )  # older traces have none
        if (got.decision, got.reason) != (rec.decision, rec.reason) or not same_fields:
            return ReplayResult(count, Divergence(rec, got.decision, got.reason))
    return ReplayResult(count, None)


def _plain(value: Any) -> Any:
    """JSON's view of a value (tuples are lists), so a record compares equal to its parsed line."""
    return json.loads(json.dumps(value, default=str))


def _force_choices(core: Core, rec: TraceRecord) -> None:
    """On the original runtime, hand the lock to the waiters the recording chose."""
    entry = core.registry.get(rec.model) if rec.model else None
    if (
        entry is None
        or not isinstance(entry.admission, GuardAdmission)
        or "granted" not in rec.fields
    ):
        return
    entry.admission.forced = [int(ticket) for ticket, _slot in rec.fields["granted"]]


def _apply(core: Core, rec: TraceRecord) -> None:
    a, m, t = rec.args, rec.model, rec.t
    ev = rec.event
    _force_choices(core, rec)
    if ev == "new_ticket":
        core.new_ticket(t)
    elif ev == "register":
        core.register(m, int(a["slots"]), int(a["memory_bytes"]), t)
    elif ev == "request":
        core.request(m, int(a["ticket"]), t, bound(float(a["timeout"])))
    elif ev == "manage":
        core.manage(m, int(a["ticket"]), t, bound(float(a["timeout"])))
    elif ev == "try_acquire":
        core.try_acquire(m, int(a["ticket"]), t)
    elif ev == "release":
        core.release(m, int(a["ticket"]), t)
    elif ev == "cancel":
        core.cancel(m, int(a["ticket"]), t)
    elif ev == "expire":
        core.expire(m, t)
    elif ev == "stop_admitting":
        core.stop_admitting(m, t)
    elif ev == "ensure_loaded":
        core.ensure_loaded(m, int(a["ticket"]), t)
    elif ev == "begin_load":
        core.begin_load(m, StartLoad(int(a["ticket"]), int(a["generation"])), t)
    elif ev == "load_succeeded":
        core.load_succeeded(m, int(a["ticket"]), int(a["capacity"]), t)
    elif ev == "load_failed":
        core.load_failed(m, int(a["ticket"]), t)
    elif ev == "abandon_wait":
        core.abandon_wait(m, int(a["ticket"]), t)
    elif ev == "begin_unload":
        core.begin_unload(m, t)
    elif ev == "unload_finished":
        core.unload_finished(m, t)
    elif ev == "begin_reconfigure":
        core.begin_reconfigure(m, t)
    elif ev == "reject_reconfigure":
        core.reject_reconfigure(m, t, Reason(rec.reason))
    elif ev == "commit_reconfigure":
        memory = a.get("memory_bytes")
        core.commit_reconfigure(
            m, int(a["slots"]), t, memory_bytes=None if memory is None else int(memory)
        )
    elif ev == "set_memory":
        core.set_memory(m, int(a["memory_bytes"]), t)
    elif ev == "bulk_publish":
        ids = a.get("ids")
        core.bulk_publish(None if ids is None else list(ids), t)
    elif ev == "retire_idle":
        core.retire_idle(t, bound(float(a["idle_seconds"])))
    else:
        raise ValueError(f"unknown trace event {ev!r}")
