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
from tests.models.silero_vad_reference import fixture


@pytest.fixture(scope="module")
def factory() -> SileroVadFactory:
    return load_factory()


@pytest.fixture(scope="module")
def clip() -> np.ndarray:
    return np.array(fixture()[0])


def _same(a: VadResult, b: VadResult) -> None:
    assert np.array_equal(a.probabilities, b.probabilities)
    assert a.segments == b.segments
    assert a.num_samples == b.num_samples


def _members(clip: np.ndarray) -> list[VadRequest]:
    rng = np.random.default_rng(3)
    noise = rng.normal(0, 0.02, 5 * 16000).astype(np.float32)
    return [
        VadRequest(clip),
        VadRequest(clip[: 3 * 16000 + 77], options=VadOptions(threshold=0.3)),
        VadRequest(noise),
        VadRequest(np.float32(0.4) * clip[::-1].copy(), options=VadOptions(speech_pad_ms=0)),
        VadRequest(clip[100:700]),
    ]


def test_protocols_and_capacity(factory: SileroVadFactory) -> None:
    assert isinstance(factory, SessionFactory)
    session = factory.create()
    assert isinstance(session, Session)
    assert factory.capacity() == 16
    assert (session.family, session.task, session.mode) == ("silero_vad", "vad", "offline")
    assert session.interfaces == frozenset(Interface)
    clone = factory.clone(session)
    assert (clone.family, clone.task, clone.mode, clone.interfaces) == (
        session.family,
        session.task,
        session.mode,
        session.interfaces,
    )
    streaming = SileroVadFactory(factory.backend, factory.weights, mode="streaming")
    assert streaming.capacity() == 16 and streaming.create().mode == "streaming"


def test_clone_rejects_a_foreign_primary(factory: SileroVadFactory) -> None:
    other = load_factory()
    with pytest.raises(ValueError, match="primary"):
        factory.clone(other.create())
    with pytest.raises(ValueError, match="primary"):
        factory.clone(object())


def test_batch_equals_sequential_runs(factory: SileroVadFactory, clip: np.ndarray) -> None:
    requests = _members(clip)
    batched = factory.create().batch(requests)
    assert len(batched) == len(requests)
    for request, result in zip(requests, batched, strict=True):
        _same(result, factory.create().run(request))
    assert factory.create().batch([]) == []


def test_batch_order_does_not_matter(factory: SileroVadFactory, clip: np.ndarray) -> None:
    requests = _members(clip)
    forward = factory.create().batch(requests)
    backward = factory.create().batch(requests[::-1])[::-1]
    for a, b in zip(forward, backward, strict=True):
        _same(a, b)


def test_clones_give_identical_outputs_cold_and_warm(
    factory: SileroVadFactory, clip: np.ndarray
) -> None:
    primary = factory.create()
    clones = [factory.clone(primary) for _ in range(3)]
    request = VadRequest(clip)
    first = primary.run(request)
    for session in clones:
        _same(session.run(request), first)
        session.run(VadRequest(clip[::-1].copy()))  # warm it with something else
        _same(session.run(request), first)
    streamed = [c.probability for c in clones[0].stream(request)]
    assert np.array_equal(np.array(streamed, np.float32), first.probabilities)


def test_stream_equals_offline_exactly(factory: SileroVadFactory, clip: np.ndarray) -> None:
    session = factory.create()
    chunks = list(session.stream(VadRequest(clip)))
    offline = session.run(VadRequest(clip))
    assert np.array_equal(
        np.array([c.probability for c in chunks], np.float32), offline.probabilities
    )


def test_stream_is_lazy_and_state_is_per_session(
    factory: SileroVadFactory, clip: np.ndarray
) -> None:
    a, b = factory.create(), factory.create()
    it_a = a.stream(VadRequest(clip))
    it_b = b.stream(VadRequest(clip[::-1].copy()))
    got_a = []
    for _ in range(len(clip) // 512 + 1):  # interleave two live streams
        got_a.append(next(it_a).probability)
        next(it_b, None)
    assert next(it_a, None) is None
    assert np.array_equal(np.array(got_a, np.float32), a.run(VadRequest(clip)).probabilities)


def test_continue_stream_in_pieces_equals_one_stream(
    factory: SileroVadFactory, clip: np.ndarray
) -> None:
    whole = list(factory.create().stream(VadRequest(clip)))
    session = factory.create()
    cuts = [0, 1000, 1000, 5120, 77777, 150001, len(clip)]
    pieces = []
    for i, (lo, hi) in enumerate(itertools.pairwise(cuts)):
        last = hi == len(clip)
        request = VadRequest(clip[lo:hi], continue_stream=i > 0, final=last)
        pieces += list(session.stream(request))
    assert pieces == whole


def test_reset_clears_stream_state(factory: SileroVadFactory, clip: np.ndarray) -> None:
    session = factory.create()
    fresh = list(factory.create().stream(VadRequest(clip[:40000])))
    list(session.stream(VadRequest(clip[40000:80000], final=False)))
    carried = list(session.stream(VadRequest(clip[:40000], continue_stream=True)))
    assert carried != fresh  # state carried over: different positions and probabilities
    list(session.stream(VadRequest(clip[40000:80000], final=False)))
    session.reset()
    after_reset = list(session.stream(VadRequest(clip[:40000], continue_stream=True)))
    assert after_reset == fresh


def test_final_stream_closes_open_speech(factory: SileroVadFactory, clip: np.ndarray) -> None:
    _, meta = fixture()
    cut = (meta["speech"][0]["start"] + meta["speech"][0]["end"]) // 2  # mid-sentence
    chunks = list(factory.create().stream(VadRequest(clip[:cut])))
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


def test_bad_options_and_misuse(factory: SileroVadFactory) -> None:
    with pytest.raises(ValueError, match="threshold"):
        VadOptions(threshold=1.5)
    with pytest.raises(ValueError, match="neg_threshold"):
        VadOptions(threshold=0.5, neg_threshold=0.6)
    with pytest.raises(ValueError, match="min_silence"):
        VadOptions(min_silence_duration_ms=-1)
    session = factory.create()
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


def test_float64_and_empty_audio(factory: SileroVadFactory, clip: np.ndarray) -> None:
    session: SileroVadSession = factory.create()
    as64 = session.run(VadRequest(clip.astype(np.float64)))
    _same(as64, session.run(VadRequest(clip)))
    empty = session.run(VadRequest(np.zeros(0, np.float32)))
    assert empty.probabilities.shape == (0,) and empty.segments == ()
    assert list(session.stream(VadRequest(np.zeros(0, np.float32)))) == []
    assert exp_len(session.run(VadRequest(np.zeros(513, np.float32)))) == 2


def exp_len(result: VadResult) -> int:
    return int(result.probabilities.shape[0])


def test_a_full_pool_of_sixteen_gives_identical_results(
    factory: SileroVadFactory, clip: np.ndarray
) -> None:
    pool = build_pool(factory, 16)
    assert pool.size == 16
    request = VadRequest(clip[: 4 * 16000])
    expected = pool.at(0).run(request)
    for slot in range(16):
        _same(pool.at(slot).run(request), expected)
    for session in pool.teardown_order():
        session.close()
