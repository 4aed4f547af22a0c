"""Piper's batched engine (#14) against the unbatched session.

Durations exact, audio within ``AUDIO_TOLERANCE`` of ``Session.run`` /
``Session.stream`` (at zero noise and seeded, since the noise is drawn from each
request's own RNG in the session's order); members join at different steps, fail
alone, leave and have their keys reused; stream members yield the session's chunks.
"""

from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import pytest
from threadpoolctl import threadpool_limits

from backends import parallel
from backends.piper import (
    AudioLimitError,
    PiperChunk,
    PiperFactory,
    PiperModel,
    PiperRequest,
    PiperResult,
    load_model,
)
from backends.piper import model as piper_model
from backends.piper.batched import AUDIO_TOLERANCE, PLAN_AHEAD
from backends.piper.phonemize import phoneme_ids, phonemize
from backends.piper.progress import Progress, request_rng
from core.engine import BatchEngine, Emitted, Member
from tests.models.batching import check_offers_an_engine

TWO = "Hello there. How are you today?"
THREE = "Piper is fast. It sounds great. This has three sentences."
TWO_S = PiperRequest(TWO, seed=9)


@pytest.fixture(scope="module", autouse=True)
def _one_blas_thread() -> Iterator[None]:
    with threadpool_limits(limits=1, user_api="blas"):
        yield


@functools.cache
def _model() -> PiperModel:
    return load_model()


def _factory(mode: str = "offline") -> PiperFactory:
    return PiperFactory(_model(), mode=mode)


REQUESTS = [
    PiperRequest("Good morning.", seed=1),
    PiperRequest(TWO, noise_scale=0.0, noise_w=0.0),  # zero noise
    PiperRequest("Yes.", seed=2, length_scale=1.3),
    PiperRequest(THREE, seed=3, volume=0.5),
    PiperRequest("The quick brown fox jumps over the lazy dog.", seed=4, normalize_audio=False),
]


def _drive(engine: BatchEngine, arrivals: dict[int, Sequence[Member]]) -> dict[int, list[Emitted]]:
    """Join ``arrivals[s]`` before step ``s``, step every active member (joiners included),
    leave the finished. Returns every member's entries (join included), by key."""
    seen: dict[int, list[Emitted]] = {}
    active: list[int] = []
    step = 0
    while active or any(s >= step for s in arrivals):
        for emitted in engine.join(arrivals.get(step, ())):
            seen.setdefault(emitted.key, []).append(emitted)
            if emitted.done or emitted.error:
                engine.leave(emitted.key)
            else:
                active.append(emitted.key)
        if active:
            for emitted in engine.step(list(active)):
                seen[emitted.key].append(emitted)
                if emitted.done or emitted.error:
                    active.remove(emitted.key)
                    engine.leave(emitted.key)
        step += 1
    return seen


def _chunks(entries: list[Emitted]) -> list[Any]:
    assert all(e.error is None for e in entries), [e.error for e in entries]
    assert entries[-1].done and not any(e.done for e in entries[:-1])
    return [c for e in entries for c in e.chunks]


def _result(entries: list[Emitted]) -> PiperResult:
    chunks = _chunks(entries)
    assert len(chunks) == 1 and isinstance(chunks[0], PiperResult)
    return chunks[0]


def _same_chunks(ours: Sequence[PiperChunk], theirs: Sequence[PiperChunk]) -> float:
    """Same sentences, ids and lengths; returns the largest audio difference."""
    assert [(c.index, c.phonemes, c.phoneme_ids) for c in ours] == [
        (c.index, c.phonemes, c.phoneme_ids) for c in theirs
    ]
    assert [c.audio.shape for c in ours] == [c.audio.shape for c in theirs]
    diffs = [
        np.max(np.abs(a.audio - b.audio), initial=0) for a, b in zip(ours, theirs, strict=True)
    ]
    return float(max(diffs, default=0.0))


def _same_result(ours: PiperResult, theirs: PiperResult) -> float:
    assert ours.sample_rate == theirs.sample_rate
    assert ours.audio.shape == theirs.audio.shape and ours.audio.dtype == np.float32
    return _same_chunks(ours.chunks, theirs.chunks)


@functools.cache
def _expected() -> list[PiperResult]:
    session = _factory().create()
    return [session.run(r) for r in REQUESTS]


def test_factory_offers_an_engine() -> None:
    check_offers_an_engine(_factory(), 4)


@pytest.mark.parametrize("pack_frames", [0, 256, 10**6])  # HiFi-GAN alone, in groups, all at once
def test_a_wave_batched_equals_the_session(
    pack_frames: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(piper_model, "DECODER_PACK_FRAMES", pack_frames)
    members = [Member(i, r, False) for i, r in enumerate(REQUESTS)]
    seen = _drive(_factory().engine(8), {0: members})
    errors = [_same_result(_result(seen[i]), e) for i, e in enumerate(_expected())]
    print(f"piper batched ({pack_frames} frames a pack) vs session: max abs err {errors}")
    assert max(errors) <= AUDIO_TOLERANCE
    # one sentence per member per step: the three-sentence request took three steps
    assert len(seen[3]) == 1 + 3 and len(seen[0]) == 1 + 1


def test_members_join_at_different_steps() -> None:
    arrivals = {
        0: [Member(0, REQUESTS[3], False)],
        1: [Member(1, REQUESTS[1], False), Member(2, REQUESTS[0], False)],
        2: [Member(3, REQUESTS[4], False)],
    }
    seen = _drive(_factory().engine(4), arrivals)
    expected = _expected()
    for key, index in ((0, 3), (1, 1), (2, 0), (3, 4)):
        assert _same_result(_result(seen[key]), expected[index]) <= AUDIO_TOLERANCE


def test_a_batch_of_one_is_the_session_bit_for_bit() -> None:
    seen = _drive(_factory().engine(1), {0: [Member(0, REQUESTS[3], False)]})
    assert _result(seen[0]).audio.tobytes() == _expected()[3].audio.tobytes()


def test_failing_members_do_not_disturb_the_others() -> None:
    limited = PiperRequest(THREE, seed=3, max_seconds=1.0)  # fails in its own step
    arrivals = {
        0: [
            Member(0, REQUESTS[1], False),
            Member(1, PiperRequest("Bad speaker.", speaker=1), False),  # refused at join
            Member(2, "not a request", False),
            Member(3, limited, True),
            Member(4, REQUESTS[0], True),
        ]
    }
    seen = _drive(_factory().engine(5), arrivals)
    assert isinstance(seen[1][0].error, ValueError) and "single speaker" in str(seen[1][0].error)
    assert isinstance(seen[2][0].error, TypeError)
    with pytest.raises(AudioLimitError) as unbatched:
        list(_factory("streaming").create().stream(limited))
    assert isinstance(seen[3][-1].error, AudioLimitError)
    assert str(seen[3][-1].error) == str(unbatched.value)
    assert _same_result(_result(seen[0]), _expected()[1]) <= AUDIO_TOLERANCE
    stream = list(_factory("streaming").create().stream(REQUESTS[0]))
    assert _same_chunks(_chunks(seen[4]), stream) <= AUDIO_TOLERANCE
    engine = _factory().engine(2)
    (bad_key,) = engine.join([Member(2, REQUESTS[0], False)])  # out of range
    assert isinstance(bad_key.error, ValueError)
    (unknown,) = engine.step([1])
    assert isinstance(unknown.error, KeyError)


def test_a_run_member_over_its_limit_fails_as_its_plan_reaches_it() -> None:
    """A run member plans PLAN_AHEAD sentences a step: its limit, crossed at sentence 10 of
    14, fails it in its second step (decoding one sentence a step, it would be the tenth),
    with the session's error; a stream member (which does not plan) in the same batch
    goes on."""
    text = " ".join(["One more sentence here."] * 14)
    model, unlimited = _model(), PiperRequest(text, seed=5)
    progress = Progress.start(model, unlimited, request_rng(unlimited))
    planned = progress.plan(functools.partial(model.latent, model.backend))
    frames = [int(latent.durations.sum()) for _, latent in planned]
    seconds = np.cumsum(frames) * progress.frame_seconds
    limited = PiperRequest(text, seed=5, max_seconds=float(seconds[8] + seconds[9]) / 2)
    with pytest.raises(AudioLimitError) as unbatched:
        _factory().create().run(limited)
    seen = _drive(
        _factory("streaming").engine(2), {0: [Member(0, limited, False), Member(1, TWO_S, True)]}
    )
    assert len(seen[0]) == 1 + math.ceil(10 / PLAN_AHEAD) == 3  # the join, then two steps
    assert seen[0][1].error is None and seen[0][1].chunks == ()
    assert isinstance(seen[0][-1].error, AudioLimitError)
    assert str(seen[0][-1].error) == str(unbatched.value)
    stream = list(_factory("streaming").create().stream(TWO_S))
    assert _same_chunks(_chunks(seen[1]), stream) <= AUDIO_TOLERANCE


@pytest.mark.parametrize("alone_fails", [False, True])
def test_a_failed_batch_is_redone_member_by_member(
    alone_fails: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first batch of a run member (planned: latents) and a stream member (not: inputs
    drawing noise) fails as a whole: each is redone alone, the stream's noise redrawn, so
    both give the session's audio; when the stream's sentence also fails alone, only the
    stream fails and the run member still gives its result."""
    real = piper_model.PiperModel.synthesize_batch
    failed = []

    def flaky(self: PiperModel, items: Any, backend: Any = None) -> Any:
        if len(items) > 1 and not failed:
            failed.append(len(items))
            raise RuntimeError("the batch failed")
        if alone_fails and isinstance(items[0], piper_model.SynthesisInput):
            raise RuntimeError("this sentence fails")
        return real(self, items, backend)

    monkeypatch.setattr(piper_model.PiperModel, "synthesize_batch", flaky)
    seen = _drive(
        _factory("streaming").engine(2),
        {0: [Member(0, REQUESTS[3], False), Member(1, TWO_S, True)]},
    )
    assert failed == [2]
    assert _same_result(_result(seen[0]), _expected()[3]) <= AUDIO_TOLERANCE
    if alone_fails:
        assert str(seen[1][-1].error) == "this sentence fails"
    else:
        monkeypatch.setattr(piper_model.PiperModel, "synthesize_batch", real)
        stream = list(_factory("streaming").create().stream(TWO_S))
        assert _same_chunks(_chunks(seen[1]), stream) <= AUDIO_TOLERANCE


def test_stream_members_yield_the_session_chunks() -> None:
    session = _factory("streaming").create()
    requests = [REQUESTS[3], REQUESTS[1], PiperRequest(THREE, seed=3, max_sentence_seconds=30.0)]
    expected = [list(session.stream(r)) for r in requests]
    arrivals = {0: [Member(0, requests[0], True)], 1: [Member(1, requests[1], True)]}
    arrivals[2] = [Member(2, requests[2], True)]
    seen = _drive(_factory("streaming").engine(3), arrivals)
    for key, chunks in enumerate(expected):
        entries = seen[key]
        assert entries[0].chunks == ()  # join only prepares: every sentence is a step's
        assert [len(e.chunks) for e in entries[1:]] == [1] * len(chunks)
        assert _same_chunks(_chunks(entries), chunks) <= AUDIO_TOLERANCE


def test_seeded_members_repeat_and_seeds_matter() -> None:
    """The same seed gives the same audio at any place in any batch, within the tolerance
    (float32 sums over other GEMM tiles); another seed gives other audio."""
    same = [Member(0, REQUESTS[0], False), Member(1, REQUESTS[0], False)]
    other = PiperRequest("Good morning.", seed=5)
    seen = _drive(_factory().engine(3), {0: [Member(2, other, False), *same]})
    a, b, c = (_result(seen[k]) for k in range(3))
    assert _same_result(a, b) <= AUDIO_TOLERANCE
    assert _same_result(a, _expected()[0]) <= AUDIO_TOLERANCE
    assert a.audio.shape != c.audio.shape or float(np.max(np.abs(a.audio - c.audio))) > 0.1


def test_empty_text_is_done_at_join_and_keys_are_reused() -> None:
    engine = _factory().engine(2)
    (run,) = engine.join([Member(0, PiperRequest(""), False)])
    assert run.done and _result([run]).audio.size == 0
    (stream,) = engine.join([Member(1, PiperRequest("  "), True)])
    assert stream.done and stream.chunks == ()
    seen = _drive(engine, {0: [Member(0, REQUESTS[2], False)]})  # key 0 again
    assert _same_result(_result(seen[0]), _expected()[2]) <= AUDIO_TOLERANCE
    engine.close()
    (closed,) = engine.join([Member(0, REQUESTS[2], False)])
    assert isinstance(closed.error, RuntimeError)


def test_other_backends_decode_members_one_after_another() -> None:
    """Without the numpy fast paths (here XpBackend on numpy) a step still batches its
    members' sentences, decoding them one by one: the session's audio, bit for bit."""
    from backends.xp_backend import XpBackend

    model = PiperModel(backend=XpBackend(np), weights=_model().weights, config=_model().config)
    factory = PiperFactory(model)
    requests = [PiperRequest("Yes.", seed=2), PiperRequest("No.", seed=3)]
    seen = _drive(factory.engine(2), {0: [Member(i, r, False) for i, r in enumerate(requests)]})
    session = factory.create()
    for key, request in enumerate(requests):
        assert _result(seen[key]).audio.tobytes() == session.run(request).audio.tobytes()


@contextlib.contextmanager
def _cores(n: int) -> Iterator[None]:
    """The numpy backend's share of the cores at ``n`` (as the server's adaptive threads
    set it), the BLAS's own count restored afterwards."""
    with threadpool_limits(limits=1, user_api="blas"):
        parallel.SHARE.set_threads(n)
        try:
            yield
        finally:
            parallel.SHARE.set_threads(None)


@pytest.mark.parametrize("cores", [2, 3])
def test_a_wave_dealt_over_the_cores_equals_the_session(cores: int) -> None:
    """With several cores each step's members go into one group a core (encoders and a
    packed batch each): every member's result is still the session's within the tolerance,
    a failing member's error its own."""
    limited = PiperRequest(THREE, seed=3, max_seconds=1.0)
    members = [Member(k, r, False) for k, r in enumerate(REQUESTS)]
    members.append(Member(len(REQUESTS), limited, False))
    used: list[list[list[int]]] = []
    pieces: list[bool] = []
    deal, group = piper_model.core_groups, PiperModel._synthesize_group

    def spy(sizes: Sequence[int], n: int) -> list[list[int]]:
        used.append(deal(sizes, n))
        return used[-1]

    def in_piece(self: PiperModel, *args: Any) -> None:
        pieces.append(parallel.SHARE.in_piece())
        group(self, *args)

    with _cores(cores), pytest.MonkeyPatch.context() as mp:
        mp.setattr(piper_model, "core_groups", spy)
        mp.setattr(PiperModel, "_synthesize_group", in_piece)
        seen = _drive(_factory().engine(len(members)), {0: members})
    assert len(used[0]) == cores  # the first step's six members on every core
    assert pieces[:cores] == [True] * cores  # each group a piece of a split over the cores
    for key, expected in enumerate(_expected()):
        assert _same_result(_result(seen[key]), expected) <= AUDIO_TOLERANCE
    assert isinstance(seen[len(REQUESTS)][-1].error, AudioLimitError)


def test_core_groups_balance_phonemes_and_keep_the_order() -> None:
    deal = piper_model.core_groups
    assert deal([10, 50, 20, 30, 40], 2) == [[0, 1, 2], [3, 4]]  # 50+20+10 and 40+30
    assert deal([5, 5, 5], 2) == [[0, 2], [1]]  # ties to the lower index
    assert deal([7, 3], 4) == [[0], [1]]  # never more groups than items
    assert deal([7, 3, 1], 1) == [[0, 1, 2]]
    assert deal([], 2) == []
    sizes = [13, 2, 40, 40, 7, 21, 9, 33]
    groups = deal(sizes, 3)
    assert sorted(i for g in groups for i in g) == list(range(len(sizes)))
    assert all(g == sorted(g) for g in groups)
    totals = sorted(sum(sizes[i] for i in g) for g in groups)
    assert totals[-1] - totals[0] <= max(sizes)  # LPT: within one item of each other


def test_items_sharing_one_rng_stay_in_order_on_one_core() -> None:
    """Noise is drawn from an item's RNG: items that share one are synthesized in order (one
    group), so a batch of them equals the items one after another from that RNG."""
    model = _model()
    ids = [
        np.asarray(phoneme_ids(phonemize(t, model.config)[0], model.config), dtype=np.int64)
        for t in ("Yes.", "No, thanks.")
    ]

    def items(rng: np.random.Generator) -> list[piper_model.SynthesisInput]:
        return [piper_model.SynthesisInput(i, 0.667, 1.0, 0.8, rng) for i in ids * 2]

    with _cores(2):
        batch = model.synthesize_batch(items(np.random.default_rng(7)))
    rng = np.random.default_rng(7)
    with threadpool_limits(limits=1, user_api="blas"):
        alone = [model.synthesize_ids(i, 0.667, 1.0, 0.8, rng) for i in ids * 2]
    for got, want in zip(batch, alone, strict=True):
        assert isinstance(got, piper_model.Synthesis)
        assert np.array_equal(got.durations, want.durations)
        assert float(np.max(np.abs(got.audio - want.audio))) <= AUDIO_TOLERANCE
