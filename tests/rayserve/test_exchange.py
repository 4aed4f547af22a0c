"""server.ray.exchange: a forwarded request replayed against an ASGI app, in-process."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

pytest.importorskip("ray")  # server.ray needs the ray extra (the test extra installs it)

from server.ray.exchange import Forwarded, Start, replay

REQUEST = Forwarded("POST", "/echo", b"a=1", ((b"content-type", b"text/plain"),), b"hello")


async def echo(scope: dict[str, Any], receive: Any, send: Any) -> None:
    message = await receive()
    body = message["body"] + b"|" + scope["query_string"] + b"|" + scope["path"].encode()
    await send({"type": "http.response.start", "status": 201, "headers": [(b"x-a", b"1")]})
    await send({"type": "http.response.body", "body": body[:5], "more_body": True})
    await send({"type": "http.response.body", "body": body[5:]})


async def collect(app: Any) -> list[Any]:
    return [part async for part in replay(app, REQUEST)]


def test_replay_yields_the_head_then_the_body_as_the_app_sent_it() -> None:
    parts = asyncio.run(collect(echo))
    assert parts == [Start(201, ((b"x-a", b"1"),)), b"hello", b"|a=1|/echo"]


def test_an_early_close_tells_the_app_its_client_left_and_waits_for_it() -> None:
    seen: list[str] = []

    async def forever(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await receive()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"first", "more_body": True})
        message = await receive()  # blocks until the caller goes away
        seen.append(message["type"])
        await asyncio.sleep(0)  # the app may still await while it releases what it holds
        seen.append("released")

    async def main() -> None:
        parts = replay(forever, REQUEST)
        assert isinstance(await parts.__anext__(), Start)
        assert await parts.__anext__() == b"first"
        await parts.aclose()

    asyncio.run(main())
    assert seen == ["http.disconnect", "released"]


def test_a_cancelled_caller_gives_the_app_its_grace_then_cancels_it_and_goes_on() -> None:
    state: list[str] = []

    async def stuck(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        try:
            await asyncio.Event().wait()  # ignores the disconnect: cancelled after the grace
        except asyncio.CancelledError:
            state.append("app cancelled")
            raise

    async def consume() -> None:
        async for _ in replay(stuck, REQUEST):
            state.append("part")

    async def main() -> None:
        task = asyncio.ensure_future(consume())
        while not state:
            await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.sleep(0)
        assert task.cancelled()

    import server.ray.exchange as exchange

    old, exchange.DISCONNECT_GRACE_S = exchange.DISCONNECT_GRACE_S, 0.05
    try:
        asyncio.run(main())
    finally:
        exchange.DISCONNECT_GRACE_S = old
    assert state == ["part", "app cancelled"]


def test_the_apps_own_failure_reaches_the_caller() -> None:
    async def broken(scope: dict[str, Any], receive: Any, send: Any) -> None:
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        asyncio.run(collect(broken))
