"""What a simulated run produced: each action's outcome and the run as a whole."""

from __future__ import annotations

import math
from typing import Any

import attrs

from core.events import TraceRecord
from sim.clock import Scheduling


@attrs.define
class ActionOutcome:
    """What one client action saw."""

    id: str
    do: str
    outcome: str = "pending"
    reason: str = ""
    message: str = ""
    result: Any = None
    started: float = math.nan
    ended: float = math.nan
    granted: float = math.nan  # request/batch: when its lease was granted
    running: float = math.nan  # request: when its run started on the session
    left: float = math.nan  # when its client left (a disconnect cancelled it)


@attrs.define
class RunResult:
    """Everything a run produced: outcomes, violations, trace, final counters."""

    scenario: str
    seed: int
    outcomes: dict[str, ActionOutcome]
    violations: list[str]
    trace: list[TraceRecord]
    final: dict[str, dict[str, Any]]
    stalled: bool
    end_time: float
    ties: int
    scheduling: Scheduling = Scheduling.ONE_AT_A_TIME
    warnings: list[str] = attrs.field(factory=list)

    def trace_text(self) -> str:
        return "".join(r.to_json() + "\n" for r in self.trace)

    @property
    def ok(self) -> bool:
        return not self.violations and not self.stalled

    def end_seq(self, action_id: str) -> int:
        """The trace sequence number of ``action_id``'s end (orders actions ending together)."""
        for r in self.trace:
            if r.event == "action_end" and r.args.get("id") == action_id:
                return r.seq
        return 1 << 60
