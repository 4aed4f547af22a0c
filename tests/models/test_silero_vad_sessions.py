"""Session contract of silero_vad: batch == sequential, clones, reset, streaming pieces, errors."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from backends.silero_vad import (
    SileroVadFactory,
    SileroVadSession,
    VadOptions,
    VadRequest,
    VadResult,
    load_factory,
)
from core.pool import Interface, Session, SessionFactory, build_pool
from tests.models.silero_vad_reference import fixture, mixed_requests


def _same(a: VadResult, b: VadResult) -> None:
    assert np.array_equal(a.probabilities, b.probabilities)
    assert a.segments == b.segments
    assert a.num_samples == b.num_samples


def test_protocols_and_capacity(vad_factory: SileroVadFactory) -> None:
    assert isinstance(vad_factory, SessionFactory)
    session = vad_factory.create()
    assert isinstance(session, Session)
    assert vad_factory.capacity() == 16
    assert (session.family, session.task, session.mode) == ("silero_vad", "vad", "offline")
    assert session.interfaces == frozenset(Interface)
    clone = vad_factory.clone(session)
    assert (clone.family, clone.task, clone.mode, clone.interfaces) == (
        session.family,
        session.task,
        session.mode,
        session.interfaces,
    )
    streaming = SileroVadFactory(vad_factory.backend, vad_factory.weights, mode="streaming")
    assert streaming.capacity() == 16 and streaming.create().mode == "streaming"


def test_clone_rejects_a_foreign_primary(vad_factory: SileroVadFactory) -> None:
    other = load_factory()
    with pytest.raises(ValueError, match="primary"):
        vad_factory.clone(other.create())
    with pytest.raises(ValueError, match="primary"):
        vad_factory.clone(object())


def test_batch_equals_sequential_runs(vad_factory: SileroVadFactory, vad_clip: np.ndarray) -> None:
    requests = mixed_requests(vad_clip)
    batched = vad_factory.create().batch(requests)
    assert len(batched) == len(requests)
    for request, result in zip(requests, batched, strict=True):
        _same(result, vad_factory.create().run(request))
    assert vad_factory.create().batch([]) == []


def test_batch_order_does_not_matter(vad_factory: SileroVadFactory, vad_clip: np.ndarray) -> None:
    requests = mixed_requests(vad_clip)
    forward = vad_factory.create().batch(requests)
    backward = vad_factory.create().batch(requests[::-1])[::-1]
    for a, b in zip(forward, backward, strict=True):
        _same(a, b)


def test_clones_give_identical_outputs_cold_and_warm(
    vad_factory: SileroVadFactory, vad_clip: np.ndarray
) -> None:
    primary = vad_factory.create()
    clones = [vad_factory.clone(primary) for _ in range(3)]
    request = VadRequest(vad_clip)
    first = primary.run(request)
    for session in clones:
        _same(session.run(request), first)
        session.run(VadRequest(vad_clip[::-1].copy()))  # warm it with something else
        _same(session.run(request), first)
    streamed = [c.probability for c in clones[0].stream(request)]
    assert np.array_equal(np.array(streamed, np.float32), first.probabilities)


def test_stream_equals_offline_exactly(vad_factory: SileroVadFactory, vad_clip: np.ndarray) -> None:
    session = vad_factory.create()
    chunks = list(session.stream(VadRequest(vad_clip)))
    offline = session.run(VadRequest(vad_clip))
    assert np.array_equal(
        np.array([c.probability for c in chunks], np.float32), offline.probabilities
    )


def test_stream_is_lazy_and_state_is_per_session(
    vad_factory: SileroVadFactory, vad_clip: np.ndarray
) -> None:
    a, b = vad_factory.create(), vad_factory.create()
    it_a = a.stream(VadRequest(vad_clip))
    it_b = b.stream(VadRequest(vad_clip[::-1].copy()))
    got_a = []
    for _ in range(len(vad_clip) // 512 + 1):  # interleave two live streams
        got_a.append(next(it_a).probability)
        next(it_b, None)
    assert next(it_a, None) is None
    assert np.array_equal(np.array(got_a, np.float32), a.run(VadRequest(vad_clip)).probabilities)


def test_continue_stream_in_pieces_equals_one_stream(
    vad_factory: SileroVadFactory, vad_clip: np.ndarray
) -> None:
    whole = list(vad_factory.create().stream(VadRequest(vad_clip)))
    session = vad_factory.create()
    cuts = [0, 1000, 1000, 5120, 77777, 150001, len(vad_clip)]
    pieces = []
    for i, (lo, hi) in enumerate(itertools.pairwise(cuts)):
        last = hi == len(vad_clip)
        request = VadRequest(vad_clip[lo:hi], continue_stream=i > 0, final=last)
        pieces += list(session.stream(request))
    assert pieces == whole


def test_reset_clears_stream_state(vad_factory: SileroVadFactory, vad_clip: np.ndarray) -> None:
    session = vad_factory.create()
    fresh = list(vad_factory.create().stream(VadRequest(vad_clip[:40000])))
    list(session.stream(VadRequest(vad_clip[40000:80000], final=False)))
    carried = list(session.stream(VadRequest(vad_clip[:40000], continue_stream=True)))
    assert carried != fresh  # state carried over: different positions and probabilities
    list(session.stream(VadRequest(vad_clip[40000:80000], final=False)))
    session.reset()
    after_reset = list(session.stream(VadRequest(vad_clip[:40000], continue_stream=True)))
    assert after_reset == fresh


def test_final_stream_closes_open_speech(
    vad_factory: SileroVadFactory, vad_clip: np.ndarray
) -> None:
    _, meta = fixture()
    cut = (meta["speech"][0]["start"] + meta["speech"][0]["end"]) // 2  # mid-sentence
    chunks = list(vad_factory.create().stream(VadRequest(vad_clip[:cut])))
    events = [(e.kind, e.sample) for c in chunks for e in c.events]
    assert events[0][0] == "start"
    assert events[-1] == ("end", cut)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"audio": np.zeros(1600, np.float32), "sample_rate": 8000}, ValueError, "16000 Hz"),
        ({"audio": np.zeros(1600, np.float32), "sample_rate": 48000}, ValueError, "16000 Hz"),
        ({"audio": np.zeros((2, 1600), np.float32)}, ValueError, "mono"),
        ({"audio": np.zeros(1600, np.int16)}, ValueError, "float"),
        ({"audio": np.full(1600, np.nan, np.float32)}, ValueError, "NaN"),
        ({"audio": [0.0] * 1600}, TypeError, "numpy"),
    ],
)
def test_bad_requests_are_rejected(kwargs: dict[str, object], error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        VadRequest(**kwargs)  # type: ignore[arg-type]


def test_bad_options_and_misuse(vad_factory: SileroVadFactory) -> None:
    with pytest.raises(ValueError, match="threshold"):
        VadOptions(threshold=1.5)
    with pytest.raises(ValueError, match="neg_threshold"):
        VadOptions(threshold=0.5, neg_threshold=0.6)
    with pytest.raises(ValueError, match="min_silence"):
        VadOptions(min_silence_duration_ms=-1)
    session = vad_factory.create()
    with pytest.raises(ValueError, match="stream"):
        session.run(VadRequest(np.zeros(512, np.float32), continue_stream=True))
    with pytest.raises(TypeError, match="VadRequest"):
        session.run(np.zeros(512, np.float32))
    with pytest.raises(ValueError, match="unknown options"):
        load_factory(bogus=1)
    with pytest.raises(ValueError, match="mode"):
        load_factory(mode="live")
    session.close()
    with pytest.raises(RuntimeError, match="closed"):
        session.run(VadRequest(np.zeros(512, np.float32)))


def test_float64_and_empty_audio(vad_factory: SileroVadFactory, vad_clip: np.ndarray) -> None:
    session: SileroVadSession = vad_factory.create()
    as64 = session.run(VadRequest(vad_clip.astype(np.float64)))
    _same(as64, session.run(VadRequest(vad_clip)))
    empty = session.run(VadRequest(np.zeros(0, np.float32)))
    assert empty.probabilities.shape == (0,) and empty.segments == ()
    assert list(session.stream(VadRequest(np.zeros(0, np.float32)))) == []
    assert exp_len(session.run(VadRequest(np.zeros(513, np.float32)))) == 2


def exp_len(result: VadResult) -> int:
    return int(result.probabilities.shape[0])


def test_a_full_pool_of_sixteen_gives_identical_results(
    vad_factory: SileroVadFactory, vad_clip: np.ndarray
) -> None:
    pool = build_pool(vad_factory, 16)
    assert pool.size == 16
    request = VadRequest(vad_clip[: 4 * 16000])
    expected = pool.at(0).run(request)
    for slot in range(16):
        _same(pool.at(slot).run(request), expected)
    for session in pool.teardown_order():
        session.close()
