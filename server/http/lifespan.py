"""The ASGI lifespan protocol, driven by our own server.

Startup before listening, shutdown after.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
from starlette.types import ASGIApp, Message


class LifespanError(RuntimeError):
    """The application's startup (or shutdown) failed; the message says why."""


@asynccontextmanager
async def lifespan(app: ASGIApp) -> AsyncIterator[dict[str, Any]]:
    """Run ``app``'s startup, yield its lifespan state, then run its shutdown.

    The application's lifespan call stays in one task for the whole block, so
    task groups it opens at startup (the runtime's) are closed by the same task.
    """
    state: dict[str, Any] = {}
    to_app_send, to_app_receive = anyio.create_memory_object_stream[Message](4)
    from_app_send, from_app_receive = anyio.create_memory_object_stream[Message](4)

    async def run() -> None:
        scope = {
            "type": "lifespan",
            "asgi": {"version": "3.0", "spec_version": "2.0"},
            "state": state,
        }
        try:
            await app(scope, to_app_receive.receive, from_app_send.send)
        except Exception as exc:
            await from_app_send.send(
                {"type": "lifespan.error", "message": f"{type(exc).__name__}: {exc}"}
            )
        else:
            await from_app_send.send({"type": "lifespan.ended"})

    async def expect(phase: str) -> None:
        message = await from_app_receive.receive()
        if message["type"] != f"lifespan.{phase}.complete":
            detail = message.get("message") or message["type"]
            # after "failed" the exception itself follows: prefer its text
            if message["type"] == f"lifespan.{phase}.failed":
                following = await from_app_receive.receive()
                detail = following.get("message") or detail
            raise LifespanError(f"{phase} failed: {detail}")

    async with anyio.create_task_group() as tg:
        tg.start_soon(run)
        await to_app_send.send({"type": "lifespan.startup"})
        await expect("startup")
        try:
            yield state
        finally:
            with anyio.CancelScope(shield=True):
                await to_app_send.send({"type": "lifespan.shutdown"})
                await expect("shutdown")
