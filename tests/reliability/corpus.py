"""The malformed-input corpus: every route, every kind of bad request, and the 4xx each must get.

Each :class:`Case` is one request (as ``httpx`` keyword arguments) with the one
status it must get and, where it matters, a piece of the message. Issue #11
section 3's cases are all here: deep nesting, integers past 4,300 digits,
400-digit numbers in float fields, digit look-alikes in integer fields (JSON
and form), a NUL byte in a local path; plus wrong methods (405 with ``Allow``),
unknown routes, bad tokens, broken WAV files, the speech limits and the body
limit.
"""

from __future__ import annotations

import json
from typing import Any

import attrs

from tests.reliability.cases import HELLO_PATH, Limits, fmt, noise_wav, riff
from tests.server.live import AUTH, DATA, b64

JSON = {"content-type": "application/json"}
MANAGEMENT = (
    "/v1/models/load",
    "/v1/models/unload",
    "/v1/tasks/unload_models",
    "/v1/tasks/unload_all_models",
)
JSON_ROUTES = (
    "/v1/audio/speech",
    "/v1/audio/transcriptions",
    "/v1/audio/vad",
    "/v1/tasks/run",
    "/v1/tasks/batch",
    "/v1/tasks/stream",
    "/v1/models/load",
    "/v1/models/unload",
    "/v1/tasks/unload_models",
)
LIVE = "/v1/audio/vad/live"
"""The live VAD WebSocket (a plain GET of it is a 426; its handshakes are cases below)."""
PAGE = ("/", "/page/app.js", "/page/style.css")
"""The web page and its assets (server/http/app.py ``PAGE_FILES``)."""
ROUTES = {
    **{path: "GET" for path in PAGE},
    "/health": "GET",
    "/v1/models": "GET",
    "/v1/models/{id}": "GET",
    "/metrics": "GET",
    "/openapi.json": "GET",
    "/v1/audio/voices": "GET",
    LIVE: "GET",
    **{path: "POST" for path in (*JSON_ROUTES, "/v1/tasks/unload_all_models")},
}
SPEECH = {"model": "piper", "input": "Hi."}
SENTENCE = "The quick brown fox jumps over the lazy dog near the river."
"""About 3.4 s of speech: one sentence under the suite's 4 s sentence limit."""


@attrs.frozen
class Case:
    name: str
    method: str
    path: str
    status: int
    request: dict[str, Any] = attrs.field(factory=dict)
    contains: str = ""


def raw(name: str, path: str, body: bytes | str, status: int = 400, contains: str = "") -> Case:
    content = body.encode() if isinstance(body, str) else body
    headers = {**JSON, **(AUTH if path in MANAGEMENT else {})}
    return Case(name, "POST", path, status, {"content": content, "headers": headers}, contains)


def post(name: str, path: str, body: Any, status: int = 400, contains: str = "") -> Case:
    return raw(name, path, json.dumps(body), status, contains)


def form(
    name: str,
    path: str,
    fields: dict[str, str],
    status: int = 400,
    contains: str = "",
    *,
    file: tuple[str, bytes] | None,
) -> Case:
    part = (
        ("file", file[0], file[1], "audio/wav")
        if file is not None
        else ("other", "x.txt", b"1", "text/plain")
    )
    request: dict[str, Any] = {"data": fields, "files": {part[0]: part[1:]}}
    return Case(name, "POST", path, status, request, contains)


def bad_bodies() -> list[tuple[str, bytes]]:
    """Bodies no JSON route accepts, issue #11 section 3's parse failures among them."""
    return [
        ("empty", b""),
        ("truncated", b'{"model": "piper"'),
        ("array", b"[]"),
        ("null", b"null"),
        ("number", b"1"),
        ("string", b'"text"'),
        ("deep-arrays", b"[" * 100_000 + b"]" * 100_000),
        ("deep-objects", b'{"a":' * 50_000 + b"1" + b"}" * 50_000),
        ("nested-5000", b'{"model": ' + b"[" * 5000 + b"]" * 5000 + b"}"),
        ("int-5000-digits", b'{"model": 1' + b"0" * 5000 + b"}"),
        ("nan", b'{"model": "piper", "input": "Hi.", "speed": NaN}'),
        ("infinity", b'{"model": "piper", "input": "Hi.", "speed": -Infinity}'),
        ("invalid-utf8", b'{"model": "\xff\xfe"}'),
        ("lone-surrogate", b'{"model": "\\ud800", "input": "x"}'),
        ("trailing-garbage", b'{"model": "piper"} x'),
        ("single-quotes", b"{'model': 'piper'}"),
        ("too-many-values", b"[" + b"0," * 1_000_001 + b"0]"),
    ]


NUMBER_LITERALS = {
    "true": "true",
    "false": "false",
    "superscript-two": '"\u00b2"',
    "double-minus": '"--5"',
    "string-1e999": '"1e999"',
    "string-nan": '"nan"',
    "string-NaN": '"NaN"',
    "string-Infinity": '"Infinity"',
    "arabic-digits": '"\u0661\u0662"',
    "fullwidth-digit": '"\uff11"',
    "leading-space": '" 5"',
    "hex": '"0x10"',
    "underscore": '"1_0"',
    "array": "[]",
    "object": "{}",
    "empty-string": '""',
    "1e400": "1e400",
    "-1e400": "-1e400",
    "400-digits": "1" + "0" * 400,
    "-400-digits": "-1" + "0" * 400,
    "million": "1000000",
    "minus-one": "-1",
    "fraction": "1.5",
    "2**64": str(2**64),
}
SPEECH_NUMBERS = {
    "speed": (0.25, 4.0, False),
    "speaking_rate": (0.25, 4.0, False),
    "length_scale": (0.1, 10.0, False),
    "noise_scale": (0.0, 2.0, False),
    "noise_w": (0.0, 2.0, False),
    "seed": (0, 2**64 - 1, True),
    "busy_timeout_ms": (0, 2**53 - 1, True),
}
BAD_BOOLEANS: dict[str, Any] = {
    "string-maybe": "maybe",
    "string-yes": "yes",
    "number-2": 2,
    "number-1": 1,
    "array": [True],
    "object": {"on": True},
    "empty-string": "",
}
"""JSON values a boolean field refuses (JSON true/false, or "true"/"1"/"false"/"0"... only)."""
VAD_NUMBERS = {
    "threshold": (0.0, 1.0, False),
    "min_speech_duration_ms": (0.0, 3_600_000.0, False),
    "min_silence_duration_ms": (0.0, 3_600_000.0, False),
    "speech_pad_ms": (0.0, 3_600_000.0, False),
}


def accepted(literal: str, lo: float, hi: float, integral: bool) -> bool:
    """Whether the server accepts ``literal`` for a field of this range (then it is no bad case)."""
    value = json.loads(literal)
    if isinstance(value, str | bool) or not isinstance(value, int | float):
        return False
    if value != value or value in (float("inf"), float("-inf")):
        return False
    if integral and isinstance(value, float) and not value.is_integer():
        return False
    return bool(lo <= value <= hi)


def number_cases() -> list[Case]:
    out = []
    for key, (lo, hi, integral) in SPEECH_NUMBERS.items():
        for name, literal in NUMBER_LITERALS.items():
            if not accepted(literal, lo, hi, integral):
                body = f'{{"model": "piper", "input": "Hi.", "{key}": {literal}}}'
                out.append(
                    raw(f"speech-{key}-{name}", "/v1/audio/speech", body, contains=f"'{key}'")
                )
    for key, (lo, hi, integral) in VAD_NUMBERS.items():
        for name in (
            "true",
            "superscript-two",
            "string-nan",
            "1e400",
            "400-digits",
            "minus-one",
            "double-minus",
        ):
            literal = NUMBER_LITERALS[name]
            if not accepted(literal, lo, hi, integral):
                body = (
                    f'{{"model": "silero_vad", "audio_path": "{HELLO_PATH}", "{key}": {literal}}}'
                )
                out.append(raw(f"vad-{key}-{name}", "/v1/audio/vad", body, contains=f"'{key}'"))
    for literal in ("0", "1", "0.0", "1.0"):  # silero's threshold is open at both ends
        body = f'{{"model": "silero_vad", "audio_path": "{HELLO_PATH}", "threshold": {literal}}}'
        out.append(raw(f"vad-threshold-{literal}", "/v1/audio/vad", body, contains="'threshold'"))
    return out


def form_cases(hello: bytes, limits: Limits) -> list[Case]:
    """Multipart fields are strings: the same validators, the same 400s."""
    out = []
    bad_ints = {
        "double-minus": "--5",
        "superscript-two": "\u00b2",
        "5000-digits": "9" * 5000,
        "negative": "-1",
        "fraction": "1.5",
        "empty": "",
        "hex": "0x1",
        "leading-space": " 1",
        "arabic": "\u0661",
    }
    for path, model in (("/v1/audio/transcriptions", "whisper"), ("/v1/audio/vad", "silero_vad")):
        short = path.rsplit("/", 1)[1]
        for name, value in bad_ints.items():
            out.append(
                form(
                    f"form-{short}-busy_timeout_ms-{name}",
                    path,
                    {"model": model, "busy_timeout_ms": value},
                    contains="busy_timeout_ms",
                    file=("a.wav", hello),
                )
            )
        out.append(
            form(
                f"form-{short}-stream-maybe",
                path,
                {"model": model, "stream": "maybe"},
                contains="'stream'",
                file=("a.wav", hello),
            )
        )
        out.append(form(f"form-{short}-model-empty", path, {"model": ""}, file=("a.wav", hello)))
        out.append(
            form(f"form-{short}-model-unknown", path, {"model": "nope"}, 404, file=("a.wav", hello))
        )
        out.append(
            form(
                f"form-{short}-mp3",
                path,
                {"model": model},
                contains="could not be read as mp3",  # MP3 is accepted (#12); this one is broken
                file=("a.mp3", b"ID3\x03junk"),
            )
        )
        out.append(form(f"form-{short}-empty-file", path, {"model": model}, file=("a.wav", b"")))
        out.append(
            form(f"form-{short}-no-file", path, {"model": model}, contains="'file'", file=None)
        )
    for name, value in {
        "nan": "nan",
        "two": "2",
        "negative": "-0.1",
        "1e999": "1e999",
        "superscript": "\u00b2",
        "empty": "",
        "400-digits": "1" + "0" * 400,
    }.items():
        out.append(
            form(
                f"form-vad-threshold-{name}",
                "/v1/audio/vad",
                {"model": "silero_vad", "threshold": value},
                contains="threshold",
                file=("a.wav", hello),
            )
        )
    for key in ("min_speech_duration_ms", "speech_pad_ms"):
        for name, value in {"400-digits": "9" * 400, "inf": "inf", "fullwidth": "\uff11"}.items():
            out.append(
                form(
                    f"form-vad-{key}-{name}",
                    "/v1/audio/vad",
                    {"model": "silero_vad", key: value},
                    contains=key,
                    file=("a.wav", hello),
                )
            )
    out.append(
        form(
            "form-vad-include_probabilities-2",
            "/v1/audio/vad",
            {"model": "silero_vad", "include_probabilities": "2"},
            file=("a.wav", hello),
        )
    )
    asr = {"model": "whisper"}
    out.append(
        form(
            "form-asr-response_format-xml",
            "/v1/audio/transcriptions",
            {**asr, "response_format": "xml"},
            contains="xml",
            file=("a.wav", hello),
        )
    )
    out.append(
        form(
            "form-asr-language-fr",
            "/v1/audio/transcriptions",
            {**asr, "language": "fr"},
            contains="English-only",
            file=("a.wav", hello),
        )
    )
    out.append(
        form(
            "form-asr-prompt-too-long",
            "/v1/audio/transcriptions",
            {**asr, "prompt": "x" * 2001},
            contains="prompt",
            file=("a.wav", hello),
        )
    )
    for name, value in {"maybe": "maybe", "two": "2", "empty": "", "upper": "TRUE"}.items():
        out.append(
            form(
                f"form-asr-vad_chunking-{name}",
                "/v1/audio/transcriptions",
                {**asr, "vad_chunking": value},
                contains="'vad_chunking'",
                file=("a.wav", hello),
            )
        )
    multipart = {"content-type": "multipart/form-data"}
    out.append(
        Case(
            "multipart-no-boundary",
            "POST",
            "/v1/audio/vad",
            400,
            {"content": b"--x\r\n\r\n", "headers": multipart},
            "multipart",
        )
    )
    out.append(
        Case(
            "multipart-garbage",
            "POST",
            "/v1/audio/vad",
            400,
            {
                "content": b"\x00" * 100,
                "headers": {"content-type": "multipart/form-data; boundary=zz"},
            },
        )
    )
    two = [("file", ("a.wav", hello, "audio/wav")), ("file", ("b.wav", hello, "audio/wav"))]
    out.append(
        Case(
            "multipart-two-files",
            "POST",
            "/v1/audio/vad",
            400,
            {"files": two, "data": {"model": "silero_vad"}},
            "exactly one",
        )
    )
    fields = [("model", (None, b"silero_vad"))] + [(f"f{i}", (None, b"x")) for i in range(70)]
    out.append(Case("multipart-too-many-fields", "POST", "/v1/audio/vad", 400, {"files": fields}))
    out.append(
        Case(
            "multipart-field-over-1MiB",
            "POST",
            "/v1/audio/vad",
            400,
            {
                "files": {"prompt": (None, b"x" * (1024 * 1024 + 1))},
                "data": {"model": "silero_vad"},
            },
        )
    )
    del limits
    return out


def string_cases(limits: Limits) -> list[Case]:
    sp = "/v1/audio/speech"
    return [
        post("speech-model-missing", sp, {"input": "Hi."}, contains="'model' is required"),
        post("speech-model-empty", sp, {**SPEECH, "model": ""}, contains="'model'"),
        post("speech-model-number", sp, {**SPEECH, "model": 5}, contains="'model'"),
        post("speech-model-array", sp, {**SPEECH, "model": ["piper"]}, contains="'model'"),
        post("speech-model-object", sp, {**SPEECH, "model": {"id": "piper"}}, contains="'model'"),
        post("speech-model-100k-chars", sp, {**SPEECH, "model": "x" * 100_000}, 404),
        post("speech-model-unknown", sp, {**SPEECH, "model": "nope"}, 404, "nope"),
        post("speech-model-nul", sp, {**SPEECH, "model": "pi\0per"}, 404),
        post("speech-model-wrong-task", sp, {**SPEECH, "model": "whisper"}, contains="serves task"),
        post("speech-input-missing", sp, {"model": "piper"}, contains="'input'"),
        post("speech-input-empty", sp, {**SPEECH, "input": ""}, contains="'input'"),
        post("speech-input-blank", sp, {**SPEECH, "input": " \t\n"}, contains="'input'"),
        post("speech-input-number", sp, {**SPEECH, "input": 5}, contains="'input'"),
        post("speech-input-array", sp, {**SPEECH, "input": ["Hi."]}, contains="'input'"),
        post("speech-input-nul", sp, {**SPEECH, "input": "Hi.\0"}, contains="NUL"),
        post(
            "speech-input-nul-stream",
            sp,
            {**SPEECH, "input": "\0Hi.", "stream": True},
            contains="NUL",
        ),
        post(
            "batch-input-nul",
            "/v1/tasks/batch",
            {"model": "piper_batch", "requests": [{"input": "a\0"}]},
            contains="NUL",
        ),
        post(
            "speech-input-too-long",
            sp,
            {**SPEECH, "input": "a" * (limits.input_chars + 1)},
            contains="max_input_chars",
        ),
        post("speech-voice-unknown", sp, {**SPEECH, "voice": "nobody"}, contains="unknown voice"),
        post("speech-voice-number", sp, {**SPEECH, "voice": 5}, contains="unknown voice"),
        post("speech-voice-huge", sp, {**SPEECH, "voice": "v" * 100_000}, contains="unknown voice"),
        post(
            "speech-format-ogg",
            sp,
            {**SPEECH, "response_format": "ogg"},
            contains="response_format",
        ),
        post(
            "speech-format-array", sp, {**SPEECH, "response_format": []}, contains="response_format"
        ),
        post("speech-stream-maybe", sp, {**SPEECH, "stream": "maybe"}, contains="'stream'"),
        post("speech-stream-two", sp, {**SPEECH, "stream": 2}, contains="'stream'"),
        post(
            "speech-stream_format-ogg",
            sp,
            {**SPEECH, "stream_format": "ogg"},
            contains="stream_format",
        ),
        post(
            "speech-stream_format-number",
            sp,
            {**SPEECH, "stream_format": 5},
            contains="stream_format",
        ),
        post(
            "speech-stream-offline-model",
            sp,
            {**SPEECH, "model": "piper_batch", "stream": True},
            contains="offline mode",
        ),
    ]


def limit_cases(limits: Limits) -> list[Case]:
    """Issue #11 section 2: synthesis parameters bounded, audio per request capped, a 400
    saying which."""
    sp = "/v1/audio/speech"
    per_char = "speech_seconds_per_char"
    long_sentence = SENTENCE[:-1] + " and the old mill by the water."
    three = " ".join([SENTENCE] * 3)
    return [
        post(
            "limit-length_scale-1000",
            sp,
            {**SPEECH, "length_scale": 1000},
            contains="'length_scale'",
        ),
        post("limit-noise_w-100", sp, {**SPEECH, "noise_w": 100}, contains="'noise_w'"),
        post("limit-per-char", sp, {**SPEECH, "length_scale": 10}, contains=per_char),
        post(
            "limit-per-char-stream",
            sp,
            {**SPEECH, "length_scale": 10, "stream": True},
            contains=per_char,
        ),
        post(
            "limit-per-char-stream-audio",
            sp,
            {**SPEECH, "length_scale": 10, "stream_format": "audio"},
            contains=per_char,
        ),
        post(
            "limit-sentence",
            sp,
            {**SPEECH, "input": long_sentence},
            contains="max_sentence_seconds",
        ),
        post(
            "limit-sentence-stream",
            sp,
            {**SPEECH, "input": long_sentence, "stream": True},
            contains="max_sentence_seconds",
        ),
        post("limit-request", sp, {**SPEECH, "input": three}, contains="max_speech_seconds"),
        post(
            "limit-task-run",
            "/v1/tasks/run",
            {"model": "piper", "request": {"input": "Hi.", "length_scale": 10}},
            contains=per_char,
        ),
        post(
            "limit-task-stream",
            "/v1/tasks/stream",
            {"model": "piper", "request": {"input": long_sentence}},
            contains="max_sentence_seconds",
        ),
        post(
            "limit-input-chars",
            sp,
            {**SPEECH, "input": "Hi. " * limits.input_chars},
            contains="max_input_chars",
        ),
        post(
            "limit-audio-seconds",
            "/v1/audio/vad",
            {
                "model": "silero_vad",
                "audio_base64": b64(noise_wav(limits.audio_seconds + 1, 1000, 1)),
            },
            contains="max_audio_seconds",
        ),
        post(
            "limit-audio-seconds-header",
            "/v1/audio/transcriptions",
            {
                "model": "whisper",
                "audio_base64": b64(riff(fmt(rate=1000, bits=8), (b"data", b"\x80" * 200_000))),
            },
            contains="max_audio_seconds",
        ),
        post(
            "limit-batch-audio-seconds",
            "/v1/tasks/batch",
            {
                "model": "silero_vad",
                "requests": [{"audio_base64": b64(noise_wav(limits.audio_seconds * 0.6))}] * 2,
            },
            contains="for requests[1]: the entries of a batch share max_audio_seconds",
        ),
    ]


def wav_cases(hello: bytes) -> list[Case]:
    """Broken audio, sent as base64 to both audio routes."""
    nan = riff(fmt(3, bits=32), (b"data", b"\x00\x00\xc0\x7f" * 100))
    inf = riff(fmt(3, bits=64), (b"data", b"\x00" * 6 + b"\xf0\x7f" + b"\x00" * 8))
    blobs = {
        "not-riff": b"ID3\x03\x00junk" * 10,
        "riff-no-wave": b"RIFF\x10\x00\x00\x00AVI LIST",
        "truncated-header": b"RIFF\x00\x00",
        "no-fmt": riff((b"data", b"\x00" * 100)),
        "no-data": riff(fmt()),
        "short-fmt": riff((b"fmt ", b"\x01\x00\x01\x00"), (b"data", b"\x00" * 10)),
        "zero-channels": riff(fmt(channels=0), (b"data", b"\x00" * 10)),
        "17-channels": riff(fmt(channels=17), (b"data", b"\x00" * 340)),
        "rate-999": riff(fmt(rate=999), (b"data", b"\x00" * 10)),
        "rate-400000": riff(fmt(rate=400_000), (b"data", b"\x00" * 10)),
        "12-bit": riff(fmt(bits=12), (b"data", b"\x00" * 10)),
        "adpcm": riff(fmt(tag=2, bits=4), (b"data", b"\x00" * 10)),
        "float-nan": nan,
        "float64-inf": inf,
        "2000-chunks": riff(*[(b"junk", b"")] * 2000, fmt(), (b"data", b"\x00" * 10)),
        "empty-data": riff(fmt(), (b"data", b"")),
        "half-frame": riff(fmt(bits=16), (b"data", b"\x00")),
        "data-size-lies-no-fmt": b"RIFF\xff\xff\xff\xffWAVEdata\xff\xff\xff\xff" + b"\x00" * 64,
    }
    out = []
    for path, model in (("/v1/audio/transcriptions", "whisper"), ("/v1/audio/vad", "silero_vad")):
        short = path.rsplit("/", 1)[1]
        for name, blob in blobs.items():
            out.append(
                post(f"wav-{short}-{name}", path, {"model": model, "audio_base64": b64(blob)})
            )
        sources: dict[str, Any] = {
            "b64-number": {"audio_base64": 5},
            "b64-array": {"audio_base64": ["AAAA"]},
            "b64-invalid": {"audio_base64": "not base64!"},
            "b64-empty": {"audio_base64": ""},
            "no-audio": {},
            "path-nul": {"audio_path": HELLO_PATH + "\0.wav"},
            "path-outside": {"audio_path": str(DATA / "main.json")},
            "path-missing": {"audio_path": str(DATA / "audio" / "nope.wav")},
            "path-directory": {"audio_path": str(DATA / "audio")},
            "path-relative": {"audio_path": "hello.wav"},
            "path-number": {"audio_path": 5},
            "path-traversal": {
                "audio_path": str(DATA / "audio" / ".." / ".." / ".." / "pyproject.toml")
            },
            "path-long": {"audio_path": "/" + "a" * 5000},
        }
        for name, source in sources.items():
            out.append(post(f"source-{short}-{name}", path, {"model": model, **source}))
    out.append(
        post(
            "asr-language-number",
            "/v1/audio/transcriptions",
            {"model": "whisper", "audio_base64": b64(hello), "language": 7},
            contains="language",
        )
    )
    out.append(
        post(
            "asr-prompt-number",
            "/v1/audio/transcriptions",
            {"model": "whisper", "audio_base64": b64(hello), "prompt": 7},
            contains="prompt",
        )
    )
    for name, value in BAD_BOOLEANS.items():  # issue #14's option
        out.append(
            post(
                f"asr-vad_chunking-{name}",
                "/v1/audio/transcriptions",
                {"model": "whisper", "audio_base64": b64(hello), "vad_chunking": value},
                contains="'vad_chunking'",
            )
        )
    return out


def method_cases() -> list[Case]:
    out = []
    for path, allowed in ROUTES.items():
        for method in ("GET", "POST", "PUT", "DELETE", "PATCH", "OPTIONS"):
            if method != allowed:
                out.append(Case(f"method-{method}-{path}", method, path, 405, {}, "not allowed"))
    return out


def live_cases() -> list[Case]:
    """Handshakes of the live VAD WebSocket that must be refused with a 4xx before the upgrade
    (issue #14): by the listener (malformed) or by the route (what it names)."""
    key = {"Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ=="}
    upgrade = {"Upgrade": "websocket", "Connection": "Upgrade", "Sec-WebSocket-Version": "13"}

    def live(name: str, status: int, headers: dict[str, str], contains: str, **params: str) -> Case:
        request = {"headers": headers, "params": params}
        return Case(f"live-{name}", "GET", LIVE, status, request, contains)

    return [
        live("plain-get", 426, {}, "WebSocket", model="silero_vad"),
        live("no-key", 400, upgrade, "Sec-WebSocket-Key", model="silero_vad"),
        live("version", 426, {**upgrade, **key, "Sec-WebSocket-Version": "8"}, "Version"),
        live("unknown-model", 404, {**upgrade, **key}, "nope", model="nope"),
        live("wrong-task", 400, {**upgrade, **key}, "task", model="whisper"),
        live("not-batching", 400, {**upgrade, **key}, "batching", model="silero_vad"),
        live("no-model", 400, {**upgrade, **key}, "'model'", threshold="0.5"),
        live("unknown-field", 400, {**upgrade, **key}, "unknown field", model="x", stream="1"),
        live("cross-origin", 403, {**upgrade, **key, "Origin": "http://evil.example"}, "origin"),
    ]


def route_cases() -> list[Case]:
    out = [
        Case(f"unknown-route-{i}", "GET", path, 404)
        for i, path in enumerate(
            (
                "/v1/nothing",
                "/v2/audio/speech",
                "/v1/audio/speech/extra",
                "/%00",
                "/" + "a" * 5000,
                "/v1/models/piper/extra",
                "/page/missing.js",
            )
        )
    ]
    out.append(Case("model-unknown-id", "GET", "/v1/models/ghost", 404, {}, "ghost"))
    for path in ("/v1/models/load", "/v1/models/unload"):  # the management routes' own paths
        out.append(Case(f"model-get-{path}", "GET", path, 405, {}, "not allowed"))
    out.append(
        Case("voices-unknown-model", "GET", "/v1/audio/voices", 404, {"params": {"model": "nope"}})
    )
    out.append(
        Case("voices-empty-model", "GET", "/v1/audio/voices", 400, {"params": {"model": ""}})
    )
    return out


def auth_cases() -> list[Case]:
    out = []
    for path in MANAGEMENT:
        for name, header in (
            ("none", {}),
            ("wrong", {"Authorization": "Bearer wrong"}),
            ("empty", {"Authorization": "Bearer"}),
            ("basic", {"Authorization": "Basic dGVzdA=="}),
            ("latin1", {"Authorization": b"Bearer t\xe9st"}),
        ):
            out.append(
                Case(
                    f"auth-{name}-{path}",
                    "POST",
                    path,
                    403,
                    {"content": b'{"id": "piper", "model_ids": []}', "headers": {**JSON, **header}},
                    "token",
                )
            )
    return out


def management_cases() -> list[Case]:
    load, unload, bulk = "/v1/models/load", "/v1/models/unload", "/v1/tasks/unload_models"
    vad = {"id": "rel-x", "family": "silero_vad"}
    cases = [
        post("load-id-missing", load, {"family": "piper"}, contains="'id'"),
        post("load-id-empty", load, {**vad, "id": ""}, contains="'id'"),
        post("load-id-number", load, {**vad, "id": 5}, contains="'id'"),
        post("load-id-space", load, {**vad, "id": "a b"}, contains="'id'"),
        post("load-id-long", load, {**vad, "id": "x" * 200}, contains="'id'"),
        post("load-id-nul", load, {**vad, "id": "x\0"}, contains="'id'"),
        post("load-family-unknown", load, {**vad, "family": "nope"}, contains="family"),
        post("load-family-number", load, {**vad, "family": 5}, contains="family"),
        post("load-family-missing-new-id", load, {"id": "rel-new"}, contains="family"),
        post("load-mode-fast", load, {**vad, "mode": "fast"}, contains="mode"),
        post("load-task-mismatch", load, {**vad, "task": "asr"}, contains="task"),
        post(
            "load-options-bogus",
            load,
            {**vad, "load_options": {"bogus": 1}},
            contains="load_options",
        ),
        post(
            "load-options-bad-value",
            load,
            {**vad, "load_options": {"weights": "pickle"}},
            contains="load_options",
        ),
        post(
            "load-options-piper-weights",
            load,
            {**vad, "family": "piper", "load_options": {"weights": "onnx"}},
            contains="load_options",
        ),
        post(
            "load-options-not-object", load, {**vad, "load_options": "x"}, contains="load_options"
        ),
        post("load-path-nul", load, {**vad, "path": "a\0b"}, contains="path"),
        post(
            "load-whisper-path-missing",
            load,
            {"id": "rel-w", "family": "whisper", "path": "/nonexistent/model"},
            contains="does not exist",
        ),
        post("unload-id-number", unload, {"id": 5}),
        post("unload-id-empty", unload, {"id": ""}),
        post("unload-id-unknown", unload, {"id": "ghost"}, 404),
        post("unload_models-not-list", bulk, {"model_ids": "piper"}, contains="model_ids"),
        post("unload_models-numbers", bulk, {"model_ids": [1, 2]}, contains="model_ids"),
        post("unload_models-too-many", bulk, {"model_ids": ["x"] * 1025}, contains="model_ids"),
    ]
    for value in (0, 17, 1.5, "2", True, None, -1, 10**30):
        cases.append(post(f"load-slots-{value!r}", load, {**vad, "slots": value}, contains="slots"))
    return cases


def task_cases(hello: bytes, limits: Limits) -> list[Case]:
    run, batch, stream = "/v1/tasks/run", "/v1/tasks/batch", "/v1/tasks/stream"
    entry = {"audio_base64": b64(hello)}
    del limits
    return [
        post("batch-empty", batch, {"model": "silero_vad", "requests": []}, contains="requests"),
        post(
            "batch-65",
            batch,
            {"model": "silero_vad", "requests": [entry] * 65},
            contains="at most 64",
        ),
        post(
            "batch-non-object", batch, {"model": "silero_vad", "requests": [1]}, contains="object"
        ),
        post("batch-string", batch, {"model": "silero_vad", "requests": "x"}, contains="requests"),
        post("batch-missing", batch, {"model": "silero_vad"}, contains="requests"),
        post(
            "batch-streaming-piper",
            batch,
            {"model": "piper", "requests": [{"input": "Hi."}]},
            contains="batches",
        ),
        post(
            "batch-entry-bad-field",
            batch,
            {"model": "silero_vad", "requests": [{**entry, "threshold": 7}]},
            contains="threshold",
        ),
        post(
            "batch-busy-timeout-lookalike",
            batch,
            {"model": "silero_vad", "requests": [entry], "busy_timeout_ms": "\u00b2"},
            contains="busy_timeout_ms",
        ),
        post(
            "stream-format-sse",
            stream,
            {"model": "piper", "request": {"input": "Hi."}, "stream_format": "sse"},
            contains="stream_format",
        ),
        post(
            "stream-request-string",
            stream,
            {"model": "piper", "request": "Hi."},
            contains="'request'",
        ),
        post(
            "stream-offline-piper",
            stream,
            {"model": "piper_batch", "request": {"input": "Hi."}},
            contains="streamed",
        ),
        post("run-request-empty", run, {"model": "piper", "request": {}}, contains="'input'"),
        post("run-request-array", run, {"model": "piper", "request": []}, contains="'request'"),
        post("run-model-missing", run, {"request": {"input": "Hi."}}, contains="'model'"),
        post(
            "run-seed-lookalike",
            run,
            {"model": "piper", "request": {"input": "Hi.", "seed": "--5"}},
            contains="'seed'",
        ),
        post(
            "run-audio-path-nul",
            run,
            {"model": "silero_vad", "request": {"audio_path": "\0"}},
            contains="NUL",
        ),
        post(
            "run-asr-vad_chunking-yes",
            run,
            {"model": "whisper", "request": {**entry, "vad_chunking": "yes"}},
            contains="'vad_chunking'",
        ),
        post(
            "batch-asr-vad_chunking-number",
            batch,
            {"model": "whisper", "requests": [{**entry, "vad_chunking": 2}]},
            contains="'vad_chunking'",
        ),
    ]


def size_cases(limits: Limits) -> list[Case]:
    big = b'{"model": "piper", "input": "' + b"a" * (limits.body + 1) + b'"}'
    return [
        raw(f"too-large-{path}", path, big, 413, "max_request_body_bytes") for path in JSON_ROUTES
    ]


def corpus(hello: bytes, limits: Limits) -> list[Case]:
    out = [
        raw(f"body-{name}-{path}", path, body)
        for path in JSON_ROUTES
        for name, body in bad_bodies()
    ]
    out += (
        number_cases()
        + form_cases(hello, limits)
        + string_cases(limits)
        + limit_cases(limits)
        + wav_cases(hello)
    )
    out += (
        method_cases()
        + route_cases()
        + live_cases()
        + auth_cases()
        + management_cases()
        + task_cases(hello, limits)
        + size_cases(limits)
    )
    names = [c.name for c in out]
    assert len(names) == len(set(names)), sorted({n for n in names if names.count(n) > 1})
    return out
