"""One Piper request, sentence by sentence: the rules a session and the batched engine share.

Checks, the request's seeded RNG, scales, phonemes, frame budgets and limits, and
piper's output stage (normalize, volume, clip) live here once;
:class:`backends.piper.session.PiperSession` runs a :class:`Progress` one sentence
at a time, :class:`backends.piper.batched.PiperEngine` many at once.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import attrs
import numpy as np

from backends.piper.api import (
    DEFAULT_SEED,
    AudioLimitError,
    FrameLimitError,
    PiperChunk,
    PiperRequest,
    PiperResult,
)
from backends.piper.model import Latent, PiperModel, Synthesis, SynthesisInput
from backends.piper.phonemize import phoneme_ids, phonemize


def check_request(request: PiperRequest) -> None:
    """What this voice refuses in any request (raises ``TypeError`` or ``ValueError``)."""
    if not isinstance(request, PiperRequest):
        raise TypeError(f"expected PiperRequest, got {type(request).__name__}")
    if request.speaker is not None:
        raise ValueError("this Piper voice has a single speaker: leave speaker unset")


def request_rng(request: PiperRequest) -> np.random.Generator:
    """The request's own noise RNG, fresh from its seed (:data:`DEFAULT_SEED` when unset)."""
    return np.random.default_rng(DEFAULT_SEED if request.seed is None else request.seed)


def warm_up(model: PiperModel) -> None:
    """Pay at load what a model's first request would pay on top of every later one's.

    That is piper's espeak-ng bridge (importing ``piper.voice``, which imports
    onnxruntime: about 35 ms), the voice's espeak-ng data (4 ms) and numpy.random
    (9 ms), so the first request's first audio comes as soon as a later one's
    (docs/performance.md, "TTS time to first audio"). Nothing it computes is kept:
    phonemes depend only on their text and voice, and every request draws its
    noise from its own RNG.
    """
    phonemize("Warm up.", model.config)
    request_rng(PiperRequest("Warm up."))


@attrs.define(eq=False)
class Progress:
    """One request's synthesis, sentence by sentence: the rules a session and the batched
    engine share (scales, phonemes, frame budgets and limits, piper's output stage).

    The caller synthesizes :meth:`next_input` (alone or in a batch) and hands the
    outcome to :meth:`finish`, which gives the sentence's chunk and moves on.
    """

    model: PiperModel
    request: PiperRequest
    rng: np.random.Generator
    sentences: list[tuple[list[str], list[int]]]
    scales: tuple[float, float, float]  # noise_scale, length_scale, noise_w
    index: int = 0
    used: int = 0  # frames produced so far
    _limit: tuple[str, float] = ("", 0.0)  # the next sentence's binding limit and its seconds

    @classmethod
    def start(cls, model: PiperModel, request: PiperRequest, rng: np.random.Generator) -> Progress:
        """Phonemize ``request`` (empty sentences dropped) and fix its scales."""
        cfg = model.config
        scales = (
            cfg.noise_scale if request.noise_scale is None else request.noise_scale,
            cfg.length_scale if request.length_scale is None else request.length_scale,
            cfg.noise_w if request.noise_w is None else request.noise_w,
        )
        sentences = [(p, phoneme_ids(p, cfg)) for p in phonemize(request.text, cfg) if p]
        return cls(model, request, rng, sentences, scales)

    @property
    def done(self) -> bool:
        return self.index >= len(self.sentences)

    @property
    def frame_seconds(self) -> float:
        return self.model.hyper.hop_length / self.model.config.sample_rate

    def next_input(self) -> SynthesisInput:
        """The next sentence as the model's input, with its frame budget."""
        budget, limit, seconds = _frame_budget(self.request, self.used, self.frame_seconds)
        self._limit = (limit, seconds)
        noise_scale, length_scale, noise_w = self.scales
        ids = np.asarray(self.sentences[self.index][1])
        return SynthesisInput(ids, noise_scale, length_scale, noise_w, self.rng, budget)

    def plan(
        self,
        latent: Callable[[SynthesisInput], tuple[Any, np.ndarray]],
        most: int | None = None,
        before: Callable[[], None] | None = None,
    ) -> list[tuple[int, Latent]]:
        """The next sentences' latents (every one left, or at most ``most``), in order, each
        counted toward the request's limits as it comes (:meth:`account`), with its index:
        a request over a limit fails here, before any of them is decoded. ``latent`` is
        the model's (text encoder, durations and noise: about a sixth of the work);
        ``before`` runs before each sentence (a stop point). Decoding draws no noise, so
        the RNG gives every sentence what a sentence-by-sentence synthesis gives it."""
        out: list[tuple[int, Latent]] = []
        while not self.done and (most is None or len(out) < most):
            if before is not None:
                before()
            item = self.next_input()
            try:
                z_p, durations = latent(item)
            except FrameLimitError as exc:
                self.account(exc)  # raises the request's AudioLimitError
                raise
            out.append((self.account(durations), Latent(z_p, durations)))
        return out

    def finish(self, outcome: Synthesis | Exception) -> PiperChunk:
        """The chunk of the sentence :meth:`next_input` gave, from the model's outcome
        (:meth:`account` and :meth:`output` in one)."""
        index = self.account(outcome if isinstance(outcome, Exception) else outcome.durations)
        assert not isinstance(outcome, Exception)
        return self.output(index, outcome.audio)

    def account(self, outcome: np.ndarray | Exception) -> int:
        """Count the sentence :meth:`next_input` gave toward the request's limits, from its
        durations (one frame at least), and move on; its index.

        A :class:`FrameLimitError` becomes the request's :class:`AudioLimitError`;
        any other exception is raised as it is.
        """
        if isinstance(outcome, FrameLimitError):
            limit, seconds = self._limit
            needed = (self.used if limit == "request" else 0) + outcome.frames
            raise AudioLimitError(limit, seconds, needed * self.frame_seconds) from None
        if isinstance(outcome, Exception):
            raise outcome
        self.used += max(int(outcome.sum()), 1)
        self.index += 1
        return self.index - 1

    def output(self, index: int, audio: np.ndarray) -> PiperChunk:
        """Sentence ``index``'s chunk from its audio, through piper's output stage (normalize,
        volume, clip)."""
        request, (phonemes, ids) = self.request, self.sentences[index]
        if request.normalize_audio:
            peak = float(np.max(np.abs(audio)))
            audio = np.zeros_like(audio) if peak < 1e-8 else audio / np.float32(peak)
        if request.volume != 1.0:
            audio = audio * np.float32(request.volume)
        audio = np.clip(audio, -1.0, 1.0).astype(np.float32)
        return PiperChunk(
            index=index,
            phonemes=tuple(phonemes),
            phoneme_ids=tuple(ids),
            audio=audio,
            sample_rate=self.model.config.sample_rate,
        )


def result_of(chunks: Sequence[PiperChunk], sample_rate: int) -> PiperResult:
    """A whole request's result from its chunks (audio concatenated)."""
    audio = np.concatenate([c.audio for c in chunks]) if chunks else np.zeros(0, dtype=np.float32)
    return PiperResult(audio=audio, sample_rate=sample_rate, chunks=tuple(chunks))


def _frame_budget(
    request: PiperRequest, used: int, frame_seconds: float
) -> tuple[int | None, str, float]:
    """Frames the next sentence may take, which limit binds, and that limit in seconds."""
    options: list[tuple[int, str, float]] = []
    if request.max_seconds is not None:
        total = int(request.max_seconds / frame_seconds)
        options.append((max(total - used, 0), "request", request.max_seconds))
    if request.max_sentence_seconds is not None:
        options.append(
            (
                int(request.max_sentence_seconds / frame_seconds),
                "sentence",
                request.max_sentence_seconds,
            )
        )
    if not options:
        return None, "", 0.0
    return min(options)
