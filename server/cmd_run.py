"""``voxpool run tts|asr|vad``: run one bundled model once, without a server.

Long inputs show progress: TTS reports each sentence as it is synthesized, ASR
prints each segment as its 30-second window is decoded, VAD reports segments.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from backends.base import ArrayBackend
from server.audio import AudioError, load_for_model, wav_bytes
from server.provider import make_backend


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
        audio = load_for_model(Path(args.input).read_bytes(), 16000)
    except (OSError, AudioError) as exc:
        print(f"voxpool run {args.task}: cannot read {args.input}: {exc}", file=sys.stderr)
        return 2
    return asr(args, backend, audio) if args.task == "asr" else vad(args, backend, audio)


def tts(args: argparse.Namespace, backend: ArrayBackend) -> int:
    import numpy as np

    from backends.piper import PiperRequest, load_factory

    if not args.text:
        print("voxpool run tts: --text is required", file=sys.stderr)
        return 2
    if not args.output:
        print("voxpool run tts: -o/--output is required", file=sys.stderr)
        return 2
    session = load_factory(backend, mode="streaming").create()
    t0 = time.perf_counter()
    pieces = []
    rate = 22050
    for chunk in session.stream(PiperRequest(text=args.text, seed=args.seed)):
        pieces.append(chunk.audio)
        rate = int(chunk.sample_rate)
        print(
            f"  sentence {chunk.index + 1}: {chunk.audio.size / rate:.2f} s of audio",
            file=sys.stderr,
        )
    audio = np.concatenate(pieces) if pieces else np.zeros(0, np.float32)
    Path(args.output).write_bytes(wav_bytes(audio, rate))
    wall = time.perf_counter() - t0
    print(
        f"wrote {args.output}: {audio.size / rate:.2f} s at {rate} Hz in {wall:.2f} s",
        file=sys.stderr,
    )
    return 0


def asr(args: argparse.Namespace, backend: ArrayBackend, audio: object) -> int:
    from backends.whisper import WhisperRequest, load_factory

    session = load_factory(backend).create()
    texts = []
    for seg in session.stream(WhisperRequest(audio=audio)):
        print(
            f"  [{seg.start:7.2f} -> {seg.end:7.2f}] {seg.text.strip()}",
            file=sys.stderr,
            flush=True,
        )
        texts.append(seg.text)
    print("".join(texts).strip())
    return 0


def vad(args: argparse.Namespace, backend: ArrayBackend, audio: object) -> int:
    from backends.silero_vad import VadRequest, load_factory

    session = load_factory(backend).create()
    result = session.run(VadRequest(audio=audio))
    for seg in result.segments:
        print(f"speech {seg.start_s:8.3f} -> {seg.end_s:8.3f} s")
    print(
        f"{len(result.segments)} segment(s) in {result.duration_s:.2f} s of audio", file=sys.stderr
    )
    return 0
