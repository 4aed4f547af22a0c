"""A run's stop request: how a long synchronous session call learns that nobody waits for it.

The runtime runs a session's ``run`` or ``batch`` shielded: the lease is not released
while the session's thread still computes on it. Without more, a request whose client
left holds its slot until the call returns, and some calls are long (a 60 s file on a
Whisper session is one call of 60-odd decoding windows; a long text on a Piper session,
one call of many sentences). So the runtime gives every such call a :class:`StopFlag`,
raises it when the request is cancelled, and makes it the call's *current* flag
(:func:`running`, a context variable that the worker thread inherits). A session calls
:func:`stop_point` between the steps of its work (a decoding step, a window, a sentence);
once the flag is up it raises :class:`RunStopped`, the session unwinds as for any
error (its own state cleared), and the runtime releases the lease and lets the
cancellation go on.

A stop point is a promise about where the work may end, not a timer: a call with none
(or between two of them) runs on. Outside a run (no current flag) a stop point never
raises, so session code can call it unconditionally.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import attrs


class RunStopped(Exception):
    """Raised at a stop point once the run's :class:`StopFlag` is up: the caller gave up."""


@attrs.define(eq=False)
class StopFlag:
    """One call's stop request, raised by the runtime (on the event loop) and read by the
    session (in its worker thread): a plain attribute, written once, read between steps."""

    stopped: bool = False

    def stop(self) -> None:
        """Ask the call to end at its next stop point (idempotent)."""
        self.stopped = True


_CURRENT: ContextVar[StopFlag | None] = ContextVar("voxpool_stop_flag", default=None)


@contextmanager
def running(flag: StopFlag) -> Iterator[None]:
    """Make ``flag`` the current one for the block (and for the worker threads it starts
    through anyio or trio, which copy the caller's context)."""
    token = _CURRENT.set(flag)
    try:
        yield
    finally:
        _CURRENT.reset(token)


def stop_point() -> None:
    """Raise :class:`RunStopped` if the current call was asked to stop; else return at once."""
    flag = _CURRENT.get()
    if flag is not None and flag.stopped:
        raise RunStopped("the request's caller gave up; the run stopped at a step boundary")
