"""Policy rules: busy-timeout resolution, slot-count validation, runtime selection.

These are the small pure functions every other decision leans on. Busy timeouts
here are integers in milliseconds, as in the config file and the HTTP API; 0 means
unbounded and compares as infinity on both sides.
"""

from __future__ import annotations

import enum
from typing import Final

import attrs

from core.events import Reason
from core.pool import MAX_PARALLEL_SESSIONS, SLOTS_RANGE_MESSAGE, capacity_message

MISSING: Final = object()
"""Stands for a key absent from a JSON object (distinct from JSON null, which is None)."""

SLOTS_MESSAGE: Final = SLOTS_RANGE_MESSAGE
SLOTS_REQUIRE_PARALLEL_MESSAGE: Final = "slots requires --parallel-jobs at server startup"


class RuntimeKind(enum.Enum):
    """Which runtime the process runs; chosen once at startup, never changed."""

    ORIGINAL = "original"
    PARALLEL = "parallel"


def select_runtime(parallel_jobs: bool) -> RuntimeKind:
    """``--parallel-jobs`` selects the parallel runtime; its absence, the original one."""
    return RuntimeKind.PARALLEL if parallel_jobs else RuntimeKind.ORIGINAL


@attrs.frozen
class Valid:
    """A validated value."""

    value: int


@attrs.frozen
class Invalid:
    """A rejected value: the reason code and the client-facing message (HTTP 400)."""

    reason: Reason
    message: str


class PolicyError(ValueError):
    """Raised by :func:`unwrap` for an :class:`Invalid` result."""

    def __init__(self, invalid: Invalid) -> None:
        super().__init__(invalid.message)
        self.reason = invalid.reason


def unwrap(result: Valid | Invalid) -> int:
    """The value of a :class:`Valid`, or :class:`PolicyError` for an :class:`Invalid`."""
    if isinstance(result, Invalid):
        raise PolicyError(result)
    return result.value


def resolve_busy_timeout(ceiling_ms: int, override_ms: int | None = None) -> int:
    """The effective busy timeout of one request (reference §2.5).

    The ceiling is the model's ``busy_timeout_ms`` if set, else the server's. A
    request may only shorten it: no override, or an override <= 0, keeps the
    ceiling; a ceiling <= 0 (unbounded) takes the override; otherwise the smaller.
    """
    if override_ms is None or override_ms <= 0:
        return ceiling_ms
    if ceiling_ms <= 0:
        return override_ms
    return min(override_ms, ceiling_ms)


def model_ceiling(server_ms: int, model_ms: int | None) -> int:
    """The ceiling for a model: its own ``busy_timeout_ms`` if set (it may exceed the server's)."""
    return server_ms if model_ms is None else model_ms


def overrun(since: float | None, now: float, timeout: float) -> bool:
    """Whether a holder granted at ``since`` has overrun ``timeout`` at ``now``.

    Never for an unbounded timeout (<= 0) or a free holder (None); otherwise
    strictly greater: a holder exactly at its timeout is not yet overrun.
    """
    if timeout <= 0 or since is None:
        return False
    return now - since > timeout


def validate_slots(value: object, capacity: int | None = None) -> Valid | Invalid:
    """Validate a ``slots`` value from JSON: an integer 1..16, never above ``capacity``.

    bool, null, floats (even 2.0), strings and out-of-range integers are rejected.
    ``MISSING`` (key absent) means the default of 1.
    """
    if value is MISSING:
        value = 1
    if isinstance(value, bool) or not isinstance(value, int):
        return Invalid(Reason.INVALID_SLOTS, SLOTS_MESSAGE)
    if not 1 <= value <= MAX_PARALLEL_SESSIONS:
        return Invalid(Reason.INVALID_SLOTS, SLOTS_MESSAGE)
    if capacity is not None and value > capacity:
        return Invalid(Reason.CAPACITY_EXCEEDED, capacity_message("", capacity))
    return Valid(value)


def validate_slots_for_runtime(runtime: RuntimeKind, value: object) -> Valid | Invalid:
    """Validate ``slots`` under a runtime: the original runtime rejects any explicit value.

    On the original runtime even ``1`` and ``null`` are rejected, so the legacy
    path can never be entered with slots; an absent key is fine (one session).
    """
    if runtime is RuntimeKind.ORIGINAL:
        if value is MISSING:
            return Valid(1)
        return Invalid(Reason.SLOTS_REQUIRE_PARALLEL, SLOTS_REQUIRE_PARALLEL_MESSAGE)
    return validate_slots(value)


TIMEOUT_MS_MAX = 2**53 - 1
"""The largest ``busy_timeout_ms`` (the largest integer a JSON double holds exactly)."""


def validate_timeout_ms(value: object, name: str = "busy_timeout_ms") -> Valid | Invalid:
    """The one rule for a ``busy_timeout_ms`` (server, model or request; reference §2.5): an
    integer 0..:data:`TIMEOUT_MS_MAX` (0 = unbounded, or for a request: keep the ceiling); an
    integral float is that integer; booleans, fractions and anything else are invalid. The
    config file and the HTTP body parse their own syntax, then apply this."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        return Invalid(
            Reason.INVALID_TIMEOUT, f"{name} must be an integer between 0 and {TIMEOUT_MS_MAX}"
        )
    if not 0 <= value <= TIMEOUT_MS_MAX:
        return Invalid(
            Reason.INVALID_TIMEOUT, f"{name} must be an integer between 0 and {TIMEOUT_MS_MAX}"
        )
    return Valid(value)


def ms_to_seconds(ms: int) -> float:
    """Milliseconds to the seconds the admission machines use (0 stays 0 = unbounded)."""
    return ms / 1000.0
