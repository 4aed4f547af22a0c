"""The request-field validators, the guarded JSON parse and the bounded audio decode, in process."""

from __future__ import annotations

import json
import math
from typing import Any

import anyio
import numpy as np
import pytest
from starlette.requests import Request

from server import audio
from server.http import errors, routes_audio
from server.http.body import MAX_JSON_CONTAINERS, integer, number, parse_json
from server.http.errors import ApiError
from server.http.routes_audio import audio_input
from server.http.streaming import sse_error
from tests.reliability.cases import fmt, noise_wav, pcm_wav, riff


@pytest.mark.parametrize(
    "value",
    [
        True,
        False,
        "\u00b2",
        "--5",
        "\u0661",
        "\uff11",
        " 5",
        "5 ",
        "0x10",
        "1_0",
        "",
        "9" * 5000,
        1.5,
        math.inf,
        math.nan,
        -1,
        2**64,
        10**400,
        -(10**400),
        [],
        {},
        "1e3",
        "+",
    ],
)
def test_integer_rejects_what_is_not_a_plain_integer_in_range(value: Any) -> None:
    with pytest.raises(ApiError) as err:
        integer({"k": value}, "k", 0, 2**64 - 1)
    assert err.value.status == 400 and "'k' must be an integer between 0 and" in err.value.message


@pytest.mark.parametrize(
    ("value", "expected"),
    [(0, 0), (7, 7), ("7", 7), ("+7", 7), (7.0, 7), (2**64 - 1, 2**64 - 1), (None, None)],
)
def test_integer_accepts_integers_in_range(value: Any, expected: int | None) -> None:
    assert integer({"k": value}, "k", 0, 2**64 - 1) == expected


@pytest.mark.parametrize(
    "value",
    [
        True,
        "\u00b2",
        "--5",
        "nan",
        "NaN",
        "inf",
        "Infinity",
        "1e999",
        " 1",
        "1_0",
        "0x1",
        "",
        [],
        {},
        math.nan,
        math.inf,
        -math.inf,
        10**400,
        -(10**400),
        1e308,
        4.0000001,
        0.2499,
        "\u0661",
    ],
)
def test_number_rejects_non_numbers_non_finite_and_out_of_range(value: Any) -> None:
    with pytest.raises(ApiError) as err:
        number({"speed": value}, "speed", 0.25, 4.0)
    assert "'speed' must be a number between 0.25 and 4" in err.value.message


@pytest.mark.parametrize(
    ("value", "expected"),
    [(1, 1.0), ("1.5", 1.5), ("2e0", 2.0), (".5", 0.5), (4, 4.0), (0.25, 0.25)],
)
def test_number_accepts_numbers_in_range(value: Any, expected: float) -> None:
    assert number({"speed": value}, "speed", 0.25, 4.0) == expected


@pytest.mark.parametrize(
    ("value", "ok"), [(0, False), (1.0, False), ("0", False), (0.5, True), ("0.999", True)]
)
def test_an_open_range_excludes_its_ends(value: Any, ok: bool) -> None:
    if ok:
        assert number({"t": value}, "t", 0.0, 1.0, is_open=True) == float(value)
    else:
        with pytest.raises(ApiError, match="'t' must be a number > 0 and < 1"):
            number({"t": value}, "t", 0.0, 1.0, is_open=True)


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b"[" * 100_000 + b"]" * 100_000, "nests JSON too deeply"),
        (b'{"a": 1' + b"0" * 5000 + b"}", "too many digits"),
        (b'{"a": NaN}', "NaN"),
        (b'{"a": -Infinity}', "Infinity"),
        (b'{"a": "\\udc00"}', "surrogate"),
        (b'{"\\ud800": 1}', "surrogate"),
        (b"\xff{}", "UTF-8"),
        (b"{,}", "not valid JSON"),
        (b"[" + b"0," * MAX_JSON_CONTAINERS + b"0]", "JSON values"),
    ],
)
def test_parse_json_turns_every_failure_into_a_400(raw: bytes, message: str) -> None:
    with pytest.raises(ApiError) as err:
        parse_json(raw)
    assert err.value.status == 400 and message in err.value.message


def test_parse_json_keeps_valid_documents() -> None:
    doc = {
        "model": "piper",
        "input": "Gr\u00fc\u00dfe \U0001f600",
        "seed": 2**64 - 1,
        "speed": 1.5,
        "x": [[[]]],
    }
    assert parse_json(json.dumps(doc).encode()) == doc


def reference_resample(
    x: np.ndarray, src: int, dst: int, half: int = 16, beta: float = 8.0
) -> np.ndarray:
    """The single-pass polyphase resampler the blocked one replaced (same filter, same sums)."""
    g = math.gcd(src, dst)
    up, down = dst // g, src // g
    h = audio._filter(up, down, half, beta)
    taps = np.arange(-half + 1, half + 1)
    padded = np.pad(x.astype(np.float64), (half, half + 1))
    n = np.arange((len(x) * up) // down)
    idx = (n * down) // up + half
    out: np.ndarray = np.sum(
        padded[idx[:, None] + taps[None, :]] * h[(n * down) % up], axis=1
    ).astype(np.float32)
    return out


@pytest.mark.parametrize(
    ("src", "size"), [(44100, 100_003), (8000, 40_000), (1000, 5_000), (48000, 1), (22050, 70_000)]
)
def test_blocked_resampling_is_the_single_pass_result(src: int, size: int) -> None:
    x = np.random.default_rng(src).standard_normal(size).astype(np.float32) * 0.3
    assert np.array_equal(audio.resample(x, src, 16000), reference_resample(x, src, 16000))


def test_decoding_mixes_channels_and_widths_like_wave_does() -> None:
    rng = np.random.default_rng(1)
    stereo = rng.uniform(-0.9, 0.9, 2 * 9000)
    got = audio.load_for_model(pcm_wav(stereo, 16000, 2, channels=2), 16000)
    ints = (np.clip(stereo, -1, 1) * 32767).astype("<i2").astype(np.float32) / 32768.0
    assert np.array_equal(got, ints.reshape(-1, 2).mean(axis=1))


def test_duration_limit_is_checked_from_the_header_before_any_sample(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    long = riff(fmt(rate=1000, bits=8), (b"data", b"\x80" * 200_000))  # 200 s at 1 kHz

    def never(*args: Any) -> np.ndarray:
        raise AssertionError("a sample was decoded")

    monkeypatch.setattr(audio, "_frames", never)
    with pytest.raises(audio.AudioLimitError, match="max_audio_seconds") as err:
        audio.load_for_model(long, 16000, max_seconds=60)
    assert err.value.seconds == pytest.approx(200.0)


def test_decoding_runs_off_the_event_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    """The decode of an upload waits until the event loop has run another task: on the loop's
    own thread that would deadlock (caught by the hang guard), in a worker thread it cannot.
    No verdict depends on how fast the decode is."""
    import threading

    loop_ran = threading.Event()
    real = routes_audio.load_for_model

    def decode_after_the_loop_ran(
        raw: bytes, rate: int, max_seconds: float | None = None
    ) -> np.ndarray:
        assert loop_ran.wait(60.0), "the event loop was blocked while the upload was decoded"
        return real(raw, rate, max_seconds)

    monkeypatch.setattr(routes_audio, "load_for_model", decode_after_the_loop_ran)
    data = noise_wav(120, 1000, 1)

    async def main() -> np.ndarray:
        out: list[np.ndarray] = []
        async with anyio.create_task_group() as tg:

            async def decode() -> None:
                out.append(await audio_input(None, {}, data, "a.wav", 16000, 600.0))  # type: ignore[arg-type]

            tg.start_soon(decode)
            await anyio.sleep(0)  # the loop runs this task while the decode is in flight
            loop_ran.set()
        return out[0]

    result = anyio.run(main, backend="trio")
    assert result.size == 120 * 16000


def test_a_500_carries_a_request_id_and_no_internals(caplog: pytest.LogCaptureFixture) -> None:
    secret = RuntimeError("cannot open /srv/models/secret.bin")
    request = Request({"type": "http", "method": "GET", "path": "/", "headers": []})
    resp = anyio.run(errors.server_error, request, secret)
    body = json.loads(bytes(resp.body))
    request_id = body["error"]["request_id"]
    assert resp.status_code == 500 and resp.headers["x-request-id"] == request_id
    assert "secret" not in bytes(resp.body).decode() and request_id in body["error"]["message"]
    assert request_id in caplog.text and "secret.bin" in caplog.text  # the log has it, under the id
    event = sse_error(secret).decode()
    assert "secret" not in event and '"request_id"' in event
    assert "max_speech_seconds" in sse_error(ApiError(400, "over max_speech_seconds")).decode()
