"""Silero VAD live members (#14): streams whose audio arrives while they run.

At the engine: a member with a :class:`core.engine.Feed` equals ``Session.stream`` over the
whole audio (``final=True``) however its audio is cut into pieces and steps, sits a step out
with no new chunk, keeps a burst for later steps and ends at the feed's close. Through the
runtime: many more live streams than a session pool may hold (slots are engine rows), each
exact, the decode task stepping only when a member has input.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import anyio
import numpy as np
import pytest

from backends.silero_vad import SileroVadFactory, VadChunk, VadRequest, load_factory
from backends.silero_vad.batched import STEP_CHUNKS
from core.engine import Emitted, Feed, Member
from core.pool import MAX_BATCH_SLOTS, MAX_PARALLEL_SESSIONS
from server.config import ConfigError, parse_config
from server.provider import ThreadedProvider, make_backend
from server.runtime import ModelSpec, Runtime, RuntimeConfig
from server.runtime.errors import InvalidRequestError
from server.runtime.ports import SystemClock
from sim.fakes import FakeProvider, FakeScript

pytestmark = pytest.mark.usefixtures("one_thread")

TOLERANCE = 1e-5
CHUNK = 512
EMPTY = VadRequest(np.zeros(0, np.float32))


def _same(ours: Sequence[VadChunk], theirs: Sequence[VadChunk]) -> None:
    assert [(c.index, c.start, c.events) for c in ours] == [
        (c.index, c.start, c.events) for c in theirs
    ]
    assert all(
        abs(a.probability - b.probability) <= TOLERANCE for a, b in zip(ours, theirs, strict=True)
    )


def _cuts(n: int, sizes: Sequence[int]) -> list[tuple[int, int]]:
    """``[0, n)`` cut into pieces of ``sizes``, cycled."""
    out, lo, k = [], 0, 0
    while lo < n:
        hi = min(n, lo + sizes[k % len(sizes)])
        out.append((lo, hi))
        lo, k = hi, k + 1
    return out


def _fields(emitted: Emitted) -> tuple[Any, ...]:
    return emitted.key, emitted.chunks, emitted.done, emitted.error


def _chunks(entries: list[Emitted]) -> list[VadChunk]:
    assert all(e.error is None for e in entries)
    return [c for e in entries for c in e.chunks]


def test_live_members_equal_the_session_however_the_audio_arrives(
    vad_factory: SileroVadFactory, vad_clip: np.ndarray
) -> None:
    """Three members with pieces of different sizes (a partial chunk, whole ones, a burst),
    joining at different steps; each step takes what was pushed, every member is exact."""
    audios = [vad_clip, vad_clip[: 7 * 16000] * np.float32(0.5), vad_clip[3000 : 3000 + 40_000]]
    cuts = [
        _cuts(len(a), s) for a, s in zip(audios, ([100, 900], [512], [3000, 5000]), strict=True)
    ]
    feeds = [Feed() for _ in audios]
    engine = vad_factory.engine(3)
    seen: dict[int, list[Emitted]] = {k: [] for k in range(3)}
    joins = {0: [0], 2: [1], 5: [2]}  # member k joins before step s
    active: list[int] = []
    step = 0
    while active or step <= max(joins):
        for k in joins.get(step, []):
            (emitted,) = engine.join([Member(k, EMPTY, True, feeds[k])])
            assert _fields(emitted) == (k, (), False, None)
            active.append(k)
        for k in active:  # the owners push their next piece (or close)
            at = step - min(s for s, ks in joins.items() if k in ks)
            if at < len(cuts[k]):
                lo, hi = cuts[k][at]
                feeds[k].push(audios[k][lo:hi])
            else:
                feeds[k].close()
        ready = [k for k in active if feeds[k].ready]
        for emitted in engine.step(ready):
            seen[emitted.key].append(emitted)
            if emitted.done:
                active.remove(emitted.key)
                engine.leave(emitted.key)
        step += 1
    session = vad_factory.create()
    for k, audio in enumerate(audios):
        assert seen[k][-1].done
        _same(_chunks(seen[k]), list(session.stream(VadRequest(audio))))


def test_a_member_without_new_audio_sits_the_step_out(
    vad_factory: SileroVadFactory, vad_clip: np.ndarray
) -> None:
    engine = vad_factory.engine(2)
    live, other = Feed(), Feed()
    engine.join([Member(0, EMPTY, True, live), Member(1, EMPTY, True, other)])
    live.push(vad_clip[:300])  # less than a chunk: nothing to process yet
    other.push(vad_clip[:CHUNK])
    assert live.ready and other.ready
    quiet, busy = engine.step([0, 1])
    # it took its samples: no whole chunk, so no forward and no output
    assert _fields(quiet) == (0, (), False, None) and not live.ready
    assert [c.index for c in busy.chunks] == [0] and not busy.done
    live.push(vad_clip[300:CHUNK])
    (got,) = engine.step([0])
    assert [c.index for c in got.chunks] == [0] and not got.done


def test_a_burst_is_processed_a_step_at_a_time_and_the_close_ends_it(
    vad_factory: SileroVadFactory, vad_clip: np.ndarray
) -> None:
    engine = vad_factory.engine(1)
    feed = Feed()
    engine.join([Member(0, EMPTY, True, feed)])
    audio = vad_clip[: (2 * STEP_CHUNKS + 3) * CHUNK + 100]  # 19 whole chunks and a partial one
    feed.push(audio)
    feed.close()
    got: list[Emitted] = []
    while not (got and got[-1].done):
        assert feed.ready  # the engine holds the rest of the burst
        got.extend(engine.step([0]))
    assert [len(e.chunks) for e in got] == [STEP_CHUNKS, STEP_CHUNKS, 4]
    _same(_chunks(got), list(vad_factory.create().stream(VadRequest(audio))))


def test_a_feed_closed_without_audio_ends_the_member_with_nothing(
    vad_factory: SileroVadFactory,
) -> None:
    engine = vad_factory.engine(1)
    feed = Feed()
    engine.join([Member(0, EMPTY, True, feed)])
    feed.close()
    assert [_fields(e) for e in engine.step([0])] == [(0, (), True, None)]
    with pytest.raises(ValueError, match="closed"):
        feed.push(np.zeros(CHUNK, np.float32))


def test_a_live_member_must_be_a_fresh_stream(vad_factory: SileroVadFactory) -> None:
    engine = vad_factory.engine(2)
    run, resumed = engine.join(
        [
            Member(0, EMPTY, False, Feed()),
            Member(1, VadRequest(np.zeros(0, np.float32), continue_stream=True), True, Feed()),
        ]
    )
    assert isinstance(run.error, ValueError) and isinstance(resumed.error, ValueError)


# ------------------------------------------------------------------ runtime
STREAMS = 3 * MAX_PARALLEL_SESSIONS  # more than a session pool may hold


def test_many_live_streams_through_the_runtime(vad_clip: np.ndarray) -> None:
    """48 live streams on one batched model (48 slots: engine rows, one session), their owners
    pushing 32 ms pieces concurrently: each stream equals its session stream, and the decode
    task stepped only when some member had input (never more steps than pushes)."""
    audios = [vad_clip[k * 997 : k * 997 + 3 * 16000 + k * 37] for k in range(STREAMS)]
    results: list[list[Any]] = [[] for _ in range(STREAMS)]
    pushes = [0]

    async def main() -> int:
        rt = Runtime(ThreadedProvider(), RuntimeConfig(busy_timeout_ms=0))
        rt.add_model(ModelSpec("vad", "silero_vad", task="vad", slots=STREAMS, batching=True))
        async with rt:
            await rt.load_model("vad")
            driver = rt.drivers["vad"]
            assert len(rt.pools["vad"].pool.sessions) == 1
            assert rt.status_of("vad").max_parallel_slots == MAX_BATCH_SLOTS  # rows, not sessions

            async def live(k: int) -> None:
                feed = Feed()

                async def push() -> None:
                    for lo in range(0, len(audios[k]), CHUNK):
                        feed.push(audios[k][lo : lo + CHUNK])
                        pushes[0] += 1
                        await anyio.sleep(0)  # let the others push too
                    feed.close()

                async with (
                    rt.open_stream("vad", EMPTY, feed=feed) as chunks,
                    anyio.create_task_group() as tg,
                ):
                    tg.start_soon(push)
                    results[k] = [chunk async for chunk in chunks]

            async with anyio.create_task_group() as tg:
                for k in range(STREAMS):
                    tg.start_soon(live, k)
            return driver.steps

    steps = anyio.run(main)
    session = load_factory(make_backend("numpy", "cpu")).create()
    for k in range(STREAMS):
        _same(results[k], list(session.stream(VadRequest(audios[k]))))
    assert 0 < steps <= pushes[0] + STREAMS  # no step without input (a push or a close)


def test_live_input_needs_a_batching_model(vad_clip: np.ndarray) -> None:
    async def main() -> None:
        rt = Runtime(ThreadedProvider(), RuntimeConfig(busy_timeout_ms=0))
        rt.add_model(ModelSpec("vad", "silero_vad", task="vad", slots=2))
        async with rt:
            with pytest.raises(InvalidRequestError, match="live input only with batching"):
                async with rt.open_stream("vad", EMPTY, feed=Feed()):
                    pass
            assert rt.status_of("vad").active_slots == 0

    anyio.run(main)


def test_a_batching_model_may_have_more_slots_than_a_session_pool() -> None:
    """The config takes slots up to MAX_BATCH_SLOTS for a batching model (engine rows), 16
    for any other (sessions)."""
    model = {"id": "vad", "family": "silero_vad", "slots": 1100, "batching": True}
    (spec,) = parse_config({"models": [model]}).models
    assert spec.slots == 1100 and spec.batching
    with pytest.raises(ConfigError, match="between 1 and 16"):
        parse_config({"models": [{**model, "batching": False}]})
    with pytest.raises(ConfigError, match=f"between 1 and {MAX_BATCH_SLOTS}"):
        parse_config({"models": [{**model, "slots": MAX_BATCH_SLOTS + 1}]})


def test_a_live_stream_whose_owner_leaves_frees_its_slot_and_spares_the_others(
    vad_clip: np.ndarray,
) -> None:
    """Two live streams; one owner goes away after its first chunk (its feed never closed):
    its member leaves the batch and its slot returns, the other stream stays exact."""
    audio = vad_clip[: 2 * 16000]
    out: dict[str, Any] = {}

    async def main() -> None:
        rt = Runtime(ThreadedProvider(), RuntimeConfig(busy_timeout_ms=0))
        rt.add_model(ModelSpec("vad", "silero_vad", task="vad", slots=2, batching=True))
        async with rt:
            await rt.load_model("vad")
            leaver, stayer = Feed(), Feed()

            async def leave() -> None:
                with anyio.CancelScope() as scope:
                    async with rt.open_stream("vad", EMPTY, feed=leaver) as chunks:
                        leaver.push(audio[: 4 * CHUNK])
                        async for _ in chunks:
                            scope.cancel()  # the client is gone
                out["left"] = scope.cancelled_caught

            async def stay() -> None:
                async with rt.open_stream("vad", EMPTY, feed=stayer) as chunks:
                    for lo in range(0, len(audio), CHUNK):
                        stayer.push(audio[lo : lo + CHUNK])
                    stayer.close()
                    out["stayed"] = [chunk async for chunk in chunks]

            async with anyio.create_task_group() as tg:
                tg.start_soon(leave)
                tg.start_soon(stay)
            assert rt.status_of("vad").active_slots == 0
            assert rt.drivers["vad"].members == 0 and not rt.violations
            again = Feed()  # the freed slot serves a later live stream
            async with rt.open_stream("vad", EMPTY, feed=again) as chunks:
                again.push(audio[:CHUNK])
                again.close()
                out["again"] = [chunk async for chunk in chunks]

    anyio.run(main)
    session = load_factory(make_backend("numpy", "cpu")).create()
    assert out["left"] is True
    _same(out["stayed"], list(session.stream(VadRequest(audio))))
    _same(out["again"], list(session.stream(VadRequest(audio[:CHUNK]))))


def test_an_engine_without_live_input_refuses_a_feed_before_launching() -> None:
    """A batching model whose engine takes no live input (the simulator's fake engine)."""

    async def main() -> None:
        script = FakeScript(load_time=0.0, create_time=0.0, clone_time=0.0, close_time=0.0)
        rt = Runtime(FakeProvider(SystemClock(), {"m": script}), RuntimeConfig(busy_timeout_ms=0))
        rt.add_model(ModelSpec("m", "fake", slots=2, batching=True))
        async with rt:
            with pytest.raises(InvalidRequestError, match="takes no live input"):
                async with rt.open_stream("m", {"chunks": 1}, feed=Feed()):
                    pass
            assert rt.status_of("m").active_slots == 0
            assert rt.drivers["m"].members == 0

    anyio.run(main)
