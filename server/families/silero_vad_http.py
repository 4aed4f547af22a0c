"""silero_vad's HTTP adapter: VAD options and audio in, VadRequest; segments out."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from server.families.http import VAD_OPEN, VAD_RANGES, ServesEveryMode
from server.http.body import number
from server.http.errors import bad


class VadAdapter(ServesEveryMode):
    """silero_vad: 16 kHz audio in, speech segments and probabilities out.

    Every mode streams and batches.
    """

    task = "vad"
    sample_rate = 16000

    def voices(self) -> list[str]:
        return []

    def check_fields(self, body: Mapping[str, Any]) -> dict[str, float]:
        """The given VAD options, each in its range (400 otherwise), before any audio is decoded."""
        return {
            key: value
            for key, (lo, hi) in VAD_RANGES.items()
            if (value := number(body, key, lo, hi, is_open=key in VAD_OPEN)) is not None
        }

    def request(self, body: Mapping[str, Any], audio: np.ndarray) -> Any:
        from backends.silero_vad import VadOptions, VadRequest

        try:  # the ranges above are silero's own; its check stays the last word
            return VadRequest(audio=audio, options=VadOptions(**self.check_fields(body)))
        except (TypeError, ValueError) as exc:
            raise bad(str(exc)) from exc

    def json(self, result: Any, probabilities: bool = False) -> dict[str, Any]:
        out: dict[str, Any] = {
            "segments": [
                {
                    "start": round(s.start_s, 4),
                    "end": round(s.end_s, 4),
                    "start_sample": s.start,
                    "end_sample": s.end,
                }
                for s in result.segments
            ],
            "sample_rate": int(result.sample_rate),
            "duration": round(float(result.duration_s), 4),
        }
        if probabilities:
            out["probabilities"] = [round(float(p), 6) for p in result.probabilities]
        return out

    def live_json(self, request: Any, probabilities: np.ndarray, samples: int) -> dict[str, Any]:
        """What the offline route answers for a live stream's audio: its segments from the
        chunks' ``probabilities`` over the ``samples`` received, under ``request``'s options."""
        from backends.silero_vad.segments import speech_segments
        from backends.silero_vad.types import VadResult

        segments = speech_segments(probabilities, samples, request.options)
        return self.json(VadResult(probabilities, segments, samples))

    def chunk_json(self, chunk: Any) -> dict[str, Any]:
        return {
            "index": int(chunk.index),
            "start_sample": int(chunk.start),
            "probability": round(float(chunk.probability), 6),
            "events": [
                {"type": e.kind, "sample": int(e.sample), "time": round(e.seconds, 4)}
                for e in chunk.events
            ],
        }

    @staticmethod
    def duration(result: Any) -> float:
        return float(result.duration_s)
