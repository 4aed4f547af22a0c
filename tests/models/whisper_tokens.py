"""Our whisper tokenizer and faster-whisper's, for the tests that compare the two (they skip
without faster-whisper)."""

from __future__ import annotations

import pytest
import tokenizers

from backends.whisper.session import default_model_dir
from backends.whisper.tokenizer import WhisperTokenizer

fw_transcribe = pytest.importorskip("faster_whisper.transcribe")
fw_tokenizer = pytest.importorskip("faster_whisper.tokenizer")

TOK = WhisperTokenizer(default_model_dir() / "tokenizer.json")
REF = fw_tokenizer.Tokenizer(
    tokenizers.Tokenizer.from_file(str(default_model_dir() / "tokenizer.json")), False
)
TS = TOK.timestamp_begin
