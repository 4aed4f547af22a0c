"""``voxpool serve``'s event loop: startup, listening, signals, the bounded drain, teardown.

Order of a run: the application starts (the runtime, and any model that is
not lazy), the listeners open, then requests are served until SIGINT/SIGTERM.
The first signal starts the drain (:meth:`HttpServer.shutdown`): the listeners
close at once, in-flight requests finish within ``shutdown_timeout_s``, what
is still open then is aborted; a second signal aborts at once. Then the
application shuts down (every pool torn down) and the process exits 0.
"""

from __future__ import annotations

import signal
import sys
from collections.abc import AsyncIterator
from typing import IO

import anyio

from server.blas import startup_kernels_note
from server.config import ServerConfig
from server.http.app import build_app
from server.http.lifespan import LifespanError, lifespan
from server.http.listener import AbortKind, Deadlines, HttpServer, bind
from server.serving import make_state


def _say(message: str) -> None:
    print(f"voxpool: {message}", file=sys.stderr, flush=True)


def deadlines(config: ServerConfig) -> Deadlines:
    """The listener's deadlines from the configuration."""
    return Deadlines(
        header_s=config.header_timeout_s,
        body_s=config.body_read_timeout_s,
        write_s=config.write_timeout_s,
        shutdown_s=config.shutdown_timeout_s,
    )


def _startup_failure(exc: BaseException) -> LifespanError | None:
    """The lifespan failure inside ``exc`` (task groups may wrap it in exception groups)."""
    if isinstance(exc, LifespanError):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            found = _startup_failure(inner)
            if found is not None:
                return found
    return None


async def serve(config: ServerConfig, trace: IO[str] | None) -> int:
    """Serve ``config`` until a signal, drain, tear down; the process exit code."""
    state = make_state(config, trace_out=trace)
    app = build_app(state)

    def aborted(kind: AbortKind) -> None:
        state.metrics.connections_aborted.labels(kind.value).inc()

    server = HttpServer(
        app,
        deadlines(config),
        on_abort=aborted,
        send_buffer_bytes=config.send_buffer_bytes,
        max_connections=config.max_connections,
    )
    with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        try:
            async with lifespan(app) as life:
                server.state = dict(life)
                return await _listen(config, server, signals)
        except BaseException as exc:
            failure = _startup_failure(exc)
            if failure is None:
                raise
            _say(str(failure))
            return 1


async def _listen(config: ServerConfig, server: HttpServer, signals: AsyncIterator[int]) -> int:
    try:
        listeners = await bind(config.host, config.port)
    except OSError as exc:
        _say(f"cannot listen on {config.host}:{config.port}: {exc}")
        return 1
    _say(
        f"serving {len(config.models)} model(s) on http://{config.host}:{config.port} "
        f"({config.runtime.value} runtime)"
    )
    note = startup_kernels_note()
    if note is not None:
        _say(f"warning: {note}")
    async with anyio.create_task_group() as tg:
        tg.start_soon(server.serve, listeners)
        async for _ in signals:
            break
        _say("shutting down (draining admitted and queued work)")
        tg.start_soon(_second_signal, signals, server)
        report = await server.shutdown()
        await server.stopped()
        _say(
            f"drain took {report.seconds:.2f} s: connections that ended on their own: "
            f"{report.drained}; aborted at shutdown_timeout_s={config.shutdown_timeout_s:g}: "
            f"{report.aborted}"
        )
        tg.cancel_scope.cancel()
    return 0


async def _second_signal(signals: AsyncIterator[int], server: HttpServer) -> None:
    async for _ in signals:
        _say("second signal: aborting every open connection now")
        server.force()
        return
