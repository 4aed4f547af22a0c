"""Silero VAD's batched engine (#14) against the unbatched session.

Probabilities within 1e-5 of ``Session.run`` / ``Session.stream``, identical segments
and events; members join between steps, fail alone, leave and have their keys reused.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest

from backends.silero_vad import (
    SileroVadFactory,
    VadChunk,
    VadRequest,
    VadResult,
)
from backends.silero_vad.batched import STEP_CHUNKS
from core.engine import BatchEngine, Emitted, Member
from tests.models.batching import check_offers_an_engine
from tests.models.silero_vad_reference import mixed_requests

TOLERANCE = 1e-5


def _requests(vad_clip: np.ndarray) -> list[VadRequest]:
    """The mixed requests, then one of exactly one step's chunks."""
    return [*mixed_requests(vad_clip), VadRequest(vad_clip[: 512 * STEP_CHUNKS])]


def _drive(engine: BatchEngine, arrivals: dict[int, Sequence[Member]]) -> dict[int, list[Emitted]]:
    """Join ``arrivals[s]`` before step ``s``, step every active member, leave the finished.

    Returns every member's :class:`Emitted` entries (join included), by key.
    """
    seen: dict[int, list[Emitted]] = {}
    active: list[int] = []
    step = 0
    while active or any(s >= step for s in arrivals):
        for emitted in engine.join(arrivals.get(step, ())):
            seen.setdefault(emitted.key, []).append(emitted)
            if not (emitted.done or emitted.error):
                active.append(emitted.key)
            else:
                engine.leave(emitted.key)
        if active:
            for emitted in engine.step(active):
                seen[emitted.key].append(emitted)
                if emitted.done or emitted.error:
                    active.remove(emitted.key)
                    engine.leave(emitted.key)
        step += 1
    return seen


def _chunks(entries: list[Emitted]) -> list[Any]:
    assert all(e.error is None for e in entries)
    assert [e.done for e in entries].count(True) == 1 and entries[-1].done
    return [c for e in entries for c in e.chunks]


def _same_result(ours: VadResult, theirs: VadResult) -> None:
    assert ours.probabilities.dtype == np.float32
    assert ours.probabilities.shape == theirs.probabilities.shape
    assert np.abs(ours.probabilities - theirs.probabilities).max(initial=0) <= TOLERANCE
    assert ours.segments == theirs.segments
    assert ours.num_samples == theirs.num_samples


def _same_chunks(ours: list[VadChunk], theirs: list[VadChunk]) -> None:
    assert [(c.index, c.start, c.events) for c in ours] == [
        (c.index, c.start, c.events) for c in theirs
    ]
    pairs = zip(ours, theirs, strict=True)
    assert all(abs(a.probability - b.probability) <= TOLERANCE for a, b in pairs)


def test_factory_offers_an_engine(vad_factory: SileroVadFactory) -> None:
    check_offers_an_engine(vad_factory, 4)


@pytest.mark.parametrize("stream", [False, True], ids=["run", "stream"])
def test_all_members_together_equal_the_session(
    vad_factory: SileroVadFactory, vad_clip: np.ndarray, stream: bool
) -> None:
    requests = _requests(vad_clip)
    engine = vad_factory.engine(len(requests))
    seen = _drive(engine, {0: [Member(k, r, stream) for k, r in enumerate(requests)]})
    session = vad_factory.create()
    for key, request in enumerate(requests):
        chunks = _chunks(seen[key])
        if stream:
            _same_chunks(chunks, list(session.stream(request)))
        else:
            assert len(chunks) == 1
            _same_result(chunks[0], session.run(request))
    # no live member: a call's 512 chunks are shared out among its members (at least
    # 512 // 5 each here), the join taking the first block; a stream's blocks double from 8
    chunks = -(-len(vad_clip) // 512)
    sizes = [len(e.chunks) for e in seen[0]]
    if stream:
        assert sizes[:4] == [8, 8, 16, 32] and sum(sizes) == chunks
    else:
        assert len(sizes) <= -(-chunks // (512 // len(requests)))
        assert sizes[-1] == 1 and not any(sizes[:-1])


def test_members_join_mid_decode_and_keys_are_reused(
    vad_factory: SileroVadFactory, vad_clip: np.ndarray
) -> None:
    """Members arrive at different steps, some while others are mid-way; a freed key returns."""
    requests = _requests(vad_clip)
    engine = vad_factory.engine(3)
    arrivals = {
        0: [Member(0, requests[0], False), Member(1, requests[4], True)],
        1: [Member(1, requests[1], True)],  # key 1 left after step 0 (one chunk), reused
        3: [Member(2, requests[3], False)],
    }
    seen = _drive(engine, arrivals)
    session = vad_factory.create()
    _same_result(_chunks(seen[0])[0], session.run(requests[0]))
    first, second = seen[1][:1], seen[1][1:]  # key 1: the short stream (done at join), reused
    _same_chunks(_chunks(first), list(session.stream(requests[4])))
    _same_chunks(_chunks(second), list(session.stream(requests[1])))
    _same_result(_chunks(seen[2])[0], session.run(requests[3]))


def test_a_failing_member_does_not_disturb_the_others(
    vad_factory: SileroVadFactory, vad_clip: np.ndarray
) -> None:
    requests = _requests(vad_clip)
    engine = vad_factory.engine(4)
    bad_run = VadRequest(vad_clip[:2000], final=False)  # final=False is for streams only
    arrivals = {
        0: [
            Member(0, requests[0], False),
            Member(1, "not a request", False),
            Member(2, bad_run, False),
            Member(3, requests[2], True),
        ],
    }
    seen = _drive(engine, arrivals)
    session = vad_factory.create()
    with pytest.raises(TypeError) as type_error:
        session.run("not a request")  # type: ignore[arg-type]
    with pytest.raises(ValueError) as value_error:
        session.run(bad_run)
    for key, expected in ((1, type_error.value), (2, value_error.value)):
        (entry,) = seen[key]
        assert type(entry.error) is type(expected) and str(entry.error) == str(expected)
        assert not entry.chunks
    _same_result(_chunks(seen[0])[0], session.run(requests[0]))
    _same_chunks(_chunks(seen[3]), list(session.stream(requests[2])))


def test_a_key_in_use_or_out_of_range_is_refused(
    vad_factory: SileroVadFactory, vad_clip: np.ndarray
) -> None:
    engine = vad_factory.engine(2)
    request = VadRequest(vad_clip[: 16 * 512])  # a stream of 16 chunks: its join and a step
    (joined,) = engine.join([Member(0, request, True)])
    assert joined.error is None and len(joined.chunks) == STEP_CHUNKS
    in_use, out_of_range = engine.join([Member(0, request, False), Member(2, request, False)])
    assert isinstance(in_use.error, ValueError) and isinstance(out_of_range.error, ValueError)
    (done,) = engine.step([0])  # the first member is untouched
    assert done.done
    _same_chunks([*joined.chunks, *done.chunks], list(vad_factory.create().stream(request)))


def test_empty_audio_is_done_at_join(vad_factory: SileroVadFactory) -> None:
    engine = vad_factory.engine(2)
    empty = VadRequest(np.zeros(0, np.float32))
    run, stream = engine.join([Member(0, empty, False), Member(1, empty, True)])
    assert run.done and stream.done and not stream.chunks
    (result,) = run.chunks
    _same_result(result, vad_factory.create().run(empty))


def test_a_non_final_stream_keeps_its_partial_chunk(
    vad_factory: SileroVadFactory, vad_clip: np.ndarray
) -> None:
    request = VadRequest(vad_clip[: 512 * 20 + 300], final=False)
    seen = _drive(vad_factory.engine(1), {0: [Member(0, request, True)]})
    chunks = _chunks(seen[0])
    assert len(chunks) == 20
    _same_chunks(chunks, list(vad_factory.create().stream(request)))


def test_leave_forgets_the_member(vad_factory: SileroVadFactory, vad_clip: np.ndarray) -> None:
    engine = vad_factory.engine(1)
    request = VadRequest(vad_clip)
    engine.join([Member(0, request, True)])
    first = engine.step([0])
    assert len(first[0].chunks) == STEP_CHUNKS and not first[0].done
    engine.leave(0)
    engine.leave(0)  # unknown key: a no-op
    (after,) = engine.step([0])
    assert isinstance(after.error, KeyError)
    seen = _drive(engine, {0: [Member(0, request, True)]})  # the key again: a fresh stream
    _same_chunks(_chunks(seen[0]), list(vad_factory.create().stream(request)))
    engine.close()
