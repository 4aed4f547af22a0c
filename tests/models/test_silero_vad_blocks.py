"""How far Silero VAD's batched engine advances a member per step (#14).

With no live member in the engine a run member advances by up to
``OFFLINE_STEP_CHUNKS`` chunks in one forward, its first block in its join (a request
alone costs what ``Session.run`` costs); while a live member is in the engine every
block is ``STEP_CHUNKS``, so a live chunk never waits behind a long forward. Either
way every member equals its session: bit for bit with ``batch_math="exact"``, within
1e-5 with "gemm".
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest

from backends.silero_vad import SileroVadFactory, VadChunk, VadRequest, VadResult
from backends.silero_vad.batched import MATHS, OFFLINE_STEP_CHUNKS, STEP_CHUNKS, SileroVadEngine
from core.engine import Emitted, Feed, Member

pytestmark = pytest.mark.usefixtures("one_thread")

CHUNK = 512
TOLERANCE = 1e-5


@pytest.fixture(params=MATHS)
def factory(request: pytest.FixtureRequest, vad_factory: SileroVadFactory) -> SileroVadFactory:
    """The module's factory with each batch_math (same weights)."""
    return SileroVadFactory(vad_factory.backend, vad_factory.weights, batch_math=request.param)


@pytest.fixture(scope="module")
def long_audio(vad_clip: np.ndarray) -> np.ndarray:
    """The clip twice: more chunks than one offline block, at most two."""
    audio = np.tile(vad_clip, 2)
    assert OFFLINE_STEP_CHUNKS < -(-len(audio) // CHUNK) <= 2 * OFFLINE_STEP_CHUNKS
    return audio


def _same_result(ours: VadResult, theirs: VadResult, exact: bool) -> None:
    assert ours.probabilities.shape == theirs.probabilities.shape
    if exact:
        assert np.array_equal(ours.probabilities, theirs.probabilities)
    else:
        assert np.abs(ours.probabilities - theirs.probabilities).max(initial=0) <= TOLERANCE
    assert ours.segments == theirs.segments


def _same_chunks(ours: Sequence[VadChunk], theirs: Sequence[VadChunk], exact: bool) -> None:
    assert [(c.index, c.start, c.events) for c in ours] == [
        (c.index, c.start, c.events) for c in theirs
    ]
    tolerance = 0.0 if exact else TOLERANCE
    pairs = zip(ours, theirs, strict=True)
    assert all(abs(a.probability - b.probability) <= tolerance for a, b in pairs)


def _result(entries: Sequence[Emitted]) -> VadResult:
    assert all(e.error is None for e in entries)
    assert [e.done for e in entries] == [False] * (len(entries) - 1) + [True]
    (result,) = entries[-1].chunks
    assert isinstance(result, VadResult)
    return result


def _step_until_done(
    engine: SileroVadEngine, seen: dict[int, list[Emitted]], active: list[int]
) -> None:
    """Step the ``active`` keys together until each is done, adding what each emitted to
    ``seen``."""
    while active:
        for e in engine.step(active):
            seen[e.key].append(e)
            if e.done:
                active.remove(e.key)


def _chunks(entries: Sequence[Emitted]) -> list[VadChunk]:
    assert all(e.error is None for e in entries)
    return [c for e in entries for c in e.chunks]


def test_a_run_member_alone_advances_an_offline_block_per_step(
    factory: SileroVadFactory, long_audio: np.ndarray
) -> None:
    """Its join takes the first block, one step the rest: two engine calls in all."""
    engine = factory.engine(4)
    request = VadRequest(long_audio)
    entries = engine.join([Member(0, request, False)])
    entries += engine.step([0])
    exact = factory.batch_math == "exact"
    _same_result(_result(entries), factory.create().run(request), exact)


@pytest.mark.parametrize("members", [2, 5, 64, 70])
def test_offline_members_share_one_offline_block_per_call(
    factory: SileroVadFactory, long_audio: np.ndarray, members: int
) -> None:
    """One call carries about OFFLINE_STEP_CHUNKS in all, whatever the members (a member
    arriving meanwhile waits for one block's time, not one block per member): each run
    member takes an equal share, at least STEP_CHUNKS; a stream member's doubling blocks
    stop at its share. Every member still equals its session."""
    share = max(STEP_CHUNKS, OFFLINE_STEP_CHUNKS // members)
    engine = factory.engine(members)
    requests = [VadRequest(long_audio) for _ in range(members)]
    entries = {
        e.key: [e] for e in engine.join([Member(k, r, k == 0) for k, r in enumerate(requests)])
    }
    assert len(entries[0][0].chunks) == STEP_CHUNKS  # a stream's first block
    active = sorted(entries)
    while active:
        call_share = max(STEP_CHUNKS, OFFLINE_STEP_CHUNKS // len(active))
        for e in engine.step(active):
            entries[e.key].append(e)
            assert len(e.chunks) <= call_share  # a stream's block stops at its share
            if e.done:
                active.remove(e.key)
                engine.leave(e.key)
    chunks = -(-len(long_audio) // CHUNK)
    assert all(len(entries[k]) == -(-chunks // share) for k in range(1, members))
    exact = factory.batch_math == "exact"
    session = factory.create()
    _same_chunks(_chunks(entries[0]), list(session.stream(requests[0])), exact)
    for key in (1, members - 1):
        _same_result(_result(entries[key]), session.run(requests[key]), exact)


def test_a_short_run_member_alone_is_done_in_its_join(
    factory: SileroVadFactory, vad_clip: np.ndarray
) -> None:
    request = VadRequest(vad_clip)
    (joined,) = factory.engine(2).join([Member(1, request, False)])
    _same_result(_result([joined]), factory.create().run(request), factory.batch_math == "exact")


def test_with_a_live_member_in_the_engine_every_block_is_a_step_block(
    factory: SileroVadFactory, vad_clip: np.ndarray
) -> None:
    """A live member joined first (it sits some steps out): the run member's join processes
    nothing and each step advances it by at most STEP_CHUNKS chunks."""
    engine = factory.engine(2)
    feed = Feed()
    (live,) = engine.join([Member(0, VadRequest(np.zeros(0, np.float32)), True, feed)])
    request = VadRequest(vad_clip[: 40 * CHUNK + 100])  # 41 chunks: 6 steps of 8 or fewer
    (joined,) = engine.join([Member(1, request, False)])
    assert not joined.done and not joined.chunks
    run = [joined]
    live_entries = [live]
    sent = 0
    while not run[-1].done:
        if len(run) % 2:  # the live member pushes every other step, sits the others out
            feed.push(vad_clip[sent : sent + CHUNK])
            sent += CHUNK
        keys = [1, 0] if feed.ready else [1]
        out = engine.step(keys)
        run.append(out[0])
        live_entries += out[1:]
    assert len(run) == 1 + -(-41 // STEP_CHUNKS)
    feed.close()
    while not live_entries[-1].done:
        live_entries += engine.step([0])
    exact = factory.batch_math == "exact"
    session = factory.create()
    _same_result(_result(run), session.run(request), exact)
    _same_chunks(_chunks(live_entries), list(session.stream(VadRequest(vad_clip[:sent]))), exact)


def test_a_live_member_joining_mid_way_bounds_the_blocks_until_it_leaves(
    factory: SileroVadFactory, long_audio: np.ndarray, vad_clip: np.ndarray
) -> None:
    """A run member alone takes an offline block in its join; a live member joins: the run
    member advances STEP_CHUNKS per step; once the live member left, the rest in one step."""
    engine = factory.engine(2)
    request = VadRequest(long_audio)
    run = engine.join([Member(0, request, False)])
    feed = Feed()
    live = engine.join([Member(1, VadRequest(np.zeros(0, np.float32)), True, feed)])
    pieces = 5
    for k in range(pieces):
        feed.push(vad_clip[k * CHUNK : (k + 1) * CHUNK])
        ours, theirs = engine.step([0, 1])
        run.append(ours)
        live.append(theirs)
    feed.close()
    ours, theirs = engine.step([0, 1])  # the close: the live member ends
    run.append(ours)
    live.append(theirs)
    assert theirs.done and not ours.done
    engine.leave(1)
    run += engine.step([0])  # no live member left: the rest of the audio at once
    exact = factory.batch_math == "exact"
    session = factory.create()
    result = _result(run)
    _same_result(result, session.run(request), exact)
    remaining = len(result.probabilities) - OFFLINE_STEP_CHUNKS - (pieces + 1) * STEP_CHUNKS
    assert 0 < remaining <= OFFLINE_STEP_CHUNKS
    audio = vad_clip[: pieces * CHUNK]
    _same_chunks(_chunks(live), list(session.stream(VadRequest(audio))), exact)


def test_members_joining_together_share_the_join_forward(
    factory: SileroVadFactory, vad_clip: np.ndarray, long_audio: np.ndarray
) -> None:
    """Runs and streams of different lengths joining at once with no live member: the join
    advances them all; the long run and the stream finish in later steps."""
    engine = factory.engine(4)
    requests = [
        (VadRequest(vad_clip[:3000]), False),
        (VadRequest(long_audio), False),
        (VadRequest(vad_clip), True),
        (VadRequest(vad_clip[:700]), True),
    ]
    joined = engine.join([Member(k, r, s) for k, (r, s) in enumerate(requests)])
    assert [e.done for e in joined] == [True, False, False, True]
    assert len(joined[2].chunks) == STEP_CHUNKS
    seen = {k: [e] for k, e in enumerate(joined)}
    _step_until_done(engine, seen, [1, 2])
    exact = factory.batch_math == "exact"
    session = factory.create()
    for key in (0, 1):
        _same_result(_result(seen[key]), session.run(requests[key][0]), exact)
    for key in (2, 3):
        assert seen[key][-1].done
        _same_chunks(_chunks(seen[key]), list(session.stream(requests[key][0])), exact)


def test_a_failing_forward_in_the_join_fails_only_its_member(
    factory: SileroVadFactory,
    vad_clip: np.ndarray,
    long_audio: np.ndarray,
    poisoned_forward: float,
) -> None:
    """The join's forward fails because of one joiner's window: that joiner fails alone; the
    others (done in the join, or continuing in steps) equal their sessions."""
    poison = np.float32(poisoned_forward)
    bad = vad_clip.copy()
    bad[1000] = poison
    requests = [
        (VadRequest(vad_clip[:16000]), False),  # 31 chunks: within its share of the join
        (VadRequest(bad), False),
        (VadRequest(long_audio), False),
        (VadRequest(vad_clip), True),
    ]
    engine = factory.engine(4)
    joined = engine.join([Member(k, r, s) for k, (r, s) in enumerate(requests)])
    assert isinstance(joined[1].error, FloatingPointError)
    assert [e.done for e in joined] == [True, False, False, False]
    engine.leave(1)
    seen = {k: [joined[k]] for k in (0, 2, 3)}
    _step_until_done(engine, seen, [2, 3])
    exact = factory.batch_math == "exact"
    session = factory.create()
    for key in (0, 2):
        _same_result(_result(seen[key]), session.run(requests[key][0]), exact)
    _same_chunks(_chunks(seen[3]), list(session.stream(requests[3][0])), exact)


def test_a_member_that_leaves_between_offline_blocks_frees_its_key(
    factory: SileroVadFactory, vad_clip: np.ndarray, long_audio: np.ndarray
) -> None:
    """Aborted after its first block (its join): a member joining under its key starts clean."""
    engine = factory.engine(2)
    (first,) = engine.join([Member(0, VadRequest(long_audio), False)])
    assert first.error is None and not first.done
    engine.leave(0)
    request = VadRequest(vad_clip[:5000])
    (again,) = engine.join([Member(0, request, False)])
    _same_result(_result([again]), factory.create().run(request), factory.batch_math == "exact")


def test_a_live_member_joining_bounds_a_doubling_stream(
    factory: SileroVadFactory, vad_clip: np.ndarray, long_audio: np.ndarray
) -> None:
    """A stream's blocks double while it is alone; a live member joins: STEP_CHUNKS per step;
    once it left, the blocks grow again from the chunks processed; the chunks equal the
    session's stream."""
    engine = factory.engine(2)
    request = VadRequest(long_audio)
    stream = engine.join([Member(0, request, True)])
    for _ in range(4):
        stream += engine.step([0])
    assert [len(e.chunks) for e in stream] == [8, 8, 16, 32, 64]
    feed = Feed()
    live = engine.join([Member(1, VadRequest(np.zeros(0, np.float32)), True, feed)])
    feed.push(vad_clip[:CHUNK])
    feed.close()
    ours, theirs = engine.step([0, 1])
    stream.append(ours)
    live.append(theirs)
    assert len(ours.chunks) == STEP_CHUNKS and theirs.done
    engine.leave(1)
    stream += engine.step([0])
    assert len(stream[-1].chunks) == 128 + STEP_CHUNKS  # as many as it processed
    while not stream[-1].done:
        stream += engine.step([0])
    exact = factory.batch_math == "exact"
    session = factory.create()
    _same_chunks(_chunks(stream), list(session.stream(request)), exact)
    _same_chunks(_chunks(live), list(session.stream(VadRequest(vad_clip[:CHUNK]))), exact)
