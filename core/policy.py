"""Policy rules: limits, busy-timeout resolution, slot-count validation, runtime selection.

These are the small pure functions every other decision leans on.

"No limit" has one representation in typed APIs: ``None`` (a :data:`Limit`, or
``float | None`` for seconds). That covers busy timeouts, the residency limits
(``max_loaded_models``, the memory budget), the queue bound and idle retirement.
The external formats keep their documented spelling: config files, HTTP fields,
CLI flags and trace files write "no limit" as 0 (``busy_timeout_ms``,
``max_loaded_models``, ``memory_budget_mb``, ``idle_unload_ms``; ``max_queue`` is
absent or null). They are converted once, where they are read: :func:`bound` and
:func:`ms_to_seconds` on the way in, :func:`unbound_as_zero` on the way out, and
:func:`exceeds` / :func:`excess` compare against a limit.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from typing import Final, TypeVar

import attrs

from core.events import Reason
from core.pool import (
    BATCH_SLOTS_RANGE_MESSAGE,
    MAX_BATCH_SLOTS,
    MAX_PARALLEL_SESSIONS,
    SLOTS_RANGE_MESSAGE,
    capacity_message,
)

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


Limit = int | None
"""An upper bound on a count or an amount of bytes; None: no limit."""

N = TypeVar("N", int, float)


def bound(value: N) -> N | None:
    """A limit as the external formats write it (0, or less: no limit) as a typed one."""
    return value if value > 0 else None


def unbound_as_zero(limit: float | None) -> float:
    """A typed limit in seconds as trace files write it (0.0: no limit)."""
    return 0.0 if limit is None else limit


def exceeds(amount: float, limit: float | None) -> bool:
    """Whether ``amount`` is over ``limit`` (strictly; never when there is no limit)."""
    return limit is not None and amount > limit


def excess(amount: int, limit: Limit) -> int:
    """How far ``amount`` is over ``limit`` (0 within it, or when there is no limit)."""
    return 0 if limit is None else max(0, amount - limit)


def ongoing_bounds(slots: Sequence[int], max_queue: Limit) -> tuple[int, int]:
    """A replica's request bounds for a router in front of it (Ray Serve's
    ``max_ongoing_requests`` and ``target_ongoing_requests``) from its models' slots.

    The most it can hold is every model's slots plus its queue bound
    (``max_queue`` is per model; with no bound, as many again as its slots: a
    router needs a finite number); the target is every slot busy.
    """
    held = sum(n + (n if max_queue is None else max_queue) for n in slots)
    return held, sum(slots)


RETRY_PAUSE_S = 0.05
"""How long a router in front of replicas (voxpool's Ray ingress, and the fleet simulator's
model of it) pauses before trying a busy request again elsewhere: the n-th retry waits n
times this."""


def retry_pause(attempt: int) -> float:
    """The pause before retry ``attempt`` (1, 2, ...) of a request a replica refused."""
    return RETRY_PAUSE_S * attempt


def ms_to_seconds(ms: int) -> float | None:
    """Milliseconds as config files and HTTP fields write them (0: no limit) as the seconds
    that typed APIs take (None: no limit)."""
    return None if ms <= 0 else ms / 1000.0


def resolve_busy_timeout(ceiling: float | None, override: float | None = None) -> float | None:
    """The effective busy timeout of one request, in seconds (reference §2.5; None: unbounded).

    A request may only shorten the ceiling: no override keeps it; an unbounded
    ceiling takes the override; otherwise the smaller of the two.
    """
    if override is None:
        return ceiling
    if ceiling is None:
        return override
    return min(override, ceiling)


def model_ceiling(server_ms: int, model_ms: int | None) -> int:
    """The ceiling for a model: its own ``busy_timeout_ms`` if set (it may exceed the server's)."""
    return server_ms if model_ms is None else model_ms


def busy_timeout(
    server_ms: int, model_ms: int | None, override_ms: int | None = None
) -> float | None:
    """The busy timeout of one holder of a model, in seconds (None: unbounded), from the
    milliseconds of the config file and the HTTP body: the model's ``busy_timeout_ms`` if set,
    else the server's (0: unbounded), shortened by a request's (absent or 0: keep the ceiling)."""
    ceiling = ms_to_seconds(model_ceiling(server_ms, model_ms))
    override = None if override_ms is None else ms_to_seconds(override_ms)
    return resolve_busy_timeout(ceiling, override)


def overrun(since: float | None, now: float, timeout: float | None) -> bool:
    """Whether a holder granted at ``since`` has overrun ``timeout`` at ``now``.

    Never for an unbounded timeout (None) or a free holder (None); otherwise
    strictly greater: a holder exactly at its timeout is not yet overrun.
    """
    return since is not None and exceeds(now - since, timeout)


def validate_slots(
    value: object, capacity: int | None = None, *, batching: bool = False
) -> Valid | Invalid:
    """Validate a ``slots`` value from JSON: an integer 1..16 (1..:data:`MAX_BATCH_SLOTS` for a
    model registered with ``batching``: its slots are engine rows, not sessions), never above
    ``capacity``.

    bool, null, floats (even 2.0), strings and out-of-range integers are rejected.
    ``MISSING`` (key absent) means the default of 1.
    """
    if value is MISSING:
        value = 1
    message = BATCH_SLOTS_RANGE_MESSAGE if batching else SLOTS_MESSAGE
    if isinstance(value, bool) or not isinstance(value, int):
        return Invalid(Reason.INVALID_SLOTS, message)
    if not 1 <= value <= (MAX_BATCH_SLOTS if batching else MAX_PARALLEL_SESSIONS):
        return Invalid(Reason.INVALID_SLOTS, message)
    if capacity is not None and value > capacity:
        return Invalid(Reason.CAPACITY_EXCEEDED, capacity_message("", capacity))
    return Valid(value)


def validate_slots_for_runtime(
    runtime: RuntimeKind, value: object, *, batching: bool = False
) -> Valid | Invalid:
    """Validate ``slots`` under a runtime: the original runtime rejects any explicit value.

    On the original runtime even ``1`` and ``null`` are rejected, so the legacy
    path can never be entered with slots; an absent key is fine (one session).
    """
    if runtime is RuntimeKind.ORIGINAL:
        if value is MISSING:
            return Valid(1)
        return Invalid(Reason.SLOTS_REQUIRE_PARALLEL, SLOTS_REQUIRE_PARALLEL_MESSAGE)
    return validate_slots(value, batching=batching)


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
