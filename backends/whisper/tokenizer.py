"""Whisper token ids and text, from the model's bundled ``tokenizer.json``.

Mirrors faster-whisper's ``Tokenizer`` for the English-only model: special ids are
looked up by name, text is decoded from the ids below ``<|endoftext|>``, and the
default ``suppress_tokens=[-1]`` set is rebuilt from the vocabulary the way
faster-whisper does (so the same ids are suppressed as in the reference).
"""

from __future__ import annotations

import string
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

    def decode_with_timestamps(self, tokens: Iterable[int]) -> str:
        """Text with timestamp tokens written as ``<|1.23|>`` (other specials decode to nothing)."""
        parts: list[str | list[int]] = [[]]
        for token in tokens:
            if token >= self.timestamp_begin:
                parts.append(f"<|{(token - self.timestamp_begin) * 0.02:.2f}|>")
                parts.append([])
            else:
                current = parts[-1]
                assert isinstance(current, list)
                current.append(token)
        return "".join(p if isinstance(p, str) else str(self._tok.decode(p)) for p in parts)

    def split_tokens_on_unicode(self, tokens: Sequence[int]) -> tuple[list[str], list[list[int]]]:
        """Cut ``tokens`` wherever the text decoded so far ends on whole characters."""
        decoded_full = self.decode_with_timestamps(tokens)
        replacement = "\ufffd"
        words: list[str] = []
        word_tokens: list[list[int]] = []
        current: list[int] = []
        unicode_offset = 0
        for token in tokens:
            current.append(token)
            decoded = self.decode_with_timestamps(current)
            index = decoded.find(replacement)
            if index < 0 or (
                index + unicode_offset < len(decoded_full)
                and decoded_full[index + unicode_offset] == replacement
            ):
                words.append(decoded)
                word_tokens.append(current)
                current = []
                unicode_offset += len(decoded)
        return words, word_tokens

    def split_to_word_tokens(self, tokens: Sequence[int]) -> tuple[list[str], list[list[int]]]:
        """Words (with their leading space) and their tokens: a new word starts at a space,
        a punctuation mark or a special token (faster-whisper's ``split_tokens_on_spaces``)."""
        subwords, subword_tokens = self.split_tokens_on_unicode(tokens)
        words: list[str] = []
        word_tokens: list[list[int]] = []
        for subword, ids in zip(subwords, subword_tokens, strict=True):
            special = ids[0] >= self.eot
            with_space = subword.startswith(" ")
            punctuation = subword.strip() in string.punctuation
            if special or with_space or punctuation or not words:
                words.append(subword)
                word_tokens.append(ids)
            else:
                words[-1] = words[-1] + subword
                word_tokens[-1].extend(ids)
        return words, word_tokens

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
