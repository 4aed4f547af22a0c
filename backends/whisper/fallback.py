"""Temperature fallback: faster-whisper's ``generate_with_fallback`` for one window.

The window is decoded at each temperature in turn (greedy at 0, otherwise the
best of ``best_of`` seeded samples) until a result passes both checks:

* its compression ratio (UTF-8 bytes of the stripped text over their zlib size)
  is at most ``compression_ratio_threshold`` (2.4): higher means repetition;
* its average log-probability is at least ``log_prob_threshold`` (-1.0).

A result whose no-speech probability is above ``no_speech_threshold`` (0.6) while
its average log-probability is below ``log_prob_threshold`` is silence: it is
accepted without falling back (the seek loop then skips the window). When every
temperature fails, the result with the best average log-probability among those
under the compression threshold (or among all, if none is) is kept, reported at
the last temperature tried (which decides ``prompt_reset_on_temperature``).
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from typing import Any, TypeVar

import attrs

from backends.whisper.decoding import WindowResult, compression_ratio
from backends.whisper.tokenizer import WhisperTokenizer

Y = TypeVar("Y")
S = TypeVar("S")
T = TypeVar("T")

DEFAULT_TEMPERATURES: tuple[float, ...] = (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)
TEMPERATURE_INCREMENT = 0.2


def temperature_ladder(start: float, increment: float = TEMPERATURE_INCREMENT) -> tuple[float, ...]:
    """Temperatures from ``start`` up to 1.0 in steps of ``increment`` (openai-whisper's CLI).

    ``start=0`` gives the default ladder ``(0.0, 0.2, ..., 1.0)``; ``start=1`` gives ``(1.0,)``.
    """
    if not 0.0 <= start <= 1.0:
        raise ValueError(f"temperature must be between 0 and 1, got {start}")
    if not increment > 0:
        raise ValueError("the temperature increment must be positive")
    ladder: list[float] = []
    k = 0
    while (value := round(start + k * increment, 10)) <= 1.0:
        ladder.append(value)
        k += 1
    return tuple(ladder)


@attrs.frozen
class FallbackOptions:
    """faster-whisper's defaults: six temperatures, thresholds 2.4 / -1.0 / 0.6, best of 5."""

    temperatures: tuple[float, ...] = DEFAULT_TEMPERATURES
    compression_ratio_threshold: float | None = 2.4
    log_prob_threshold: float | None = -1.0
    no_speech_threshold: float | None = 0.6
    best_of: int = 5


Generate = Callable[[float], WindowResult]
"""Decode the current window after the current prompt at one temperature."""

GenerateSteps = Callable[[float], Generator[Y, S, WindowResult]]
""":data:`Generate` as a program: its model operations are yielded to the caller's driver."""


def generate_with_fallback(
    generate: Generate, tok: WhisperTokenizer, options: FallbackOptions
) -> WindowResult:
    """Decode at rising temperatures until a result passes; see the module docstring."""
    return run_now(fallback_steps(lambda temperature: now(generate(temperature)), tok, options))


def fallback_steps(
    generate: GenerateSteps[Y, S], tok: WhisperTokenizer, options: FallbackOptions
) -> Generator[Y, S, WindowResult]:
    """:func:`generate_with_fallback` as a program over ``generate`` 's operations."""
    if not options.temperatures:
        raise ValueError("at least one temperature is needed")
    all_results: list[WindowResult] = []
    below_ratio: list[WindowResult] = []
    for temperature in options.temperatures:
        raw = yield from generate(temperature)
        ratio = compression_ratio(tok.decode(raw.tokens).strip())
        result = attrs.evolve(raw, temperature=temperature, compression_ratio=ratio)
        all_results.append(result)
        needs_fallback = False
        threshold = options.compression_ratio_threshold
        if threshold is not None:
            if ratio > threshold:
                needs_fallback = True
            else:
                below_ratio.append(result)
        log_prob = options.log_prob_threshold
        if log_prob is not None and result.avg_logprob < log_prob:
            needs_fallback = True
        if (
            options.no_speech_threshold is not None
            and result.no_speech_prob > options.no_speech_threshold
            and log_prob is not None
            and result.avg_logprob < log_prob
        ):
            needs_fallback = False  # silence
        if not needs_fallback:
            return result
    best = max(below_ratio or all_results, key=lambda r: r.avg_logprob)
    return attrs.evolve(best, temperature=options.temperatures[-1])


def now(value: T) -> Generator[Any, Any, T]:
    """A program that returns ``value`` at once, with no operation."""
    return value
    yield  # pragma: no cover  (makes this a generator)


def run_now(program: Generator[Any, Any, T]) -> T:
    """The result of a program that yields no operation."""
    try:
        op = next(program)
    except StopIteration as stop:
        result: T = stop.value
        return result
    raise RuntimeError(f"expected a program without operations, got {op!r}")
