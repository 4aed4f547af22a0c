"""Silero VAD's batched engine keeps its members' state as rows of shared arrays (#14).

Live members that receive whole 32 ms chunks go through the engine's vectorized path
(state, context and trigger rows indexed by key, events only where the trigger may
move); the others through their own rows. These tests mix both in the same steps, with
per-member options, key reuse and a failing forward, and hold every member to the
unbatched session: bit for bit with ``batch_math="exact"``, within 1e-5 with "gemm".
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest

from backends.silero_vad import SileroVadFactory, VadChunk, VadOptions, VadRequest
from backends.silero_vad.batched import MATHS, SileroVadEngine
from core.engine import Emitted, Feed, Member
from tests.models.silero_vad_reference import mixed_requests

pytestmark = pytest.mark.usefixtures("one_thread")

TOLERANCE = 1e-5
CHUNK = 512
EMPTY = VadRequest(np.zeros(0, np.float32))


def _same(ours: Sequence[VadChunk], theirs: Sequence[VadChunk], exact: bool = False) -> None:
    assert [(c.index, c.start, c.events) for c in ours] == [
        (c.index, c.start, c.events) for c in theirs
    ]
    tolerance = 0.0 if exact else TOLERANCE
    assert all(
        abs(a.probability - b.probability) <= tolerance for a, b in zip(ours, theirs, strict=True)
    )


@pytest.fixture(params=MATHS)
def factory(request: pytest.FixtureRequest, vad_factory: SileroVadFactory) -> SileroVadFactory:
    """The module's factory with each batch_math (same weights)."""
    return SileroVadFactory(vad_factory.backend, vad_factory.weights, batch_math=request.param)


def _chunks(entries: Sequence[Emitted]) -> list[VadChunk]:
    assert all(e.error is None for e in entries)
    return [c for e in entries for c in e.chunks]


OPTIONS = [
    VadOptions(),
    VadOptions(threshold=0.3),
    VadOptions(threshold=0.7, neg_threshold=0.6),
    VadOptions(min_silence_duration_ms=0, speech_pad_ms=0),
    VadOptions(threshold=0.45, min_silence_duration_ms=300),
]


def test_live_members_in_one_chunk_steps_equal_the_session(
    factory: SileroVadFactory, vad_clip: np.ndarray
) -> None:
    """Ten live members with their own options, fed 32 ms a step (the vectorized path), some
    with a burst now and then (their own rows), joining late, one leaving mid-speech and its
    key reused: every member's chunks and events equal its session stream."""
    members = 10
    audios = [np.roll(vad_clip, 4001 * k)[: len(vad_clip) - 300 * k] for k in range(members)]
    bursts = {3: {5, 20}, 7: {0, 11, 12}}  # member: steps at which it pushes 3 pieces at once
    joins = [0, 0, 0, 1, 2, 2, 3, 5, 8, 9]
    leaver, gone_at = 4, 40  # leaves after step 40, mid-stream; a fresh stream takes its key
    engine = factory.engine(members)
    feeds = [Feed() for _ in range(members)]
    requests = [VadRequest(np.zeros(0, np.float32), options=OPTIONS[k % 5]) for k in range(members)]
    sent = [0] * members
    seen: dict[int, list[Emitted]] = {k: [] for k in range(members)}
    reused: list[Emitted] = []
    reuse_audio = vad_clip[12_000:60_000]
    reuse_feed, reuse_sent = Feed(), 0
    active: list[int] = []
    step = 0
    while active or step <= max(joins):
        for k in range(members):
            if joins[k] == step:
                (joined,) = engine.join([Member(k, requests[k], True, feeds[k])])
                assert joined.error is None
                active.append(k)
        for k in active:
            feed = feeds[k] if not (k == leaver and step > gone_at) else reuse_feed
            audio = audios[k] if feed is feeds[k] else reuse_audio
            done = sent[k] if feed is feeds[k] else reuse_sent
            count = 3 if step in bursts.get(k, ()) else 1
            for _ in range(count):
                if done < len(audio):
                    feed.push(audio[done : done + CHUNK])
                    done += CHUNK
                elif not feed.closed:
                    feed.close()
            if feed is feeds[k]:
                sent[k] = done
            else:
                reuse_sent = done
        ready = [
            k for k in active if (feeds[k] if k != leaver or step <= gone_at else reuse_feed).ready
        ]
        for emitted in engine.step(ready):
            k = emitted.key
            (reused if k == leaver and step > gone_at else seen[k]).append(emitted)
            if emitted.done:
                active.remove(k)
                engine.leave(k)
        if step == gone_at:  # the leaver's owner goes away; a new live stream takes the key
            engine.leave(leaver)
            (joined,) = engine.join([Member(leaver, EMPTY, True, reuse_feed)])
            assert joined.error is None
        step += 1
    session = factory.create()
    exact = factory.batch_math == "exact"
    for k in range(members):
        theirs = list(session.stream(VadRequest(audios[k], options=requests[k].options)))
        if k == leaver:
            ours = _chunks(seen[k])
            assert len(ours) == gone_at + 1 - joins[k]
            _same(ours, theirs[: len(ours)], exact)
            continue
        assert seen[k][-1].done
        _same(_chunks(seen[k]), theirs, exact)
    assert reused[-1].done
    _same(_chunks(reused), list(session.stream(VadRequest(reuse_audio))), exact)
    # the streams did speak: events came out of the vectorized path too
    assert any(c.events for k in range(members) for c in _chunks(seen[k]))


def test_a_failing_forward_fails_only_its_member(
    factory: SileroVadFactory, vad_clip: np.ndarray, poisoned_forward: float
) -> None:
    """The batch's forward fails because of one member's window: that member fails alone,
    the others are retried one by one, advance exactly once and stay exact."""
    poison = np.float32(poisoned_forward)
    engine = factory.engine(3)
    assert isinstance(engine, SileroVadEngine)
    feeds = [Feed(), Feed()]
    offline = VadRequest(vad_clip[: 40 * CHUNK])  # 5 steps of its own rows' blocks
    joined = engine.join([Member(0, EMPTY, True, feeds[0]), Member(1, EMPTY, True, feeds[1])])
    joined += engine.join([Member(2, offline, True)])
    assert all(e.error is None and not e.done for e in joined)
    audio = vad_clip[: 6 * CHUNK]
    got: dict[int, list[Emitted]] = {0: [], 1: [], 2: []}
    failed: list[Emitted] = []
    active = [0, 1, 2]
    for s in range(6):
        piece = audio[s * CHUNK : (s + 1) * CHUNK]
        feeds[0].push(piece)
        if 1 in active:
            if s == 3:
                piece = piece.copy()
                piece[100] = poison
            feeds[1].push(piece)
        for emitted in engine.step([k for k in active if k == 2 or feeds[k].ready]):
            if emitted.error is not None:
                failed.append(emitted)
            else:
                got[emitted.key].append(emitted)
            if emitted.error is not None or emitted.done:
                active.remove(emitted.key)
                engine.leave(emitted.key)
    assert [e.key for e in failed] == [1] and isinstance(failed[0].error, FloatingPointError)
    session = factory.create()
    exact = factory.batch_math == "exact"
    theirs = list(session.stream(VadRequest(audio, final=False)))
    _same(_chunks(got[0]), theirs, exact)
    _same(_chunks(got[1]), theirs[:3], exact)
    assert got[2][-1].done
    _same(_chunks(got[2]), list(session.stream(offline)), exact)


@pytest.mark.parametrize("stream", [False, True], ids=["run", "stream"])
def test_members_of_different_lengths_in_one_forward(
    factory: SileroVadFactory, vad_clip: np.ndarray, stream: bool
) -> None:
    """Run and stream members of different lengths and options step together (each for
    its own number of windows): each equals its session."""
    requests = mixed_requests(vad_clip)
    engine = factory.engine(len(requests))
    joined = engine.join([Member(k, r, stream) for k, r in enumerate(requests)])
    seen: dict[int, list[Emitted]] = {e.key: [e] for e in joined}
    active = [e.key for e in joined if not e.done]
    while active:
        for emitted in engine.step(active):
            seen[emitted.key].append(emitted)
            if emitted.done:
                active.remove(emitted.key)
    session = factory.create()
    exact = factory.batch_math == "exact"
    for k, request in enumerate(requests):
        ours = _chunks(seen[k])
        if stream:
            _same(ours, list(session.stream(request)), exact)
            continue
        (result,) = ours
        theirs = session.run(request)
        assert result.segments == theirs.segments
        difference = np.abs(result.probabilities - theirs.probabilities).max(initial=0)
        assert difference <= (0.0 if exact else TOLERANCE)


def test_batch_math_is_checked(vad_factory: SileroVadFactory) -> None:
    with pytest.raises(ValueError, match="batch_math"):
        SileroVadFactory(vad_factory.backend, vad_factory.weights, batch_math="fast")
    with pytest.raises(ValueError, match="batch_math"):
        SileroVadEngine(vad_factory.backend, vad_factory.weights, 2, "fast")
