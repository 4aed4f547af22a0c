"""The errors and shape limits shared by both audio decoders (:mod:`server.audio` for WAV,
:mod:`server.codecs` for everything else), so that neither imports the other's module."""

from __future__ import annotations

MAX_CHANNELS = 16
"""Most channels an input may have (a WAV or a compressed file)."""
RATES = (1000, 384000)
"""The sample rates an input may have, inclusive."""


class AudioError(ValueError):
    """Input audio that cannot be decoded or used."""


PER_REQUEST = "per request (max_audio_seconds)"
"""What bounds a request's audio, as :meth:`AudioLimitError.message` says it by default."""


class AudioLimitError(AudioError):
    """Audio longer than the request may give (``max_audio_seconds``)."""

    def __init__(self, seconds: float, max_seconds: float, *, at_least: bool = False) -> None:
        """``at_least``: decoding stopped at ``seconds``, so the audio is at least that long."""
        self.seconds = seconds
        self.max_seconds = max_seconds
        self.at_least = at_least
        super().__init__(self.message(PER_REQUEST))

    def message(self, bound: str) -> str:
        """The refusal, naming what set the limit (``bound``: :data:`PER_REQUEST`, or a
        batch's share)."""
        length = f"more than {self.max_seconds:g} s" if self.at_least else f"{self.seconds:.1f} s"
        return f"the audio is {length} long; at most {self.max_seconds:g} s of audio {bound}"


__all__ = ["MAX_CHANNELS", "PER_REQUEST", "RATES", "AudioError", "AudioLimitError"]
