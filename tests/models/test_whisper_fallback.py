"""Temperature fallback, seeded sampling and the prompt history of the seek loop.

The fallback rules are checked against faster-whisper's own ``generate_with_fallback``
driven by the same scripted decoding results; the seek loop's prompt handling with a
scripted window model; sampling and a forced fallback on a real session.
"""

from __future__ import annotations

import logging
from types import SimpleNamespace
from typing import Any

import attrs
import numpy as np
import pytest

from backends.whisper import WhisperFactory, WhisperRequest
from backends.whisper.alignment import TokenAlignment
from backends.whisper.decoding import (
    WindowResult,
    compression_ratio,
    length_normalised_score,
    temperature_sampler,
)
from backends.whisper.fallback import (
    DEFAULT_TEMPERATURES,
    FallbackOptions,
    generate_with_fallback,
    temperature_ladder,
)
from backends.whisper.longform import LongformOptions, transcribe_features
from tests.models.whisper_tokens import REF, TOK, TS, fw_transcribe


def test_temperature_ladder_follows_openai_whisper() -> None:
    assert temperature_ladder(0.0) == DEFAULT_TEMPERATURES == (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)
    assert temperature_ladder(0.5) == (0.5, 0.7, 0.9)
    assert temperature_ladder(0.3) == (0.3, 0.5, 0.7, 0.9)
    assert temperature_ladder(0.8) == (0.8, 1.0)
    assert temperature_ladder(1.0) == (1.0,)
    for bad in (-0.1, 1.01, float("nan")):
        with pytest.raises(ValueError, match="between 0 and 1"):
            temperature_ladder(bad)


def test_compression_ratio_is_faster_whisper_s() -> None:
    for text in ("Hello there.", "the " * 40, "Once upon a time, in a small village by the sea."):
        assert compression_ratio(text) == fw_transcribe.get_compression_ratio(text)
    assert compression_ratio("the " * 40) > 2.4 > compression_ratio("Hello there.")


REPEAT = "the cat the cat the cat the cat the cat the cat the cat the cat the cat"
# per temperature: (text, summed log-probability, no-speech probability)
Attempt = tuple[str, float, float]
SCENARIOS: dict[str, list[Attempt]] = {
    "first_passes": [(" Hello there.", -1.0, 0.1)],
    "low_logprob_then_passes": [(" Hello there.", -9.0, 0.1), (" Hello, there!", -2.0, 0.1)],
    "repetitive_then_passes": [(REPEAT, -2.0, 0.1), (REPEAT[:20], -30.0, 0.1), (" Hi.", -1.0, 0.0)],
    "silence_is_not_retried": [(" you", -8.0, 0.9)],
    "no_speech_but_confident": [(" Yes.", -0.5, 0.9)],
    "all_fail_best_under_ratio": [
        (REPEAT, -1.0, 0.1),
        (" A b c d.", -30.0, 0.1),
        (" A b c.", -20.0, 0.2),
        (REPEAT, -0.5, 0.1),
        (" A b.", -25.0, 0.1),
        (" A.", -40.0, 0.1),
    ],
    "all_fail_all_repetitive": [(REPEAT, -60.0, 0.1), (REPEAT + " the", -30.0, 0.1)],
}
THRESHOLDS: dict[str, tuple[float | None, float | None, float | None]] = {
    "defaults": (2.4, -1.0, 0.6),
    "no_ratio_check": (None, -1.0, 0.6),
    "no_logprob_check": (2.4, None, 0.6),
    "no_silence_rule": (2.4, -1.0, None),
}


@pytest.mark.parametrize("thresholds", list(THRESHOLDS))
@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_fallback_matches_faster_whisper(scenario: str, thresholds: str) -> None:
    attempts = SCENARIOS[scenario]
    ratio, log_prob, no_speech = THRESHOLDS[thresholds]
    temperatures = DEFAULT_TEMPERATURES[: len(attempts)]
    if scenario.startswith("all_fail"):
        temperatures = DEFAULT_TEMPERATURES
    scripted = [([TS, *TOK.encode(text), TS + 50], s, p) for text, s, p in attempts]

    ours_tried: list[float] = []

    def generate(temperature: float) -> WindowResult:
        tokens, sum_logprob, no_speech_prob = scripted[len(ours_tried) % len(scripted)]
        ours_tried.append(temperature)
        return WindowResult(list(tokens), sum_logprob, no_speech_prob)

    options = FallbackOptions(temperatures, ratio, log_prob, no_speech, best_of=3)
    ours = generate_with_fallback(generate, TOK, options)

    their_tried: list[dict[str, Any]] = []

    def reference_generate(*args: Any, **kwargs: Any) -> list[Any]:
        tokens, sum_logprob, no_speech_prob = scripted[len(their_tried) % len(scripted)]
        their_tried.append(kwargs)
        score = sum_logprob / len(tokens)  # CTranslate2's score with length_penalty 1
        return [
            SimpleNamespace(sequences_ids=[tokens], scores=[score], no_speech_prob=no_speech_prob)
        ]

    fake = SimpleNamespace(
        model=SimpleNamespace(generate=reference_generate),
        time_precision=0.02,
        max_length=448,
        logger=logging.getLogger("test_whisper_fallback"),
    )
    reference_options = SimpleNamespace(
        max_initial_timestamp=1.0,
        max_new_tokens=None,
        temperatures=list(temperatures),
        best_of=3,
        beam_size=1,
        patience=1,
        length_penalty=1,
        repetition_penalty=1,
        no_repeat_ngram_size=0,
        suppress_blank=True,
        suppress_tokens=[-1],
        compression_ratio_threshold=ratio,
        log_prob_threshold=log_prob,
        no_speech_threshold=no_speech,
    )
    result, avg_logprob, temperature, ratio_value = (
        fw_transcribe.WhisperModel.generate_with_fallback(
            fake, None, [TOK.sot], REF, reference_options
        )
    )
    assert ours_tried == [kw.get("sampling_temperature", 0.0) for kw in their_tried]
    assert all(kw.get("num_hypotheses", 3) == 3 for kw in their_tried)
    assert ours.tokens == result.sequences_ids[0]
    assert ours.avg_logprob == pytest.approx(avg_logprob, rel=1e-12)
    assert (ours.temperature, ours.compression_ratio) == (temperature, ratio_value)


def test_sampler_draws_from_the_tempered_distribution() -> None:
    probs = np.array([0.0, 0.2, 0.3, 0.5], np.float64)
    with np.errstate(divide="ignore"):
        log_probs = np.log(probs).astype(np.float32)
    for temperature in (1.0, 0.5):
        choose = temperature_sampler(temperature, np.random.default_rng(11))
        draws = np.bincount([choose(log_probs) for _ in range(20000)], minlength=4) / 20000
        tempered = probs ** (1 / temperature) / np.sum(probs ** (1 / temperature))
        assert draws[0] == 0.0  # a masked token is never drawn
        np.testing.assert_allclose(draws, tempered, atol=0.015)
    cold = temperature_sampler(0.01, np.random.default_rng(1))
    assert {cold(log_probs) for _ in range(200)} == {3}
    first = temperature_sampler(1.0, np.random.default_rng(5))
    again = temperature_sampler(1.0, np.random.default_rng(5))
    assert [first(log_probs) for _ in range(50)] == [again(log_probs) for _ in range(50)]
    with pytest.raises(ValueError, match="above 0"):
        temperature_sampler(0.0, np.random.default_rng(0))


def test_best_of_ranks_by_length_normalised_score() -> None:
    assert length_normalised_score(WindowResult([1, 2, 3, 4], -2.0, 0.0)) == -0.5
    assert length_normalised_score(WindowResult([], -0.1, 0.0)) == -np.inf
    short_but_worse = WindowResult([1], -0.6, 0.0)
    long_but_better = WindowResult([1, 2, 3], -1.5, 0.0)
    assert max([short_but_worse, long_but_better], key=length_normalised_score) is long_but_better


@attrs.define
class ScriptedModel:
    """A window model that replays results per (window, temperature) and records prompts."""

    results: dict[float, WindowResult]
    prompts: list[list[int]] = attrs.Factory(list)
    tried: list[float] = attrs.Factory(list)
    windows: int = 0

    def set_window(self, mel: np.ndarray) -> None:
        assert mel.shape == (80, 3000)
        self.windows += 1

    def generate(self, prompt: list[int], temperature: float) -> WindowResult:
        self.prompts.append(list(prompt))
        self.tried.append(temperature)
        return self.results[temperature]

    def align(self, text_tokens: list[int], num_frames: int) -> TokenAlignment:
        raise AssertionError("no word timestamps requested")


def _two_windows() -> np.ndarray:
    return np.zeros((80, 6001), np.float32)  # 60 s: two full windows


@pytest.mark.parametrize(("final_temperature", "reset"), [(0.4, False), (0.6, True)])
def test_prompt_history_resets_after_a_hot_window(final_temperature: float, reset: bool) -> None:
    text = [*TOK.encode(" Hello there."), TS + 100]
    greedy = WindowResult(
        [TS, *TOK.encode(" the the the the the the the the the the the")], -2.0, 0
    )
    sampled = WindowResult([TS, *text], -1.0, 0.0)
    model = ScriptedModel({0.0: greedy, final_temperature: sampled})
    options = LongformOptions(
        initial_prompt="Greetings.",
        fallback=FallbackOptions(temperatures=(0.0, final_temperature)),
    )
    windows = list(transcribe_features(_two_windows(), TOK, model, options))
    assert model.windows == 2 and model.tried == [0.0, final_temperature] * 2
    assert [w.result.temperature for w in windows] == [final_temperature] * 2
    assert windows[0].segments[0].temperature == final_temperature
    initial = TOK.encode(" Greetings.")
    assert model.prompts[0] == [TOK.sot_prev, *initial, TOK.sot]
    history = [TOK.sot_prev, *initial, TS, *text, TOK.sot]
    assert model.prompts[2] == ([TOK.sot] if reset else history)


def test_initial_prompt_as_token_ids() -> None:
    model = ScriptedModel({0.0: WindowResult([TS, *TOK.encode(" Hi."), TS + 50], -0.5, 0.0)})
    options = LongformOptions(initial_prompt=(11, 12, 13), fallback=FallbackOptions((0.0,)))
    list(transcribe_features(np.zeros((80, 2001), np.float32), TOK, model, options))
    assert model.prompts[0] == [TOK.sot_prev, 11, 12, 13, TOK.sot]


# ---- a real session -------------------------------------------------------------------


pytestmark = pytest.mark.usefixtures("one_thread")


def _tokens(result: Any) -> list[int]:
    return [t for s in result.segments for t in s.tokens]


def test_sampling_is_reproducible_per_seed(
    whisper_factory: WhisperFactory, whisper_pcm: np.ndarray
) -> None:
    first, second = whisper_factory.create(), whisper_factory.create()
    greedy = first.run(WhisperRequest(whisper_pcm, temperature=0.0))
    hot = WhisperRequest(whisper_pcm, temperature=1.0, best_of=1, seed=3)
    sampled = first.run(hot)
    assert [w.result.temperature for w in sampled.windows] == [1.0]
    assert _tokens(second.run(hot)) == _tokens(sampled)  # another session, same seed
    assert _tokens(first.run(attrs.evolve(hot, seed=4))) != _tokens(sampled)
    assert _tokens(first.run(WhisperRequest(whisper_pcm, temperature=0.0))) == _tokens(greedy)


def test_fallback_keeps_the_best_attempt(
    whisper_factory: WhisperFactory, whisper_pcm: np.ndarray
) -> None:
    """An unreachable log-probability threshold: every temperature is tried, the best kept."""
    session = whisper_factory.create()
    greedy = session.run(WhisperRequest(whisper_pcm, temperature=0.0, no_speech_threshold=None))
    forced = session.run(
        WhisperRequest(
            whisper_pcm,
            temperature=(0.0, 0.8),
            log_prob_threshold=0.0,
            no_speech_threshold=None,
            best_of=2,
            seed=1,
        )
    )
    window = forced.windows[0].result
    assert window.temperature == 0.8  # reported at the last temperature tried
    assert window.avg_logprob >= greedy.windows[0].result.avg_logprob
    assert window.compression_ratio == compression_ratio(TOK.decode(window.tokens).strip())
