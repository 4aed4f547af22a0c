"""Errors the runtime raises; the HTTP layer maps each to a status and error type."""

from __future__ import annotations

from core.admission import RetryAfter
from core.events import Reason


class RuntimeErrorBase(Exception):
    """Base of the runtime's errors: a reason code and a client-facing message."""

    status = 500
    error_type = "server_error"

    def __init__(self, reason: Reason, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


class BusyError(RuntimeErrorBase):
    """HTTP 503 ``server_busy``: admission refused or timed out, or no room to load.

    ``retry`` is core's estimate of when a slot would be free (None: no estimate,
    e.g. a residency refusal); ``retry_after`` is its whole seconds, for the header.
    """

    status = 503
    error_type = "server_busy"

    def __init__(self, reason: Reason, message: str, retry: RetryAfter | None = None) -> None:
        super().__init__(reason, message)
        self.retry = retry

    @property
    def retry_after(self) -> int | None:
        """Seconds for ``Retry-After`` (at least 1), or None without an estimate."""
        return None if self.retry is None else self.retry.seconds


class NotFoundError(RuntimeErrorBase):
    """HTTP 404: unknown model id."""

    status = 404
    error_type = "not_found_error"


class InvalidRequestError(RuntimeErrorBase):
    """HTTP 400 ``invalid_request_error``: the request or configuration is not acceptable."""

    status = 400
    error_type = "invalid_request_error"


class LoadError(RuntimeErrorBase):
    """HTTP 500: the model could not be loaded (the entry stays registered; a retry may work)."""

    status = 500
    error_type = "server_error"
