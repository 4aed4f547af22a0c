"""What a model family is to the server: one typed :class:`Family` entry and its protocols.

A family is a package ``backends/<family>/`` exposing ``load_factory(backend, **options)``
plus one entry module here (``server/families/<family>.py``) whose :class:`Family` is
listed in :mod:`server.families.registry`. Everything the server, the CLI, the
validation gate and the benches know about a family is read from its entry: its
task, its modes, the ``load_options`` it accepts and how a model's spec fills
``load_factory``'s keywords, its voices, its HTTP adapter (:class:`FamilyAdapter`),
its validation plan (:class:`ValidationPlan`), its bundled weights, the request of
``voxpool run`` and the bench workload. This module imports no family, no HTTP
framework and no array library: the configuration reads it without them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import attrs

MODES = ("offline", "streaming")
"""The execution modes a model may be registered in."""
OPENAI_VOICES = (
    "alloy",
    "ash",
    "ballad",
    "cedar",
    "coral",
    "echo",
    "fable",
    "marin",
    "nova",
    "onyx",
    "sage",
    "shimmer",
    "verse",
)
"""OpenAI's speech voice names: by default each (and ``default``) is an alias of a TTS model's
default voice, so clients written for OpenAI work unchanged (``voice_aliases`` overrides)."""
SPEECH_RESPONSE_FORMATS = ("mp3", "opus", "aac", "flac", "wav", "pcm", "json", "b64_json")
"""Speech ``response_format`` values (a TTS model's ``default_request_options`` may set one)."""


def default_voice_aliases(voices: Sequence[str]) -> dict[str, str]:
    """The alias table of a family with ``voices``: every OpenAI voice name and ``default`` to
    its first voice (empty for a family without voices)."""
    return {name: voices[0] for name in (*OPENAI_VOICES, "default")} if voices else {}


# --------------------------------------------------------------- HTTP adapters
class SpeechLimits(Protocol):
    """The configuration's per-request speech limits (``server.config.ServerConfig`` has them)."""

    @property
    def max_input_chars(self) -> int: ...

    @property
    def max_speech_seconds(self) -> float: ...

    @property
    def speech_seconds_per_char(self) -> float: ...

    @property
    def max_sentence_seconds(self) -> float: ...


class FamilyAdapter(Protocol):
    """What every family's HTTP adapter does: request fields in, JSON out.

    ``check`` refuses (a 400) what a model in ``mode`` cannot serve (``what``:
    ``"stream"`` or ``"batch"``); ``json`` / ``chunk_json`` turn a result / a
    stream chunk into JSON; ``duration`` is the audio seconds of a result.
    """

    @property
    def task(self) -> str: ...

    def check(self, spec_id: str, mode: str, what: str) -> None: ...

    def voices(self) -> list[str]: ...

    def json(self, result: Any) -> dict[str, Any]: ...

    def chunk_json(self, chunk: Any) -> dict[str, Any]: ...

    def duration(self, result: Any) -> float: ...


class SpeechAdapter(FamilyAdapter, Protocol):
    """A TTS family's adapter: text (and a voice or an alias) in, audio out."""

    def aliases(self, spec_extra: Mapping[str, Any] | None = None) -> dict[str, str]: ...

    def request(
        self,
        body: Mapping[str, Any],
        defaults: Mapping[str, str],
        config: SpeechLimits,
        aliases: Mapping[str, str] | None = None,
    ) -> Any: ...

    def audio(self, result: Any) -> tuple[Any, int]: ...


class AudioInAdapter(FamilyAdapter, Protocol):
    """An ASR or VAD family's adapter: audio at ``sample_rate`` (and options) in."""

    @property
    def sample_rate(self) -> int: ...

    def check_fields(self, body: Mapping[str, Any]) -> Any: ...

    def request(self, body: Mapping[str, Any], audio: Any) -> Any: ...


# --------------------------------------------------------------- validation
@attrs.frozen
class Case:
    """One effective input of a validation plan: the request and what identifies it in the
    record."""

    name: str
    request: Any
    meta: dict[str, Any]


class ValidationPlan(Protocol):
    """A family's inputs to the model gate (docs/validation.md): fixed cases, stream cases, an
    invalid request, and the fingerprints that must match exactly across slots."""

    @property
    def stream_mode(self) -> str: ...

    @property
    def invalid_reason(self) -> str: ...

    def cases(self) -> list[Case]: ...

    def stream_cases(self) -> list[Case]: ...

    def invalid(self) -> Any: ...

    def fingerprint(self, result: Any) -> str: ...

    def chunks_fingerprint(self, chunks: Sequence[Any]) -> str: ...

    @property
    def batched_tolerance(self) -> str:
        """What a batched result may differ by from its unbatched reference, declared before any
        run ("exact" for families whose batched engine is bit-identical at one BLAS thread)."""
        ...

    def batched_equal(self, got: Any, reference: Any) -> bool:
        """Whether a batched result equals its unbatched ``reference`` within
        :attr:`batched_tolerance` (the gate asks only when the fingerprints differ)."""
        ...

    def batched_chunks_equal(self, got: Sequence[Any], reference: Sequence[Any]) -> bool:
        """:meth:`batched_equal` for the chunks of one stream."""
        ...

    def live(self, request: Any) -> tuple[Any, list[Any]] | None:
        """``request`` as a live stream (its input pushed while it runs): the request to open
        it with and the pieces to push, or None when the family takes no live input."""
        ...


# --------------------------------------------------------------- CLI and benches
@attrs.frozen
class RunInput:
    """What ``voxpool run`` was given: text to speak (tts) or decoded 16 kHz audio (asr, vad)."""

    text: str | None = None
    audio: Any = None
    seed: int = 0


@attrs.frozen
class Workload:
    """A bench's requests for one family (``bench/slots.py``): ``requests(n)`` are the n
    requests of one wave, ``fingerprint`` reduces a result to what must be identical."""

    label: str
    requests: Callable[[int], list[Any]]
    fingerprint: Callable[[Any], bytes | str]


# --------------------------------------------------------------- the entry
LoadOptions = Mapping[str, tuple[str, ...] | None]
"""A family's accepted ``load_options``: key -> allowed values (None: any non-empty path)."""


@attrs.frozen
class Family:
    """One model family: everything the server, CLI, gate and benches know about it.

    ``backend`` is the module with ``load_factory(backend, **options)``. A model's
    spec fills its keywords by :meth:`load_kwargs`: its ``load_options``, then
    ``mode`` when ``mode_option`` is set, and its ``path`` as the keyword
    ``path_option`` names (a directory that must exist). ``embedded`` is this
    family's model in the embedded default configuration (id = the family's name;
    None: not there). ``adapter``, ``limit_error``, ``plan``, ``weights``,
    ``run_request`` and ``workload`` are callables so that their modules (HTTP, numpy, the backend)
    load only when used.
    """

    name: str
    task: str
    backend: str
    adapter: Callable[[], FamilyAdapter]
    modes: tuple[str, ...] = MODES
    load_options: LoadOptions = attrs.field(factory=dict)
    mode_option: bool = False
    path_option: str | None = None
    model_files: tuple[str, ...] = ()
    """Files a model directory (its ``path`` or ``path_option``) must hold: one without them
    is refused when the model is configured or loaded, not registered to fail later."""
    voices: tuple[str, ...] = ()
    embedded: Mapping[str, Any] | None = None
    limit_error: Callable[[], type[Exception]] | None = None
    """The exception its sessions raise for a request over the configured speech limits (a 400
    naming the limit, :func:`server.families.http.speech_limit_error`)."""
    plan: Callable[..., ValidationPlan] | None = None
    """Its validation plan, built with the validated model's load options as keyword
    arguments (:func:`server.validation.plans.plan`)."""
    weights: Callable[[], Sequence[Path]] | None = None
    run_request: Callable[[RunInput], Any] | None = None
    workload: Callable[[], Workload] | None = None
    packages: tuple[str, ...] = ()
    """The distributions its code and weights come from (the validation record's versions)."""
    bench: str | None = None
    """Its peer bench, ``bench/<bench>.py`` (``bench/models.py`` runs it)."""
    batching: bool = False
    """Its factories have ``engine(max_batch)`` (:class:`core.engine.BatchingFactory`): a model
    may be registered with ``batching: true`` and run its requests batched across requests."""

    def load_kwargs(
        self, mode: str, path: str = "", options: Mapping[str, Any] | None = None
    ) -> dict[str, Any]:
        """``load_factory``'s keywords for a model in ``mode`` at ``path`` with ``options``."""
        kwargs = dict(options or {})
        if self.mode_option:
            kwargs.setdefault("mode", mode)
        if path and self.path_option is not None:
            kwargs.setdefault(self.path_option, path)
        return kwargs

    def model_dir(self, path: str, options: Mapping[str, Any]) -> str:
        """The directory a model's files are read from ('' when the family takes none)."""
        if self.path_option is None:
            return ""
        return str(options.get(self.path_option, path))

    def aliases(self) -> dict[str, str]:
        """The family's default voice alias table (:func:`default_voice_aliases`)."""
        return default_voice_aliases(self.voices)
