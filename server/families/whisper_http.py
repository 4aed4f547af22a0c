"""whisper's HTTP adapter: a transcription's fields and audio in, WhisperRequest; text out."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from server.families.http import (
    LANGUAGES,
    MAX_GRANULARITIES,
    MAX_PROMPT_CHARS,
    SEED_MAX,
    TEMPERATURE_RANGE,
    TIMESTAMP_GRANULARITIES,
    ServesEveryMode,
)
from server.http.body import boolean, integer, number
from server.http.errors import bad, show


class AsrAdapter(ServesEveryMode):
    """whisper: 16 kHz audio in, text and segments out (every mode streams and batches)."""

    task = "asr"
    sample_rate = 16000

    def voices(self) -> list[str]:
        return []

    def check_fields(self, body: Mapping[str, Any]) -> None:
        """400 for a bad field, before any audio is decoded."""
        language = body.get("language")
        if language not in (None, "") and (
            not isinstance(language, str) or language not in LANGUAGES
        ):
            raise bad(
                f"language {show(language)} is not supported: this model is English-only (tiny.en)"
            )
        prompt = body.get("prompt", body.get("text"))
        if prompt is not None and (not isinstance(prompt, str) or len(prompt) > MAX_PROMPT_CHARS):
            raise bad(f"'prompt' must be a string of at most {MAX_PROMPT_CHARS} characters")
        number(body, "temperature", *TEMPERATURE_RANGE)
        integer(body, "seed", 0, SEED_MAX)
        self.granularities(body)
        boolean(body, "vad_chunking")

    @staticmethod
    def granularities(body: Mapping[str, Any]) -> tuple[str, ...]:
        """``timestamp_granularities`` (a JSON list or one string; a repeated multipart
        ``timestamp_granularities[]``), each ``segment`` or ``word``; 400 otherwise."""
        found: list[str] = []
        for key in ("timestamp_granularities", "timestamp_granularities[]"):
            value = body.get(key)
            if value is None:
                continue
            items = [value] if isinstance(value, str) else value
            if (
                not isinstance(items, list)
                or len(items) > MAX_GRANULARITIES
                or not all(isinstance(v, str) and v in TIMESTAMP_GRANULARITIES for v in items)
            ):
                raise bad(
                    f"'timestamp_granularities' must be a list of at most {MAX_GRANULARITIES}"
                    f" of: {', '.join(TIMESTAMP_GRANULARITIES)}; got {show(value)}"
                )
            found.extend(items)
        return tuple(dict.fromkeys(found))

    def request(self, body: Mapping[str, Any], audio: np.ndarray) -> Any:
        """The WhisperRequest: ``prompt`` is the initial prompt, ``temperature`` the first of the
        fallback temperatures (0, or absent: 0.0 to 1.0 in steps of 0.2), ``seed`` seeds sampling,
        ``word`` in ``timestamp_granularities`` asks for word timestamps, ``vad_chunking`` cuts
        the audio at silences into pieces of at most 30 s decoded as one batch."""
        from backends.whisper import WhisperRequest, temperature_ladder

        self.check_fields(body)
        prompt = body.get("prompt", body.get("text"))
        temperature = number(body, "temperature", *TEMPERATURE_RANGE)
        seed = integer(body, "seed", 0, SEED_MAX)
        return WhisperRequest(
            audio=audio,
            initial_prompt=prompt or None,
            temperature=temperature_ladder(temperature or 0.0),
            seed=0 if seed is None else seed,
            word_timestamps="word" in self.granularities(body),
            vad_chunking=boolean(body, "vad_chunking"),
        )

    @staticmethod
    def segment_json(seg: Any) -> dict[str, Any]:
        """A segment in OpenAI's shape (less ``id``, its place in the result: :meth:`json`) and
        voxpool's sample offsets: ``seek`` is its 30 s window's start in 10 ms mel frames,
        ``tokens`` its token ids (timestamp tokens included), as Whisper defines them."""
        return {
            "seek": int(seg.seek),
            "start": round(float(seg.start), 3),
            "end": round(float(seg.end), 3),
            "text": seg.text,
            "tokens": [int(t) for t in seg.tokens],
            "start_sample": round(seg.start * 16000),
            "end_sample": round(seg.end * 16000),
            "avg_logprob": float(seg.avg_logprob),
            "no_speech_prob": float(seg.no_speech_prob),
            "temperature": float(seg.temperature),
            "compression_ratio": float(seg.compression_ratio),
        }

    @staticmethod
    def word_json(word: Any) -> dict[str, Any]:
        """OpenAI's word shape: the word without its leading space, start and end in seconds."""
        return {
            "word": word.word.strip(),
            "start": round(float(word.start), 3),
            "end": round(float(word.end), 3),
        }

    def json(self, result: Any) -> dict[str, Any]:
        out = {
            "text": result.text,
            "language": "en",
            "duration": round(float(result.duration), 3),
            "segments": [{"id": i, **self.segment_json(s)} for i, s in enumerate(result.segments)],
        }
        if any(s.words is not None for s in result.segments):
            out["words"] = [self.word_json(w) for s in result.segments for w in s.words or ()]
        return out

    def chunk_json(self, seg: Any) -> dict[str, Any]:
        out = self.segment_json(seg)
        if seg.words is not None:
            out["words"] = [
                {**self.word_json(w), "probability": float(w.probability)} for w in seg.words
            ]
        return out

    @staticmethod
    def duration(result: Any) -> float:
        return float(result.duration)
