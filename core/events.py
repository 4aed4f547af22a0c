"""The vocabulary of decisions: reason codes and the trace record.

A reason code is what a decision says about *why*: it becomes the 503 message,
the trace record's ``reason`` and the metric label. Codes are stable strings.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Mapping
from typing import Any

import attrs


class Reason(enum.Enum):
    """Why a decision came out the way it did. Values are stable identifiers."""

    # admission
    GRANTED = "granted"
    QUEUED = "queued"
    QUEUE_TIMEOUT = "queue_timeout"
    SLOTS_OVERDUE = "slots_overdue"
    EXCLUSIVE_OVERDUE = "exclusive_overdue"
    ACTIVE_SLOT_OVERDUE = "active_slot_overdue"
    QUEUE_FULL = "queue_full"
    CANCELLED = "cancelled"
    BUSY = "busy"
    SHUTTING_DOWN = "shutting_down"
    # configuration and policy
    INVALID_SLOTS = "invalid_slots"
    SLOTS_REQUIRE_PARALLEL = "slots_require_parallel"
    CAPACITY_EXCEEDED = "capacity_exceeded"
    INVALID_TIMEOUT = "invalid_timeout"
    # pools and weights
    CLONE_MISMATCH = "clone_mismatch"
    CLONE_FAILED = "clone_failed"
    CREATE_FAILED = "create_failed"
    LOAD_FAILED = "load_failed"
    LOAD_STARTED = "load_started"
    LOAD_IN_FLIGHT = "load_in_flight"
    WEIGHTS_ALREADY_HELD = "weights_already_held"
    WEIGHTS_NOT_HELD = "weights_not_held"
    UNREFERENCED = "unreferenced"
    STILL_REFERENCED = "still_referenced"
    # lifecycle and residency
    NOT_FOUND = "not_found"
    RESIDENCY_LIMIT = "residency_limit"
    MEMORY_BUDGET = "memory_budget"
    ALREADY_LOADED = "already_loaded"
    ALREADY_UNLOADED = "already_unloaded"
    INVALID_STATE = "invalid_state"
    # batching
    BATCH_FULL = "batch_full"
    STALE_HANDLE = "stale_handle"
    COLLECTION_WINDOW = "collection_window"
    ROUND_RUNNING = "round_running"
    MEMBER_STOPPED = "member_stopped"
    MAX_STEPS = "max_steps"
    SLOT_NOT_FINISHED = "slot_not_finished"
    MEMBER_FAILED = "member_failed"


BUSY_MESSAGES: Mapping[Reason, str] = {
    Reason.QUEUE_TIMEOUT: "timed out waiting for a slot",
    Reason.SLOTS_OVERDUE: "all active slots exceeded busy_timeout_ms",
    Reason.EXCLUSIVE_OVERDUE: "exclusive operation exceeded busy_timeout_ms",
    Reason.ACTIVE_SLOT_OVERDUE: "active slot exceeded busy_timeout_ms",
    Reason.QUEUE_FULL: "admission queue is full",
    Reason.CANCELLED: "request was cancelled while queued",
    Reason.SHUTTING_DOWN: "server is shutting down",
}
"""The client-facing text of each busy reason (audio.cpp's wording where it has one)."""


def busy_message(model: str, reason: Reason) -> str:
    """The 503 message for ``reason`` on ``model``, in audio.cpp's ``model '<id>': ...`` form."""
    return f"model '{model}': {BUSY_MESSAGES.get(reason, reason.value)}"


@attrs.frozen
class TraceRecord:
    """One line of a trace: a core call and the decision it produced.

    ``seq`` orders records; ``t`` is the caller's clock (virtual in the simulator).
    ``decision`` is a short summary for people; ``fields`` is the same decision as
    typed, JSON-serialisable values (tickets, slots, victims, wake-ups: see
    :mod:`core.recorder`), which metrics, pictures, monitors and replay read.
    ``args``, ``decision`` and ``fields`` hold JSON-serialisable values only.
    """

    seq: int
    t: float
    model: str
    event: str
    args: Mapping[str, Any] = attrs.field(factory=dict)
    decision: str = ""
    reason: str = ""
    fields: Mapping[str, Any] = attrs.field(factory=dict)

    def to_json(self) -> str:
        """One JSON line with stable field order (sorted keys inside ``args``)."""
        return json.dumps(
            {
                "seq": self.seq,
                "t": self.t,  # full precision: replay compares deadlines (now + timeout) exactly
                "model": self.model,
                "event": self.event,
                "args": dict(self.args),
                "decision": self.decision,
                "reason": self.reason,
                "fields": dict(self.fields),
            },
            sort_keys=False,
            separators=(",", ":"),
            default=str,
        )

    @classmethod
    def from_json(cls, line: str) -> TraceRecord:
        """Parse a line written by :meth:`to_json`."""
        raw = json.loads(line)
        return cls(
            seq=int(raw["seq"]),
            t=float(raw["t"]),
            model=str(raw["model"]),
            event=str(raw["event"]),
            args=dict(raw.get("args", {})),
            decision=str(raw.get("decision", "")),
            reason=str(raw.get("reason", "")),
            fields=dict(raw.get("fields", {})),
        )
