"""Greedy decoding of one 30 s window with Whisper's suppression and timestamp rules.

This reproduces CTranslate2's ``WhisperReplica::generate`` with beam size 1 and
temperature 0, as faster-whisper calls it:

* the prompt ``[<|startofprev|>, previous text..., <|startoftranscript|>]`` is run
  through the decoder in one pass; decoding starts at ``<|startoftranscript|>``;
* step 0: the no-speech probability is the softmax of the *raw* logits at
  ``<|nocaptions|>``;
* every step: the ``suppress_tokens`` ids are masked; at step 0 also the
  ``suppress_blank`` ids (space and ``<|endoftext|>``, config ``suppress_ids_begin``);
* timestamp rules: ``<|notimestamps|>`` is never sampled; step 0 must be a
  timestamp no later than ``max_initial_timestamp``; timestamps come in pairs
  (after a lone timestamp no text, after a pair no timestamp) and never decrease;
  when text is still allowed and the summed probability of all timestamps beats
  the best other token, a timestamp is forced (logprob rule, computed after all
  masks are applied);
* the token is the argmax of the masked log-softmax; its log-probability adds to
  the score; decoding stops at ``<|endoftext|>`` or after
  ``min(224, 448 - prompt length)`` steps.

At a temperature above 0 (:func:`sample_steps`) the same masks apply; the token
is drawn from ``softmax(log_probs / temperature)`` (CTranslate2's
``RandomSampler`` with ``sampling_topk=0``) by a seeded numpy ``Generator``, and
the score still adds the unscaled log-probability. ``best_of`` candidates are
drawn one after another from the same prompt; the one with the best
length-normalised score (sum / tokens, CTranslate2's ``length_penalty=1``) wins.

Decoding is written as a program (a generator) that yields one :class:`Step` per
token and is sent that step's logits, so that whoever runs the decoder (one
session, or a batched engine advancing many programs in one forward) applies
exactly these rules.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable, Generator, Sequence

import attrs
import numpy as np

from backends.whisper.tokenizer import WhisperTokenizer

MAX_LENGTH = 448


@attrs.frozen
class DecodeOptions:
    """Resolved per-window decoding options."""

    suppress_ids: tuple[int, ...]
    suppress_blank_ids: tuple[int, ...]
    max_initial_timestamp_index: int
    record_top2: bool = False


@attrs.frozen
class WindowResult:
    """The generated tokens of one window (without ``<|endoftext|>``) and its scores."""

    tokens: list[int]
    sum_logprob: float
    no_speech_prob: float
    top2: list[tuple[float, float]] | None = None  # masked logits' two best values per step
    temperature: float = 0.0  # the temperature this result was decoded at
    compression_ratio: float = 0.0  # of its stripped text (set by the fallback loop)

    @property
    def avg_logprob(self) -> float:
        """faster-whisper's average: the summed log-probs (EOT included) over len + 1."""
        if not self.tokens:
            return float("nan")
        return self.sum_logprob / (len(self.tokens) + 1)


def build_prompt(tok: WhisperTokenizer, previous: Sequence[int]) -> list[int]:
    """faster-whisper's ``get_prompt`` without prefix or hotwords."""
    prompt: list[int] = []
    if previous:
        prompt.append(tok.sot_prev)
        prompt.extend(previous[-(MAX_LENGTH // 2 - 1) :])
    prompt.extend(tok.sot_sequence)
    return prompt


def _log_softmax(x: np.ndarray) -> np.ndarray:
    m = np.max(x)
    shifted = x - m
    out: np.ndarray = shifted - np.log(np.sum(np.exp(shifted)))
    return out


def _logsumexp(x: np.ndarray) -> float:
    m = float(np.max(x))
    if m == -np.inf:
        return m
    return m + float(np.log(np.sum(np.exp(x - m))))


class TimestampRules:
    """CTranslate2's ``ApplyTimestampRules`` for one sequence (greedy, batch 1)."""

    def __init__(self, tok: WhisperTokenizer, vocab_size: int, max_initial_index: int) -> None:
        self.eot = tok.eot
        self.no_timestamps = tok.no_timestamps
        self.begin = tok.timestamp_begin
        self.end = vocab_size - 1
        self.max_initial = self.begin + max_initial_index

    def apply(self, step: int, logits: np.ndarray, generated: Sequence[int]) -> np.ndarray | None:
        """Mask ``logits`` in place (masks already applied by earlier rules count too).

        Returns the log-softmax of the masked ``logits`` when the logprob rule computed
        it and then left ``logits`` as they were (the caller need not compute it again),
        else None.
        """
        logits[self.no_timestamps] = -np.inf
        if step == 0:
            logits[: self.begin] = -np.inf
            logits[self.max_initial + 1 : self.end + 1] = -np.inf
            return None
        check_prob = True
        last = generated[-1]
        if last >= self.begin:
            penultimate = generated[-2] if step > 1 else last
            if penultimate >= self.begin:
                logits[self.begin : self.end + 1] = -np.inf
                check_prob = False
            else:
                logits[: self.eot] = -np.inf
        for token in reversed(generated):
            if token >= self.begin:
                logits[self.begin : token] = -np.inf
                break
        if not check_prob:
            return None
        log_probs = _log_softmax(logits)
        timestamp_lp = _logsumexp(log_probs[self.begin : self.end + 1])
        if timestamp_lp > float(np.max(log_probs[: self.begin])):
            logits[: self.begin] = -np.inf
            return None
        return log_probs


Choose = Callable[[np.ndarray], int]
"""Picks the next token from the masked float32 log-probabilities."""


def _argmax(log_probs: np.ndarray) -> int:
    return int(np.argmax(log_probs))


def temperature_sampler(temperature: float, rng: np.random.Generator) -> Choose:
    """Draw from ``softmax(log_probs / temperature)`` with one uniform number from ``rng``."""
    if not temperature > 0:
        raise ValueError("sampling needs a temperature above 0")

    def choose(log_probs: np.ndarray) -> int:
        scaled = log_probs.astype(np.float64) / temperature
        weights = np.exp(scaled - np.max(scaled))
        cumulative = np.cumsum(weights)
        index = int(np.searchsorted(cumulative, rng.random() * cumulative[-1], side="right"))
        return min(index, int(log_probs.shape[0]) - 1)

    return choose


@attrs.frozen
class Step:
    """Feed ``token`` at the next decoder position; the answer is its float32 logits ``[V]``."""

    token: int


DecodeSteps = Generator[Step, np.ndarray, WindowResult]
"""Decoding as a program: yields :class:`Step` s, is sent each step's logits, returns the result."""


def _decode(
    tok: WhisperTokenizer,
    vocab_size: int,
    prompt_length: int,
    options: DecodeOptions,
    choose: Choose,
) -> DecodeSteps:
    rules = TimestampRules(tok, vocab_size, options.max_initial_timestamp_index)
    start_step = prompt_length - 1
    max_steps = min(MAX_LENGTH // 2, MAX_LENGTH - start_step)
    suppress = np.asarray(options.suppress_ids, dtype=np.intp)
    suppress_blank = np.asarray(options.suppress_blank_ids, dtype=np.intp)
    generated: list[int] = []
    top2: list[tuple[float, float]] | None = [] if options.record_top2 else None
    sum_logprob = 0.0
    no_speech_prob = 0.0
    token = tok.sot_sequence[-1]
    for step in range(max_steps):
        logits = np.array((yield Step(token)), dtype=np.float32)
        if step == 0:
            probs = np.exp(_log_softmax(logits))
            no_speech_prob = float(probs[tok.no_speech])
        logits[suppress] = -np.inf
        if step == 0 and suppress_blank.size:
            logits[suppress_blank] = -np.inf
        log_probs = rules.apply(step, logits, generated)
        if log_probs is None:  # masked after (or without) the logprob rule's softmax
            log_probs = _log_softmax(logits)
        best = choose(log_probs)
        if top2 is not None:
            two = np.partition(logits, -2)[-2:]
            top2.append((float(two[1]), float(two[0])))
        sum_logprob += float(log_probs[best])
        if best == tok.eot:
            break
        generated.append(best)
        token = best
    return WindowResult(generated, sum_logprob, no_speech_prob, top2)


def greedy_steps(
    tok: WhisperTokenizer, vocab_size: int, prompt_length: int, options: DecodeOptions
) -> DecodeSteps:
    """Decode one window greedily, one :class:`Step` at a time.

    The prompt minus its last token must already be in the decoder cache; the
    first step feeds the prompt's last token (``<|startoftranscript|>``).
    """
    return _decode(tok, vocab_size, prompt_length, options, _argmax)


def sample_steps(
    tok: WhisperTokenizer,
    vocab_size: int,
    prompt_length: int,
    options: DecodeOptions,
    temperature: float,
    rng: np.random.Generator,
) -> DecodeSteps:
    """One sampled candidate at ``temperature`` (same contract as :func:`greedy_steps`)."""
    choose = temperature_sampler(temperature, rng)
    result = yield from _decode(tok, vocab_size, prompt_length, options, choose)
    return attrs.evolve(result, temperature=temperature)


def length_normalised_score(result: WindowResult) -> float:
    """CTranslate2's hypothesis score with ``length_penalty=1``: summed log-prob / tokens."""
    if not result.tokens:
        return -math.inf
    return result.sum_logprob / len(result.tokens)


def compression_ratio(text: str) -> float:
    """UTF-8 length over zlib-compressed length (faster-whisper's ``get_compression_ratio``)."""
    raw = text.encode("utf-8")
    return len(raw) / len(zlib.compress(raw))
