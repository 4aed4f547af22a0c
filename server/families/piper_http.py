"""piper's HTTP adapter: a speech request's fields in, PiperRequest; audio out as JSON."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs
import numpy as np

from server.audio import b64encode, pcm16, wav_bytes
from server.families.base import SpeechLimits, default_voice_aliases
from server.families.http import SEED_MAX, SPEECH_RANGES, require, speech_seconds
from server.http.body import integer, number
from server.http.errors import bad, show


@attrs.frozen
class TtsAdapter:
    """piper: text in, 22.05 kHz audio out. Streaming needs mode=streaming; batches mode=offline.

    ``known_voices`` are the entry's voices (the first is the default).
    """

    known_voices: tuple[str, ...]
    task = "tts"

    def check(self, spec_id: str, mode: str, what: str) -> None:
        if what == "stream":
            require(spec_id, mode, "streamed responses", ("streaming",))
        elif what == "batch":
            require(spec_id, mode, "native batches", ("offline",))

    def voices(self) -> list[str]:
        return list(self.known_voices)

    def aliases(self, spec_extra: Mapping[str, Any] | None = None) -> dict[str, str]:
        """A model's voice aliases (its spec's ``voice_aliases``, else the default table)."""
        table = (spec_extra or {}).get("voice_aliases")
        return dict(table) if table is not None else default_voice_aliases(self.known_voices)

    def voice(self, given: Any, aliases: Mapping[str, str]) -> str:
        """The voice a request names: a voice, an alias of one, or OpenAI's ``{"id": name}``."""
        name = given.get("id") if isinstance(given, Mapping) else given
        if isinstance(name, str):
            if name in self.known_voices:
                return name
            if name in aliases:
                return aliases[name]
        raise bad(
            f"unknown voice {show(given)}; available: {', '.join(self.known_voices)}"
            f" (or an alias: {', '.join(sorted(aliases)) or 'none'})"
        )

    def request(
        self,
        body: Mapping[str, Any],
        defaults: Mapping[str, str],
        config: SpeechLimits,
        aliases: Mapping[str, str] | None = None,
    ) -> Any:
        """The PiperRequest of a body (``input`` or ``text``), with the config's audio limits.

        ``voice`` may be a voice or an alias (``aliases``, else the default table).
        """
        from backends.piper import PiperRequest

        merged: dict[str, Any] = {**defaults, **{k: v for k, v in body.items() if v is not None}}
        text = merged.get("input", merged.get("text"))
        if text is None:
            raise bad("'input' is required (non-empty text to speak; 'text' is accepted too)")
        if not isinstance(text, str):
            raise bad(f"'input' must be a string (the text to speak), not {type(text).__name__}")
        if not text.strip():
            raise bad("'input' must be non-empty text to speak (it is empty or only whitespace)")
        if "\0" in text:  # espeak takes C strings
            raise bad("'input' must not contain NUL characters")
        if len(text) > config.max_input_chars:
            raise bad(
                "'input' is too long "
                f"(at most {config.max_input_chars} characters: max_input_chars)"
            )
        if merged.get("voice") is not None:  # one voice: it is checked, not passed on
            self.voice(merged["voice"], self.aliases() if aliases is None else aliases)
        speed = number(merged, "speed", *SPEECH_RANGES["speed"])
        if speed is None:
            speed = number(merged, "speaking_rate", *SPEECH_RANGES["speaking_rate"])
        length_scale = number(merged, "length_scale", *SPEECH_RANGES["length_scale"])
        if speed is not None:
            length_scale = (length_scale or 1.0) / speed
        return PiperRequest(
            text=text,
            noise_scale=number(merged, "noise_scale", *SPEECH_RANGES["noise_scale"]),
            length_scale=length_scale,
            noise_w=number(merged, "noise_w", *SPEECH_RANGES["noise_w"]),
            seed=integer(merged, "seed", 0, SEED_MAX),
            max_seconds=speech_seconds(config, len(text)),
            max_sentence_seconds=config.max_sentence_seconds,
        )

    @staticmethod
    def audio(result: Any) -> tuple[np.ndarray, int]:
        return result.audio, int(result.sample_rate)

    def json(self, result: Any) -> dict[str, Any]:
        audio, rate = self.audio(result)
        return {
            "audio": b64encode(wav_bytes(audio, rate)),
            "sample_rate": rate,
            "channels": 1,
            "format": "wav",
        }

    def chunk_json(self, chunk: Any) -> dict[str, Any]:
        return {
            "audio": b64encode(pcm16(chunk.audio)),
            "sample_rate": int(chunk.sample_rate),
            "index": int(chunk.index),
        }

    def duration(self, result: Any) -> float:
        audio, rate = self.audio(result)
        return audio.size / rate
