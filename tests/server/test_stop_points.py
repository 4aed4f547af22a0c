"""A cancelled request stops its session call at the next stop point (core.stopping).

Through the real runtime and provider (worker threads, both anyio backends): a
session call that only ends when asked to stop frees its slot once its request is
cancelled. Through the real models: a Whisper or Piper run stopped mid-way raises
``RunStopped`` and leaves its session as a fresh one (the next request gets what a
new session gives).
"""

from __future__ import annotations

import threading
import wave
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import attrs
import numpy as np
import pytest

from core.pool import Interface, Session
from core.stopping import RunStopped, stop_point
from server.provider import ThreadedProvider
from server.runtime import ModelSpec, Runtime, RuntimeConfig, SystemClock

DATA = Path(__file__).resolve().parents[1] / "data" / "whisper"
HANG_GUARD_S = 60.0
"""How long a call that is never asked to stop polls before it gives up: a guard against a
hang (the test then fails on what the call recorded), never a verdict on speed."""


@attrs.define(eq=False)
class PollingSession:
    """A session whose ``run`` of ``"long"`` polls with stop points until stopped; others
    return at once. It records how each long run ended."""

    started: threading.Event = attrs.field(factory=threading.Event)
    ended: list[str] = attrs.field(factory=list)
    family: str = "fake"
    task: str = "tts"
    mode: str = "offline"
    interfaces: frozenset[Interface] = frozenset(Interface)

    def run(self, request: Any) -> Any:
        if request != "long":
            for _ in range(3):
                stop_point()  # never raises: nobody cancelled this request
            return "quick"
        self.started.set()
        never = threading.Event()
        try:
            for _ in range(int(HANG_GUARD_S / 0.001)):
                stop_point()
                never.wait(0.001)
        except RunStopped:
            self.ended.append("stopped")
            raise
        self.ended.append("ran to its end")
        return "long"

    def stream(self, request: Any) -> Iterator[Any]:
        yield self.run(request)

    def batch(self, requests: Sequence[Any]) -> list[Any]:
        return [self.run(r) for r in requests]

    def reset(self) -> None:
        pass

    def close(self) -> None:
        pass


@attrs.define(eq=False)
class OneSessionFactory:
    session: PollingSession
    family: str = "fake"
    task: str = "tts"
    mode: str = "offline"

    def capacity(self) -> int:
        return 1

    def create(self) -> Session:
        return self.session

    def clone(self, primary: Session) -> Session:
        raise AssertionError("one slot: no clones")


class FactoryProvider(ThreadedProvider):
    """The production provider (worker threads) over a given factory."""

    def __init__(self, factory: OneSessionFactory) -> None:
        super().__init__()
        self.factory = factory

    async def load(self, spec: ModelSpec) -> Any:
        return self.factory

    async def release(self, spec: ModelSpec, factory: Any) -> None:
        return None


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
@pytest.mark.parametrize("kind", ["run", "batch", "stream"])
def test_a_cancelled_request_frees_its_slot_at_the_next_stop_point(backend: str, kind: str) -> None:
    session = PollingSession()

    async def main() -> tuple[str, list[Any]]:
        rt = Runtime(
            FactoryProvider(OneSessionFactory(session)),
            RuntimeConfig(busy_timeout_ms=0),
            clock=SystemClock(),
        )
        rt.add_model(ModelSpec("m", "fake", slots=1))

        leave = anyio.CancelScope()

        async def long_request() -> None:
            with leave:
                if kind == "run":
                    await rt.run("m", "long")
                elif kind == "batch":
                    await rt.batch("m", ["long"])
                else:  # a chunk in the making
                    await rt.stream("m", "long")

        async with rt, anyio.create_task_group() as tg:
            tg.start_soon(long_request)
            await anyio.to_thread.run_sync(session.started.wait)
            assert rt.status_of("m").active_slots == 1
            leave.cancel()  # the client leaves
            # waits for the slot: the long run must have stopped for this to return early
            after = await rt.run("m", "quick")
        return after, session.ended

    after, ended = anyio.run(main, backend=backend)
    assert ended == ["stopped"]
    assert after == "quick"


def test_a_run_that_is_not_cancelled_ignores_its_stop_points() -> None:
    """Quick calls pass stop points on every path (``run``, ``batch``, a stream's chunk): no
    flag is up."""
    session = PollingSession()

    async def main() -> list[Any]:
        rt = Runtime(
            FactoryProvider(OneSessionFactory(session)),
            RuntimeConfig(busy_timeout_ms=0),
            clock=SystemClock(),
        )
        rt.add_model(ModelSpec("m", "fake", slots=1))
        async with rt:
            return [
                await rt.run("m", "quick"),
                await rt.batch("m", ["quick", "quick"]),
                await rt.stream("m", "quick"),
            ]

    assert anyio.run(main) == ["quick", ["quick", "quick"], ["quick"]]
    assert session.ended == []


class StopAfter:
    """A module's ``stop_point`` replaced: the ``n``-th call raises (the flag went up then)."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.calls = 0

    def __call__(self) -> None:
        self.calls += 1
        if self.calls >= self.n:
            raise RunStopped("stopped by the test")


def _audio(name: str) -> np.ndarray:
    with wave.open(str(DATA / f"{name}.wav")) as f:
        pcm = np.frombuffer(f.readframes(f.getnframes()), dtype="<i2")
    return pcm.astype(np.float32) / np.float32(32768.0)


def test_a_whisper_run_stops_between_operations_and_its_session_stays_fresh(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from backends.whisper import WhisperRequest, load_factory, program
    from backends.whisper.session import WhisperSession

    factory = load_factory(None)
    session = factory.create()
    assert isinstance(session, WhisperSession)
    short = WhisperRequest(_audio("short"))
    fresh = factory.create().run(short)
    stop = StopAfter(40)  # the encoder pass and a few decoding steps
    with monkeypatch.context() as m:
        m.setattr(program, "stop_point", stop)
        with pytest.raises(RunStopped):
            session.run(WhisperRequest(_audio("meeting")))
    assert stop.calls == 40
    assert session.run(short) == fresh


def test_a_piper_run_stops_between_sentences_and_its_session_stays_fresh(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from backends.piper import PiperRequest, load_factory
    from backends.piper import session as piper_session

    factory = load_factory(None)
    session = factory.create()
    text = PiperRequest("One sentence. Then another one. And a third.", seed=7)
    fresh = factory.create().run(text)
    stop = StopAfter(2)  # before the second sentence
    with monkeypatch.context() as m:
        m.setattr(piper_session, "stop_point", stop)
        with pytest.raises(RunStopped):
            session.run(text)
    assert stop.calls == 2
    again = session.run(text)
    assert np.array_equal(again.audio, fresh.audio)


def test_a_call_that_fails_after_its_cancel_is_logged_not_lost(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A call past its last stop point when the request is cancelled ends first; if it then
    fails, trio's cancellation wins as the task group exits, and the failure is logged."""
    from server.runtime.stoppable import shielded_stoppable

    started, cancelled = threading.Event(), threading.Event()

    def fails() -> None:
        started.set()
        cancelled.wait(HANG_GUARD_S)
        raise ValueError("the model broke")

    async def main() -> bool:
        with anyio.CancelScope() as scope:
            async with anyio.create_task_group() as tg:

                async def cancel_once_started() -> None:
                    await anyio.to_thread.run_sync(started.wait)
                    scope.cancel()
                    cancelled.set()

                tg.start_soon(cancel_once_started)
                await shielded_stoppable(lambda: anyio.to_thread.run_sync(fails))
        return scope.cancelled_caught

    with caplog.at_level("ERROR", logger="voxpool.runtime"):
        assert anyio.run(main, backend="trio")
    failed = [r for r in caplog.records if "failed after its request was cancelled" in r.message]
    assert len(failed) == 1, caplog.records
    info = failed[0].exc_info
    assert info is not None and isinstance(info[1], ValueError)
