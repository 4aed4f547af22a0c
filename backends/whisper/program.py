"""One Whisper request as a program of model operations: its rules once, two drivers.

:func:`transcription` is a generator: it applies every rule of a request (options,
prompt history, temperature fallback, suppression and timestamp rules, seeking
through long audio, word alignment) and yields what it needs from the model:

* :class:`~backends.whisper.longform.SetWindow`: encode a new 30 s window;
* :class:`Prefill`: clear the self-attention cache and run a prompt through it;
* :class:`Rewind`: drop cached positions after ``length`` (a new candidate);
* :class:`~backends.whisper.decoding.Step`: one token in, its logits out;
* :class:`~backends.whisper.longform.Align`: the aligning pass (word timestamps);

and each decoded :class:`~backends.whisper.longform.Window` (sent back ``None``).
A session runs every operation itself (:class:`Executor`); the batched engine
(:mod:`backends.whisper.batched`) gathers the ``SetWindow`` and ``Step``
operations of all its members into one encoder pass and one decoder step, and
runs the rest per member with the same :class:`Executor`.
"""

from __future__ import annotations

from collections.abc import Generator, Iterator, Mapping, Sequence
from typing import Any

import attrs
import numpy as np

from backends.base import ArrayBackend
from backends.whisper import model
from backends.whisper.alignment import TokenAlignment, alignment_matrix, negative_dtw
from backends.whisper.decoding import (
    DecodeOptions,
    Step,
    WindowResult,
    greedy_steps,
    length_normalised_score,
    sample_steps,
)
from backends.whisper.fallback import FallbackOptions
from backends.whisper.frontend import log_mel
from backends.whisper.longform import (
    Align,
    LongformOptions,
    SetWindow,
    Window,
    transcribe_steps,
)
from backends.whisper.tokenizer import TIME_PRECISION, WhisperTokenizer
from backends.whisper.types import WhisperRequest, WhisperResult
from core.stopping import stop_point


@attrs.frozen
class Prefill:
    """Clear the self-attention cache, then run ``tokens`` (possibly none) through it."""

    tokens: tuple[int, ...]


@attrs.frozen
class Rewind:
    """Keep only the first ``length`` cached positions."""

    length: int


Op = SetWindow | Prefill | Rewind | Step | Align
Program = Generator[Op | Window, Any, None]
"""A request as a program (see the module doc)."""


def checked(request: object) -> WhisperRequest:
    """``request`` if it is a :class:`WhisperRequest`; a TypeError otherwise."""
    if not isinstance(request, WhisperRequest):
        raise TypeError(f"whisper: expected a WhisperRequest, got {type(request).__name__}")
    return request


def request_options(
    request: WhisperRequest, tok: WhisperTokenizer, config: Mapping[str, Any]
) -> tuple[DecodeOptions, LongformOptions]:
    """The per-window decoding options and the long-form options of ``request``."""
    decode = DecodeOptions(
        suppress_ids=tok.suppressed_tokens(request.suppress_tokens),
        suppress_blank_ids=tuple(config.get("suppress_ids_begin", []))
        if request.suppress_blank
        else (),
        max_initial_timestamp_index=round(request.max_initial_timestamp / TIME_PRECISION),
        record_top2=request.record_top2,
    )
    longform = LongformOptions(
        condition_on_previous_text=request.condition_on_previous_text,
        initial_prompt=request.initial_prompt,
        no_speech_threshold=request.no_speech_threshold,
        log_prob_threshold=request.log_prob_threshold,
        fallback=FallbackOptions(
            temperatures=request.temperature,
            compression_ratio_threshold=request.compression_ratio_threshold,
            best_of=request.best_of,
        ),
        prompt_reset_on_temperature=request.prompt_reset_on_temperature,
        word_timestamps=request.word_timestamps,
        prepend_punctuations=request.prepend_punctuations,
        append_punctuations=request.append_punctuations,
    )
    return decode, longform


class _Generator:
    """One request's window decoding: the cached prompt, greedy or best-of sampling.

    The prompt minus its last token stays cached across the temperatures of one
    window; a new window or an aligning pass (which overwrites the cache) drops it.
    """

    def __init__(
        self,
        tok: WhisperTokenizer,
        vocab_size: int,
        options: DecodeOptions,
        best_of: int,
        rng: np.random.Generator,
    ) -> None:
        self._tok = tok
        self._vocab = vocab_size
        self._options = options
        self._best_of = best_of
        self._rng = rng
        self.prompt: list[int] | None = None  # whose first len - 1 tokens are cached

    def generate(self, prompt: list[int], temperature: float) -> Generator[Op, Any, WindowResult]:
        if self.prompt != prompt:
            yield Prefill(tuple(prompt[:-1]))
            self.prompt = list(prompt)
        cached = len(prompt) - 1
        tok, vocab, options = self._tok, self._vocab, self._options
        if temperature == 0:
            yield Rewind(cached)
            return (yield from greedy_steps(tok, vocab, len(prompt), options))
        candidates: list[WindowResult] = []
        for _ in range(self._best_of):
            yield Rewind(cached)
            candidate = yield from sample_steps(
                tok, vocab, len(prompt), options, temperature, self._rng
            )
            candidates.append(candidate)
        return max(candidates, key=length_normalised_score)


def transcription(
    request: object, tok: WhisperTokenizer, config: Mapping[str, Any], vocab_size: int
) -> Program:
    """The program of ``request`` (checked when the program starts; see the module doc).

    Sampling draws from a numpy ``Generator`` seeded by the request's ``seed``,
    created here, so the result never depends on who runs the program.
    """
    req = checked(request)
    options, longform = request_options(req, tok, config)
    windows = _Generator(tok, vocab_size, options, req.best_of, np.random.default_rng(req.seed))
    program = transcribe_steps(log_mel(req.audio), tok, windows.generate, longform)
    answer: Any = None
    while True:
        try:
            item = program.send(answer)
        except StopIteration:
            return
        if isinstance(item, SetWindow | Align):
            windows.prompt = None  # the cache no longer holds the prompt
        answer = yield item


def result(request: WhisperRequest, windows: Sequence[Window]) -> WhisperResult:
    """What ``Session.run`` returns for ``request`` once ``windows`` are decoded."""
    segments = tuple(s for w in windows for s in w.segments)
    return WhisperResult(
        text="".join(s.text for s in segments),
        segments=segments,
        duration=request.audio.shape[0] / request.sample_rate,
        windows=tuple(windows),
    )


class Executor:
    """Runs a program's operations on one decoder state (one sequence)."""

    def __init__(
        self,
        backend: ArrayBackend,
        weights: model.WhisperWeights,
        tok: WhisperTokenizer,
        alignment_heads: Sequence[tuple[int, int]],
        state: model.DecoderState,
    ) -> None:
        self.backend = backend
        self.weights = weights
        self.tok = tok
        self.alignment_heads = alignment_heads
        self.state = state

    def windows(self, program: Program) -> Iterator[Window]:
        """Run ``program`` to its end, yielding its windows as they are decoded. Each operation
        is a stop point (:mod:`core.stopping`): a run whose caller gave up ends there."""
        answer: Any = None
        while True:
            stop_point()
            try:
                item = program.send(answer)
            except StopIteration:
                return
            if isinstance(item, Window):
                answer = None
                yield item
            else:
                answer = self.execute(item)

    def execute(self, op: Op) -> Any:
        """Run one operation; the answer the program expects (logits, an alignment, None)."""
        be, w, state = self.backend, self.weights, self.state
        if isinstance(op, Step):
            hidden = model.decode(be, w, state, np.asarray([[op.token]], dtype=np.int64))
            return be.to_host(model.logits(be, w, hidden))[0, 0]
        if isinstance(op, Rewind):
            state.length = op.length
        elif isinstance(op, Prefill):
            state.length = 0
            if op.tokens:
                model.decode(be, w, state, np.asarray([op.tokens], dtype=np.int64))
        elif isinstance(op, SetWindow):
            state.set_memory(model.encode(be, w, be.to_device(op.mel[None])))
        elif isinstance(op, Align):
            return self.align(op.text_tokens, op.num_frames)
        else:
            raise TypeError(f"whisper: unknown operation {op!r}")
        return None

    def align(self, text_tokens: list[int], num_frames: int) -> TokenAlignment:
        """The aligning pass over the current window (overwrites the cached positions)."""
        be, w, state, tok = self.backend, self.weights, self.state, self.tok
        sequence = [*tok.sot_sequence, tok.no_timestamps, *text_tokens, tok.eot]
        state.length = 0
        hidden, scores = model.decode_with_cross_attention(
            be, w, state, np.asarray([sequence], dtype=np.int64), self.alignment_heads
        )
        logits = np.asarray(be.to_host(model.logits(be, w, hidden))[0], dtype=np.float32)
        text_logits = logits[:, : tok.eot]
        shifted = text_logits - np.max(text_logits, axis=-1, keepdims=True)
        probs = np.exp(shifted)
        probs /= np.sum(probs, axis=-1, keepdims=True)
        offset = len(tok.sot_sequence)
        token_probs = [float(probs[offset + t, token]) for t, token in enumerate(text_tokens)]
        if num_frames // 2 == 0:
            empty = np.zeros(0, dtype=np.int64)
            return TokenAlignment(empty, empty, token_probs)
        matrix = alignment_matrix(scores[0], num_frames, offset, len(text_tokens))
        text_indices, time_indices = negative_dtw(matrix)
        return TokenAlignment(text_indices, time_indices, token_probs)
