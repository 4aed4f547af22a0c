"""Whisper token ids and text, from the model's bundled ``tokenizer.json``.

Mirrors faster-whisper's ``Tokenizer`` for the English-only model: special ids are
looked up by name, text is decoded from the ids below ``<|endoftext|>``, and the
default ``suppress_tokens=[-1]`` set is rebuilt from the vocabulary the way
faster-whisper does (so the same ids are suppressed as in the reference).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

import tokenizers

TIME_PRECISION = 0.02  # seconds per timestamp token


class WhisperTokenizer:
    """Special ids, encode/decode, and the suppression lists."""

    def __init__(self, path: str | Path) -> None:
        self._tok = tokenizers.Tokenizer.from_file(str(path))
        self.eot = self._id("<|endoftext|>")
        self.sot = self._id("<|startoftranscript|>")
        self.sot_prev = self._id("<|startofprev|>")
        self.sot_lm = self._id("<|startoflm|>")
        self.transcribe = self._id("<|transcribe|>")
        self.translate = self._id("<|translate|>")
        self.no_timestamps = self._id("<|notimestamps|>")
        no_speech = self._tok.token_to_id("<|nospeech|>")
        self.no_speech = no_speech if no_speech is not None else self._id("<|nocaptions|>")
        self.timestamp_begin = self.no_timestamps + 1
        self.sot_sequence = [self.sot]  # English-only: no language/task tokens
        self._non_speech: tuple[int, ...] | None = None

    def _id(self, token: str) -> int:
        value = self._tok.token_to_id(token)
        if value is None:
            raise ValueError(f"token {token!r} missing from tokenizer.json")
        return int(value)

    def encode(self, text: str) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=False).ids)

    def decode(self, tokens: Iterable[int]) -> str:
        return str(self._tok.decode([t for t in tokens if t < self.eot]))

    def non_speech_tokens(self) -> tuple[int, ...]:
        """Ids of symbols that are never speech (speaker tags, music notes, brackets)."""
        if self._non_speech is None:
            self._non_speech = self._compute_non_speech()
        return self._non_speech

    def _compute_non_speech(self) -> tuple[int, ...]:
        symbols = list('"#()*+/:;<=>@[\\]^_`{|}~「」『』')
        symbols += [
            "<<",
            ">>",
            "<<<",
            ">>>",
            "--",
            "---",
            "-(",
            "-[",
            "('",
            '("',
            "((",
            "))",
            "(((",
            ")))",
            "[[",
            "]]",
            "{{",
            "}}",
            "♪♪",
            "♪♪♪",
        ]
        miscellaneous = set("♩♪♫♬♭♮♯")
        result = {self.encode(" -")[0], self.encode(" '")[0]}
        for symbol in symbols + sorted(miscellaneous):
            for tokens in (self.encode(symbol), self.encode(" " + symbol)):
                if len(tokens) == 1 or symbol in miscellaneous:
                    result.add(tokens[0])
        return tuple(sorted(result))

    def suppressed_tokens(self, suppress_tokens: Sequence[int] | None) -> tuple[int, ...]:
        """Resolve a ``suppress_tokens`` option (``-1`` = the non-speech set) plus the task ids."""
        if not suppress_tokens:
            ids: list[int] = []
        elif -1 in suppress_tokens:
            ids = [t for t in suppress_tokens if t >= 0]
            ids.extend(self.non_speech_tokens())
        else:
            ids = list(suppress_tokens)
        ids.extend(
            [self.transcribe, self.translate, self.sot, self.sot_prev, self.sot_lm, self.no_speech]
        )
        return tuple(sorted(set(ids)))
