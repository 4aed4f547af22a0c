"""``voxpool run tts|asr|vad``: run one bundled model once, without a server.

The model is the first registered family serving the task (the family registry,
:func:`server.families.registry.for_task`), which also builds the request.
Long inputs show progress: TTS reports each sentence as it is synthesized, ASR
prints each segment as its 30-second window is decoded, VAD reports segments.
TTS writes ``-o`` in the format its suffix names (:data:`server.codecs.SPEECH_AUDIO`:
``.wav``, ``.mp3``, ``.opus``, ...; another suffix is refused before synthesis);
ASR and VAD print their result and, with ``-o``, also write it as JSON in the
server's shape (the family adapter's ``json``/``chunk_json``).
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from backends.base import ArrayBackend
from server.audio import AudioError, load_for_model
from server.families import registry
from server.families.base import RunInput
from server.provider import make_backend

INPUT_RATE = 16000
"""The sample rate ``asr`` and ``vad`` read their input WAV at (Whisper's and Silero's)."""


def main(args: argparse.Namespace) -> int:
    try:
        backend = make_backend(args.backend, "0")
    except Exception as exc:
        print(f"voxpool run: backend {args.backend!r} is not available: {exc}", file=sys.stderr)
        return 2
    if args.task == "tts":
        return tts(args, backend)
    if not args.input:
        print(f"voxpool run {args.task}: an input WAV file is required", file=sys.stderr)
        return 2
    try:
        audio = load_for_model(Path(args.input).read_bytes(), INPUT_RATE)
    except (OSError, AudioError) as exc:
        print(f"voxpool run {args.task}: cannot read {args.input}: {exc}", file=sys.stderr)
        return 2
    return asr(args, backend, audio) if args.task == "asr" else vad(args, backend, audio)


def session(task: str, backend: ArrayBackend, mode: str, given: RunInput) -> tuple[Any, Any]:
    """A session of the family serving ``task``, loaded in ``mode``, and its request for
    ``given``."""
    entry = registry.for_task(task)
    assert entry.run_request is not None  # for_task returns families that have one
    module = importlib.import_module(entry.backend)
    factory = module.load_factory(backend, **entry.load_kwargs(mode))
    return factory.create(), entry.run_request(given)


def speech_format(path: str) -> str | None:
    """The speech format ``path``'s suffix names (a key of :data:`server.codecs.SPEECH_AUDIO`),
    None when it names none."""
    from server.codecs import SPEECH_AUDIO

    name = Path(path).suffix.lower().removeprefix(".")
    return name if name in SPEECH_AUDIO else None


def write_json(path: str | None, result: dict[str, Any]) -> None:
    """Write ``result`` to ``path`` as JSON (nothing without a path)."""
    if path:
        Path(path).write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
        print(f"wrote {path}", file=sys.stderr)


def tts(args: argparse.Namespace, backend: ArrayBackend) -> int:
    import numpy as np

    from server.codecs import SPEECH_AUDIO, encode_speech, output_rate

    if not args.text:
        print("voxpool run tts: --text is required", file=sys.stderr)
        return 2
    if not args.output:
        print("voxpool run tts: -o/--output is required", file=sys.stderr)
        return 2
    fmt = speech_format(args.output)
    if fmt is None:
        known = ", ".join(f".{name}" for name in SPEECH_AUDIO)
        print(
            f"voxpool run tts: cannot write {args.output}: unknown audio format; "
            f"use a suffix among {known}",
            file=sys.stderr,
        )
        return 2
    voice, request = session("tts", backend, "streaming", RunInput(text=args.text, seed=args.seed))
    t0 = time.perf_counter()
    pieces = []
    rate = 22050
    for chunk in voice.stream(request):
        pieces.append(chunk.audio)
        rate = int(chunk.sample_rate)
        print(
            f"  sentence {chunk.index + 1}: {chunk.audio.size / rate:.2f} s of audio",
            file=sys.stderr,
        )
    audio = np.concatenate(pieces) if pieces else np.zeros(0, np.float32)
    Path(args.output).write_bytes(encode_speech(audio, rate, fmt))
    wall = time.perf_counter() - t0
    print(
        f"wrote {args.output}: {audio.size / rate:.2f} s of {fmt} at {output_rate(fmt, rate)} Hz "
        f"in {wall:.2f} s",
        file=sys.stderr,
    )
    return 0


def asr(args: argparse.Namespace, backend: ArrayBackend, audio: Any) -> int:
    model, request = session("asr", backend, "offline", RunInput(audio=audio))
    texts, segments = [], []
    for seg in model.stream(request):
        print(
            f"  [{seg.start:7.2f} -> {seg.end:7.2f}] {seg.text.strip()}",
            file=sys.stderr,
            flush=True,
        )
        texts.append(seg.text)
        segments.append(seg)
    print("".join(texts).strip())
    # the server's JSON: the result's text is its segments' joined (WhisperResult's rule)
    whole = SimpleNamespace(
        text="".join(texts), duration=len(audio) / INPUT_RATE, segments=segments
    )
    write_json(args.output, registry.for_task("asr").adapter().json(whole))
    return 0


def vad(args: argparse.Namespace, backend: ArrayBackend, audio: object) -> int:
    model, request = session("vad", backend, "offline", RunInput(audio=audio))
    result = model.run(request)
    for seg in result.segments:
        print(f"speech {seg.start_s:8.3f} -> {seg.end_s:8.3f} s")
    print(
        f"{len(result.segments)} segment(s) in {result.duration_s:.2f} s of audio", file=sys.stderr
    )
    write_json(args.output, registry.for_task("vad").adapter().json(result))
    return 0
