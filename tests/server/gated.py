"""A live server whose session work waits at a gate the test opens, and says what it ran in
which order.

``python -m tests.server.gated GATE_DIR serve ...`` is ``voxpool serve ...``
(the same CLI, config loader, listener, app, runtime and real models) with
one change: the model provider is wrapped in :class:`GatedProvider`. Each
*step* of session work (a run, a batch, or one chunk of a stream) is numbered
per model; before it starts, it waits until the file ``GATE_DIR/gate-<model>``
is absent (open) or holds a number at least the step's. Every step's arrival
and end, and every load, release and close, is appended as a JSON line to
``GATE_DIR/order.jsonl``: the server's own record of what ran in which order.

So a test holds a request in its slot for as long as it needs, instead of
hoping that a long text keeps the slot busy long enough on this machine, and
asserts orders from the record instead of from when client threads woke up.
:class:`GatedServer` is the test side: start, hold, release, open, read.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import socket
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from pathlib import Path
from typing import IO, Any, TypeVar

import anyio

from core.events import TraceRecord
from server.runtime.ports import ModelProvider, ModelSpec
from tests.server.live import LiveServer

T = TypeVar("T")
POLL_S = 0.005
"""How often a held step looks at its gate (a poll interval: it decides nothing)."""
HANG_GUARD_S = 60.0
"""The longest a test waits for a state the server must reach: a guard against a hang, never a
verdict."""


# ------------------------------------------------------------------ server side
class GatedFactory:
    """A loaded factory as one model's pool sees it: the same weights, labelled with the model."""

    def __init__(self, inner: Any, model: str) -> None:
        self.inner = inner
        self.model = model

    @property
    def family(self) -> str:
        return str(self.inner.family)

    @property
    def task(self) -> str:
        return str(self.inner.task)

    @property
    def mode(self) -> str:
        return str(self.inner.mode)

    def capacity(self) -> int:
        return int(self.inner.capacity())

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def label(request: Any) -> str:
    """What a log line calls a request: its text (TTS) or its type."""
    text = getattr(request, "text", None)
    return text[:80] if isinstance(text, str) else type(request).__name__


class GatedProvider:
    """A ModelProvider that holds each step at the model's gate and logs the order of everything."""

    def __init__(self, inner: ModelProvider, gate_dir: Path) -> None:
        self.inner = inner
        self.gate_dir = gate_dir
        self.models: dict[int, str] = {}  # id(session) -> model, while the session lives
        self.steps: dict[str, int] = {}
        self.calls = itertools.count(1)
        self.out: IO[str] = open(gate_dir / "order.jsonl", "a", buffering=1)  # noqa: SIM115 (lives with the process)
        self.seq = itertools.count(1)

    def log(self, event: str, model: str, **fields: Any) -> None:
        self.out.write(
            json.dumps({"seq": next(self.seq), "event": event, "model": model, **fields}) + "\n"
        )

    def passes(self, model: str, step: int) -> bool:
        try:
            text = (self.gate_dir / f"gate-{model}").read_text()
        except FileNotFoundError:
            return True
        try:
            return step <= int(text)
        except ValueError:  # written whole by rename, so never partial; held if it were
            return False

    async def gate(
        self, model: str, kind: str, call: int, request: Any, chunk: int | None = None
    ) -> int:
        n = self.steps[model] = self.steps.get(model, 0) + 1
        self.log("arrive", model, step=n, kind=kind, call=call, chunk=chunk, label=label(request))
        while not self.passes(model, n):
            await anyio.sleep(POLL_S)
        return n

    def model_of(self, session: Any) -> str:
        return self.models.get(id(session), "?")

    async def load(self, spec: ModelSpec) -> Any:
        """Weights load after ``hold-load-<model>`` is gone; ``fail-load-<model>`` (consumed)
        makes this one load fail instead, as a broken model file would."""
        self.log("load_arrive", spec.id)
        while (self.gate_dir / f"hold-load-{spec.id}").exists():
            await anyio.sleep(POLL_S)
        with contextlib.suppress(FileNotFoundError):
            (self.gate_dir / f"fail-load-{spec.id}").unlink()
            self.log("load_failed", spec.id)
            raise RuntimeError(f"injected load failure for '{spec.id}'")
        factory = await self.inner.load(spec)
        self.log("load", spec.id)
        return GatedFactory(factory, spec.id)

    async def release(self, spec: ModelSpec, factory: Any) -> None:
        await self.inner.release(
            spec, factory.inner if isinstance(factory, GatedFactory) else factory
        )
        self.log("release", spec.id)

    async def create(self, factory: Any) -> Any:
        session = await self.inner.create(factory.inner)
        if session is not None:
            self.models[id(session)] = factory.model
        self.log("create", factory.model)
        return session

    async def clone(self, factory: Any, primary: Any) -> Any:
        session = await self.inner.clone(factory.inner, primary)
        if session is not None:
            self.models[id(session)] = factory.model
        self.log("clone", factory.model)
        return session

    async def close(self, session: Any) -> None:
        await self.inner.close(session)
        self.log("close", self.models.pop(id(session), "?"))

    async def run(self, session: Any, request: Any) -> Any:
        model, call = self.model_of(session), next(self.calls)
        n = await self.gate(model, "run", call, request)
        try:
            result = await self.inner.run(session, request)
        except BaseException:
            self.log("end", model, step=n, call=call, ok=False)
            raise
        self.log("end", model, step=n, call=call, ok=True)
        return result

    async def batch(self, session: Any, requests: Sequence[Any]) -> list[Any]:
        model, call = self.model_of(session), next(self.calls)
        n = await self.gate(model, "batch", call, requests[0] if requests else None)
        try:
            results = await self.inner.batch(session, requests)
        except BaseException:
            self.log("end", model, step=n, call=call, ok=False)
            raise
        self.log("end", model, step=n, call=call, ok=True)
        return results

    async def stream(self, session: Any, request: Any) -> AsyncIterator[Any]:
        model, call = self.model_of(session), next(self.calls)
        chunks = self.inner.stream(session, request)
        pulled, exhausted = 0, False
        try:
            while True:
                n = await self.gate(model, "chunk", call, request, chunk=pulled)
                try:
                    chunk = await chunks.__anext__()
                except StopAsyncIteration:
                    exhausted = True
                    self.log("end", model, step=n, call=call, ok=True, last=True)
                    return
                except BaseException:
                    self.log("end", model, step=n, call=call, ok=False)
                    raise
                self.log("end", model, step=n, call=call, ok=True, last=False)
                pulled += 1
                yield chunk
        finally:
            aclose = getattr(chunks, "aclose", None)
            if aclose is not None:
                await aclose()
            self.log("stream_closed", model, call=call, chunks=pulled, exhausted=exhausted)

    async def reset(self, session: Any) -> None:
        await self.inner.reset(session)

    # A batching model's work (the embedded default's silero_vad) passes through ungated:
    # no test holds a batched step, and the engine calls are the inner provider's.
    async def engine(self, factory: Any, max_batch: int) -> Any:
        inner = factory.inner if isinstance(factory, GatedFactory) else factory
        return await self.inner.engine(inner, max_batch)  # type: ignore[attr-defined]

    async def join(self, engine: Any, members: Sequence[Any]) -> Any:
        return await self.inner.join(engine, members)  # type: ignore[attr-defined]

    async def step(self, engine: Any, keys: Sequence[int]) -> Any:
        return await self.inner.step(engine, keys)  # type: ignore[attr-defined]

    async def leave(self, engine: Any, key: int) -> None:
        await self.inner.leave(engine, key)  # type: ignore[attr-defined]

    async def close_engine(self, engine: Any) -> None:
        await self.inner.close_engine(engine)  # type: ignore[attr-defined]


def main(argv: Sequence[str]) -> int:
    """``GATE_DIR`` then ``voxpool``'s own arguments: the CLI, with the provider gated."""
    from server import cli, serving
    from server.blas import AdaptiveThreads
    from server.provider import ThreadedProvider

    gate_dir = Path(argv[0])

    def gated_provider(threads: AdaptiveThreads | None = None) -> GatedProvider:
        return GatedProvider(ThreadedProvider(threads=threads), gate_dir)

    # the server's state is built by serving.make_state, whose default provider is this name
    vars(serving)["ThreadedProvider"] = gated_provider
    return cli.main(list(argv[1:]))


# ------------------------------------------------------------------ test side
def wait_until(what: str, probe: Callable[[], T | None], timeout: float = HANG_GUARD_S) -> T:
    """Poll ``probe`` until it returns something truthy, and return that (AssertionError after
    the guard)."""
    deadline = time.monotonic() + timeout
    while True:
        got = probe()
        if got:
            return got
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


class GatedServer(LiveServer):
    """A live server over :class:`GatedProvider`, traced; :meth:`stop` opens every gate first."""

    def __init__(self, config: Path, log_dir: Path) -> None:
        super().__init__(config, log_dir)
        self.gate_dir = log_dir / f"gate-{config.stem}-{self.port}"
        self.gate_dir.mkdir()
        self.trace_path = self.gate_dir / "trace.jsonl"
        self.extra = ("--trace", str(self.trace_path))

    def entry(self) -> list[str]:
        """``voxpool`` with the gated provider (:func:`main`), gates in :attr:`gate_dir`."""
        return ["tests.server.gated", str(self.gate_dir)]

    def start(self, timeout: float = 90.0) -> GatedServer:
        super().start(timeout)
        return self

    def stop(self, timeout: float = 60.0) -> int:
        for gate in (*self.gate_dir.glob("gate-*"), *self.gate_dir.glob("hold-load-*")):
            gate.unlink()
        return super().stop(timeout)

    # ---- the gate
    def _write_gate(self, model: str, through: int) -> None:
        tmp = self.gate_dir / f".gate-{model}.tmp"
        tmp.write_text(str(through))
        tmp.replace(self.gate_dir / f"gate-{model}")

    def hold(self, model: str) -> int:
        """Hold every step of ``model`` from now on; the number of its last step so far."""
        base = self.last_step(model)
        self._write_gate(model, base)
        return base

    def release(self, model: str, through: int) -> None:
        """Let ``model``'s steps up to ``through`` go (the later ones stay held)."""
        self._write_gate(model, through)

    def open(self, model: str) -> None:
        """Let every step of ``model`` go, now and later."""
        with contextlib.suppress(FileNotFoundError):
            (self.gate_dir / f"gate-{model}").unlink()

    @contextlib.contextmanager
    def held(self, model: str) -> Iterator[int]:
        """Hold ``model`` for the block (opened however it ends); yields its last step before."""
        base = self.hold(model)
        try:
            yield base
        finally:
            self.open(model)

    # ---- the record
    def events(self, model: str | None = None, since: int = 0) -> list[dict[str, Any]]:
        """The provider's log (complete lines) after line ``since``, for one model or all."""
        path = self.gate_dir / "order.jsonl"
        lines = path.read_text().split("\n")[:-1] if path.exists() else []
        out = [json.loads(line) for line in lines]
        return [e for e in out if e["seq"] > since and (model is None or e["model"] == model)]

    def mark(self) -> int:
        """The provider log's last line number: pass it as ``since`` to read what happens next."""
        return max((e["seq"] for e in self.events()), default=0)

    def arrivals(self, model: str, after_step: int = 0) -> list[dict[str, Any]]:
        """The steps of ``model`` numbered after ``after_step`` that reached a session."""
        return [e for e in self.events(model) if e["event"] == "arrive" and e["step"] > after_step]

    def last_step(self, model: str) -> int:
        return max((e["step"] for e in self.arrivals(model)), default=0)

    def wait_arrived(self, model: str, step: int) -> dict[str, Any]:
        """Wait until step ``step`` of ``model`` has reached its session (held or not)."""
        return wait_until(
            f"step {step} of {model}",
            lambda: next((e for e in self.arrivals(model) if e["step"] == step), None),
        )

    def trace(self) -> list[TraceRecord]:
        """The server's ``--trace`` records so far (complete lines)."""
        lines = self.trace_path.read_text().split("\n")[:-1] if self.trace_path.exists() else []
        return [TraceRecord.from_json(line) for line in lines]


@contextlib.contextmanager
def serving(config: Path, log_dir: Path) -> Iterator[GatedServer]:
    """A gated server for the block; stopped at the end, it must exit 0 (its drain finished)."""
    server = GatedServer(config, log_dir).start()
    try:
        yield server
    finally:
        rc = server.stop()
        assert rc == 0, f"gated server exited with {rc}:\n{server.log()[-4000:]}"


def granted_in(record: TraceRecord) -> list[int]:
    """Tickets a trace record granted a slot: its own (request, manage) or its wake-ups'."""
    if record.event in ("request", "manage"):
        return [int(record.args["ticket"])] if record.fields.get("outcome") == "granted" else []
    return [int(ticket) for ticket, _slot in record.fields.get("granted", ())]


def granted_at(records: Sequence[TraceRecord], ticket: int) -> int:
    """The sequence number of the record that gave ``ticket`` its slot."""
    return next(r.seq for r in records if ticket in granted_in(r))


def released_at(records: Sequence[TraceRecord], ticket: int) -> int:
    """The sequence number of the record where ``ticket`` gave its slot back."""
    return next(r.seq for r in records if r.event == "release" and r.args.get("ticket") == ticket)


def max_in_flight(events: Sequence[dict[str, Any]]) -> int:
    """The most steps that were between arrival and end at once, in the log's order."""
    now = peak = 0
    for e in events:
        if e["event"] == "arrive":
            now += 1
            peak = max(peak, now)
        elif e["event"] == "end":
            now -= 1
    return peak


def raw_post(server: LiveServer, path: str, body: dict[str, Any]) -> socket.socket:
    """Send one JSON POST on a bare socket and return it unread: closing it is a client going
    away."""
    data = json.dumps(body).encode()
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=HANG_GUARD_S)
    head = (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\n"
        "Content-Type: application/json\r\n"
        f"Content-Length: {len(data)}\r\n\r\n"
    )
    sock.sendall(head.encode() + data)
    return sock


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
