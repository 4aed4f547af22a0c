"""Session work that runs shielded yet stops early when its request is cancelled.

A session call must finish before its lease ends (the session is not reused or closed
under a running thread), so the runtime shields it. :func:`shielded_stoppable` keeps
that guarantee and adds the stop request of :mod:`core.stopping`: a watcher task
raises the call's :class:`~core.stopping.StopFlag` when the request's scope is
cancelled, the session ends at its next stop point with
:class:`~core.stopping.RunStopped`, and the cancellation then goes on as if the call
had ended by itself. A call that has no stop points (or is past its last one) runs to
its end, as before.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

import anyio
import anyio.lowlevel

from core.stopping import RunStopped, StopFlag, running

T = TypeVar("T")
log = logging.getLogger("voxpool.runtime")


async def _stop_when_cancelled(flag: StopFlag) -> None:
    try:
        await anyio.sleep_forever()
    finally:
        flag.stop()  # cancelled: the request's scope, or the call ended (then nothing reads it)


async def shielded_stoppable(call: Callable[[], Awaitable[T]]) -> T:
    """``await call()`` shielded from cancellation, with a stop flag current that a
    cancellation of the caller raises. Returns the call's result, or raises its exception
    (unwrapped); when the call ended at a stop point, raises the caller's cancellation.

    A call cancelled after its last stop point still ends first; then the cancellation
    wins (on trio it is raised as the group exits, on asyncio at the caller's next
    checkpoint): its result is dropped, and its exception, if any, is logged here rather
    than lost.
    """
    flag = StopFlag()
    error: BaseException | None = None
    stopped = False
    try:
        with running(flag):
            async with anyio.create_task_group() as tg:
                tg.start_soon(_stop_when_cancelled, flag)
                with anyio.CancelScope(shield=True):
                    try:
                        result = await call()
                    except RunStopped:
                        stopped = True
                    except BaseException as exc:  # raised below, outside the group (not wrapped)
                        error = exc
                tg.cancel_scope.cancel()
    except anyio.get_cancelled_exc_class():
        if error is not None and not isinstance(error, StopAsyncIteration):  # a stream's end
            log.error("a session call failed after its request was cancelled", exc_info=error)
        raise
    if error is not None:
        raise error
    if stopped:
        await anyio.lowlevel.checkpoint()  # the cancellation that raised the flag
        raise RuntimeError("a session run stopped although its request was not cancelled")
    return result
