"""The errors and shape limits shared by both audio decoders (:mod:`server.audio` for WAV,
:mod:`server.codecs` for everything else), so that neither imports the other's module."""

from __future__ import annotations

MAX_CHANNELS = 16
"""Most channels an input may have (a WAV or a compressed file)."""
RATES = (1000, 384000)
"""The sample rates an input may have, inclusive."""


class AudioError(ValueError):
    """Input audio that cannot be decoded or used."""


class AudioLimitError(AudioError):
    """Audio longer than the request may give (``max_audio_seconds``)."""

    def __init__(self, seconds: float, max_seconds: float, *, at_least: bool = False) -> None:
        """``at_least``: decoding stopped at ``seconds``, so the audio is at least that long."""
        length = f"more than {max_seconds:g} s" if at_least else f"{seconds:.1f} s"
        super().__init__(
            f"the audio is {length} long; "
            f"at most {max_seconds:g} s of audio per request (max_audio_seconds)"
        )
        self.seconds = seconds
        self.max_seconds = max_seconds


__all__ = ["MAX_CHANNELS", "RATES", "AudioError", "AudioLimitError"]
