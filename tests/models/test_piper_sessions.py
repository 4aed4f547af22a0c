"""Piper sessions: the pool protocol, seeded determinism across sessions, modes, streaming."""

from __future__ import annotations

import functools
import io
import wave
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from backends.piper import (
    PiperFactory,
    PiperModel,
    PiperRequest,
    PiperResult,
    load_factory,
    load_model,
)
from backends.piper.session import PiperSession
from core.pool import MAX_PARALLEL_SESSIONS, Interface, Session, SessionFactory

TWO = "Hello there. How are you?"
ONE = "Good morning."


pytestmark = pytest.mark.usefixtures("one_blas_thread")


@functools.cache
def _model() -> PiperModel:
    return load_model()


def _factory(mode: str = "offline") -> PiperFactory:
    return PiperFactory(_model(), mode=mode)


def _bytes(result: PiperResult) -> bytes:
    return result.audio.tobytes()


def test_factory_and_sessions_follow_the_pool_protocol() -> None:
    for mode, interfaces in (
        ("offline", {Interface.OFFLINE, Interface.BATCH}),
        ("streaming", {Interface.OFFLINE, Interface.STREAMING}),
    ):
        factory = _factory(mode)
        assert isinstance(factory, SessionFactory)
        assert (factory.family, factory.task, factory.mode) == ("piper", "tts", mode)
        assert factory.capacity() == MAX_PARALLEL_SESSIONS == 16
        primary = factory.create()
        clone = factory.clone(primary)
        for session in (primary, clone):
            assert isinstance(session, Session)
            assert (session.family, session.task, session.mode) == ("piper", "tts", mode)
            assert session.interfaces == frozenset(interfaces)
        assert clone.model is primary.model
    with pytest.raises(ValueError, match="mode"):
        PiperFactory(_model(), mode="live")
    with pytest.raises(ValueError, match="not a session of this Piper factory"):
        _factory().clone(PiperSession(load_model(), "offline"))


def test_seeded_requests_are_byte_identical_cold_and_warm_on_every_session() -> None:
    factory = _factory()
    primary = factory.create()
    request = PiperRequest(ONE, seed=1234)
    cold = primary.run(request)
    assert cold.sample_rate == 22050 and cold.audio.dtype == np.float32
    assert 0.3 < cold.duration_s < 3.0
    primary.run(PiperRequest(TWO, seed=99))  # warm it with something else
    clone = factory.clone(primary)
    assert _bytes(primary.run(request)) == _bytes(cold)  # warm primary
    assert _bytes(clone.run(request)) == _bytes(cold)  # cold clone
    fresh = load_factory().create()  # another load of the weights, cold
    assert _bytes(fresh.run(request)) == _bytes(cold)
    assert cold.wav_bytes() == clone.run(request).wav_bytes()


def test_unseeded_requests_repeat_and_seeds_matter() -> None:
    session = _factory().create()
    a = session.run(PiperRequest(ONE))
    b = _factory().create().run(PiperRequest(ONE))
    assert _bytes(a) == _bytes(b)
    c = session.run(PiperRequest(ONE, seed=5))
    assert _bytes(c) != _bytes(a)


def test_concurrent_sessions_match_serial_results() -> None:
    factory = _factory()
    primary = factory.create()
    sessions = [primary] + [factory.clone(primary) for _ in range(3)]
    requests = [
        PiperRequest(ONE, seed=1),
        PiperRequest(ONE, seed=2),
        PiperRequest("Yes.", seed=3),
        PiperRequest(ONE, seed=1),
    ]
    serial = [_bytes(primary.run(r)) for r in requests]

    def run(pair: tuple[PiperSession, PiperRequest]) -> bytes:
        return _bytes(pair[0].run(pair[1]))

    with ThreadPoolExecutor(max_workers=4) as pool:
        parallel = list(pool.map(run, zip(sessions, requests, strict=True)))
    assert parallel == serial
    assert serial[0] == serial[3] and serial[0] != serial[1]


def test_stream_yields_one_chunk_per_sentence_and_concatenates_to_run() -> None:
    factory = _factory("streaming")
    session = factory.create()
    request = PiperRequest(TWO, seed=3)
    chunks = list(session.stream(request))
    assert [c.index for c in chunks] == [0, 1]
    assert all(c.phoneme_ids[0] == 1 and c.phoneme_ids[-1] == 2 for c in chunks)
    whole = factory.clone(session).run(request)
    assert b"".join(c.audio.tobytes() for c in chunks) == _bytes(whole)
    assert [c.phoneme_ids for c in whole.chunks] == [c.phoneme_ids for c in chunks]
    # a stream abandoned half-way leaves nothing behind
    partial = session.stream(request)
    next(partial)
    session.reset()
    assert _bytes(session.run(request)) == _bytes(whole)


def test_a_run_over_its_limit_fails_before_any_sentence_is_decoded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``run`` plans every sentence's latent first: the request's frame total is known before
    any flow or vocoder runs, so a request over its speech limit fails without decoding;
    one within it decodes each sentence once, after all are planned."""
    from backends.piper.api import AudioLimitError

    calls: list[str] = []
    latent, decode_one = PiperModel.latent, PiperModel.decode_one

    def planned(self: PiperModel, *args: object) -> object:
        calls.append("latent")
        return latent(self, *args)  # type: ignore[arg-type]

    def decoded(self: PiperModel, *args: object) -> object:
        calls.append("decode")
        return decode_one(self, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(PiperModel, "latent", planned)
    monkeypatch.setattr(PiperModel, "decode_one", decoded)
    session = _factory().create()
    whole = session.run(PiperRequest(TWO, seed=3))
    assert calls == ["latent", "latent", "decode", "decode"]
    first = whole.chunks[0].audio.size / whole.sample_rate
    calls.clear()
    with pytest.raises(AudioLimitError) as raised:
        session.run(PiperRequest(TWO, seed=3, max_seconds=first + 0.05))
    assert raised.value.limit == "request"
    assert calls == ["latent", "latent"], "nothing decoded for a request over its limit"


def test_batch_gives_each_request_its_own_run_result() -> None:
    session = _factory().create()
    requests = [PiperRequest(ONE, seed=1), PiperRequest("Yes.", seed=2, length_scale=1.2)]
    batched = session.batch(requests)
    assert [_bytes(r) for r in batched] == [_bytes(session.run(r)) for r in requests]
    assert session.batch([]) == []


def test_modes_reject_what_they_do_not_serve() -> None:
    with pytest.raises(ValueError, match="does not support stream"):
        _factory("offline").create().stream(PiperRequest(ONE))
    with pytest.raises(ValueError, match="does not support batch"):
        _factory("streaming").create().batch([PiperRequest(ONE)])
    session = _factory().create()
    with pytest.raises(ValueError, match="single speaker"):
        session.run(PiperRequest(ONE, speaker=1))
    with pytest.raises(ValueError):
        PiperRequest(ONE, noise_scale=-1.0)
    session.close()
    with pytest.raises(ValueError, match="closed"):
        session.run(PiperRequest(ONE))


def test_output_stage_matches_piper_and_wav_is_valid() -> None:
    session = _factory().create()
    raw = session.run(PiperRequest(ONE, normalize_audio=False))
    norm = session.run(PiperRequest(ONE))
    assert float(np.max(np.abs(norm.audio))) == pytest.approx(1.0)
    np.testing.assert_allclose(norm.audio, raw.audio / np.max(np.abs(raw.audio)), atol=1e-6)
    quiet = session.run(PiperRequest(ONE, volume=0.5))
    np.testing.assert_allclose(quiet.audio, norm.audio * 0.5, atol=1e-6)
    assert session.run(PiperRequest("")).audio.size == 0
    with wave.open(io.BytesIO(norm.wav_bytes())) as wav:
        assert (wav.getnchannels(), wav.getsampwidth(), wav.getframerate()) == (1, 2, 22050)
        pcm = np.frombuffer(wav.readframes(wav.getnframes()), dtype="<i2")
    np.testing.assert_array_equal(pcm, np.clip(norm.audio * 32767, -32767, 32767).astype(np.int16))
