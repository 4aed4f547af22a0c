"""Batched engines (#14): requests served serially by one session vs together by the engine.

Whisper tiny.en: 8 inputs (the 5 fixtures of ``tests/data/whisper`` and 3 made from
them: two joined pairs and the first 25 s of the story), transcribed one after
another by one session (``serial``) vs all 8 as members of ``factory.engine(8)``
(``batch 8``: they join together; each step decodes one token of every member
with one product per linear layer; windows opened in the same step share one
encoder pass). ``x2 continuous``: the 8 inputs twice (16 requests) through the 8
keys, each request joining as soon as a key is free (continuous batching).
Silero VAD: 8 streams of 20-60 s by one session vs the engine at batch 8 (8
chunks of every member per step). Runs alternate serial/batched so load drift
on a shared machine hits both alike; medians of ``repeats`` runs, wall and
process CPU time, with 1 and 2 BLAS threads (threadpoolctl). ``check`` says
whether every member's tokens (Whisper) or probabilities within 1e-5 and events
(VAD) equal the session's. A second table times one Whisper decoder step (one
token for M members and its vocabulary projection) against M.
Run: ``.venv/bin/python bench/batched_models.py [repeats]``; ``--piper`` runs only the Piper
wave (:func:`piper_bench`).
"""

from __future__ import annotations

import json
import statistics
import sys
import time
import wave
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.common import blas_threads, markdown_table  # noqa: E402

DATA = ROOT / "tests" / "data" / "whisper"
RATE = 16000
BATCH = 8


def _use_repo_root() -> None:
    """Import the repo's packages (bench/core.py would otherwise shadow ``core``)."""
    if sys.path[:1] != [str(ROOT)]:
        sys.path.insert(0, str(ROOT))


def _whisper_inputs() -> list[tuple[str, np.ndarray]]:
    clips = {}
    for meta in json.loads((DATA / "fixtures.json").read_text()):
        with wave.open(str(DATA / meta["file"])) as f:
            pcm = np.frombuffer(f.readframes(f.getnframes()), dtype="<i2")
        clips[meta["name"]] = pcm.astype(np.float32) / np.float32(32768.0)
    out = list(clips.items())
    out.append(("meeting+recipe", np.concatenate([clips["meeting"], clips["recipe"]])))
    out.append(("weather+short", np.concatenate([clips["weather"], clips["short"]])))
    out.append(("story[:25s]", clips["story"][: 25 * RATE]))
    return out


def _vad_inputs(clip: np.ndarray) -> list[np.ndarray]:
    """8 streams of 20-60 s: the speech clip, reversed, scaled and cut, with quiet noise."""
    rng = np.random.default_rng(14)
    out = []
    for i in range(BATCH):
        seconds = 20 + 40 * i // (BATCH - 1)
        base = np.resize(clip if i % 2 == 0 else clip[::-1], seconds * RATE)
        noise = np.asarray(rng.normal(0, 0.01, base.shape), dtype=np.float32)
        out.append(np.asarray((0.5 + 0.1 * i) * base + noise, dtype=np.float32))
    return out


def _drive(engine: Any, requests: list[Any], stream: bool) -> list[list[Any]]:
    """Each request joins as soon as a key is free; every active member steps until done.

    Returns each request's chunks.
    """
    from core.engine import Member

    chunks: list[list[Any]] = [[] for _ in requests]
    pending = list(range(len(requests)))
    free = list(range(engine.max_batch))
    owner: dict[int, int] = {}
    active: list[int] = []

    def deliver(emitted: list[Any]) -> None:
        for e in emitted:
            if e.error is not None:
                raise e.error
            chunks[owner[e.key]].extend(e.chunks)
            if e.done:
                active.remove(e.key)
                engine.leave(e.key)
                free.append(e.key)

    while pending or active:
        members = []
        while pending and free:
            key, index = free.pop(0), pending.pop(0)
            owner[key] = index
            members.append(Member(key, requests[index], stream))
        active.extend(m.key for m in members)
        deliver(engine.join(members))
        if active:
            deliver(engine.step(list(active)))
    return chunks


def _timed(fns: dict[str, Callable[[], Any]], repeats: int) -> dict[str, tuple[float, float, Any]]:
    """Median wall and CPU seconds of each function (order alternating per pass), last output."""
    wall: dict[str, list[float]] = {n: [] for n in fns}
    cpu: dict[str, list[float]] = {n: [] for n in fns}
    last: dict[str, Any] = {}
    names = list(fns)
    for rep in range(repeats):
        for name in names if rep % 2 == 0 else names[::-1]:
            w0, c0 = time.perf_counter(), time.process_time()
            last[name] = fns[name]()
            wall[name].append(time.perf_counter() - w0)
            cpu[name].append(time.process_time() - c0)
    return {n: (statistics.median(wall[n]), statistics.median(cpu[n]), last[n]) for n in names}


def _whisper_check(serial: list[Any], batched: list[list[Any]]) -> str:
    same = 0
    for ours, (result,) in zip(serial, batched, strict=True):
        tokens = [w.result.tokens for w in ours.windows]
        same += tokens == [w.result.tokens for w in result.windows]
    return f"{same}/{len(serial)} tokens identical"


def _vad_check(serial: list[Any], batched: list[list[Any]]) -> str:
    worst, events = 0.0, 0
    for ours, chunks in zip(serial, batched, strict=True):
        worst = max(
            worst,
            max(abs(a.probability - b.probability) for a, b in zip(ours, chunks, strict=True)),
        )
        events += [c.events for c in ours] == [c.events for c in chunks]
    return f"max |dp| {worst:.1e}, {events}/{len(serial)} events identical"


Case = tuple[str, float, Callable[[], Any], Callable[[], Any], Callable[..., str]]


def _cases() -> list[Case]:
    _use_repo_root()
    from backends import silero_vad, whisper
    from tests.models.silero_vad_reference import fixture

    asr, vad = whisper.load_factory(), silero_vad.load_factory()
    asr_inputs = _whisper_inputs()
    once = [whisper.WhisperRequest(audio) for _, audio in asr_inputs]
    twice = once + once
    audio_s = sum(len(a) for _, a in asr_inputs) / RATE
    vad_requests = [silero_vad.VadRequest(a) for a in _vad_inputs(np.array(fixture()[0]))]
    asr_session, vad_session = asr.create(), vad.create()
    return [
        (
            "whisper-tiny.en, 8 inputs",
            audio_s,
            lambda: [asr_session.run(r) for r in once],
            lambda: _drive(asr.engine(BATCH), once, stream=False),
            _whisper_check,
        ),
        (
            "whisper-tiny.en, x2 continuous",
            2 * audio_s,
            lambda: [asr_session.run(r) for r in twice],
            lambda: _drive(asr.engine(BATCH), twice, stream=False),
            _whisper_check,
        ),
        (
            "silero_vad, 8 streams",
            sum(len(r.audio) for r in vad_requests) / RATE,
            lambda: [list(vad_session.stream(r)) for r in vad_requests],
            lambda: _drive(vad.engine(BATCH), vad_requests, stream=True),
            _vad_check,
        ),
    ]


def bench(repeats: int = 3) -> list[dict[str, object]]:
    """One row per (case, BLAS threads): serial vs batched wall and CPU seconds."""
    rows: list[dict[str, object]] = []
    cases = _cases()
    for threads in (1, 2):
        with blas_threads(threads):
            for model, seconds, serial, batched, check in cases:
                medians = _timed({"serial": serial, "batched": batched}, repeats)
                s_wall, s_cpu, s_out = medians["serial"]
                b_wall, b_cpu, b_out = medians["batched"]
                rows.append(
                    {
                        "case": model,
                        "audio_s": round(seconds, 1),
                        "threads": threads,
                        "serial_s": round(s_wall, 2),
                        f"batch{BATCH}_s": round(b_wall, 2),
                        "ratio": round(s_wall / b_wall, 2),
                        "serial_cpu_s": round(s_cpu, 2),
                        f"batch{BATCH}_cpu_s": round(b_cpu, 2),
                        "cpu_ratio": round(s_cpu / b_cpu, 2),
                        "check": check(s_out, b_out),
                    }
                )
                print(rows[-1], flush=True)
    return rows


def decoder_steps(repeats: int = 30) -> list[dict[str, object]]:
    """Median milliseconds of one decoder step plus vocabulary projection, for M members."""
    _use_repo_root()
    from backends import whisper
    from backends.whisper import model

    factory = whisper.load_factory()
    be, w = factory.backend, factory.weights
    mel = np.random.default_rng(0).normal(size=(1, 80, 3000)).astype(np.float32)
    states = [model.DecoderState(be, w) for _ in range(BATCH)]
    encoded = model.encode(be, w, be.to_device(mel))
    for state in states:
        state.set_memory(encoded)
    rows: list[dict[str, object]] = []
    for threads in (1, 2):
        with blas_threads(threads):
            for members in (1, 2, 4, 8):
                times = []
                for _ in range(repeats):
                    for state in states:
                        state.length = 20
                    t0 = time.perf_counter()
                    be.to_host(model.step_logits(be, w, states[:members], [100] * members))
                    times.append(time.perf_counter() - t0)
                ms = statistics.median(times) * 1e3
                rows.append(
                    {
                        "threads": threads,
                        "members": members,
                        "step_ms": round(ms, 2),
                        "ms_per_member": round(ms / members, 2),
                    }
                )
    return rows


PIPER_TEXTS = (
    "Good morning.",
    "The quick brown fox jumps over the lazy dog near the riverbank at dawn.",
    "Hello there. How are you today?",
    "Piper is a fast, local neural text to speech system. It sounds great.",
    "Yes.",
    "Batching puts the sentences of many requests into one synthesis.",
    "Voice activity detection finds speech. Whisper transcribes it. Piper speaks.",
    "The weather is lovely today, let us go for a walk.",
)


def piper_bench(repeats: int = 3) -> list[dict[str, object]]:
    """Piper (#14): a wave of 8 texts (1 to 3 sentences, seed i) run one after another by one
    session vs as 8 members of ``factory.engine(8)`` (one sentence of every member per step,
    synthesized as one packed batch), 1 and 2 BLAS threads. ``check``: durations identical
    and the largest |batched - serial| sample."""
    _use_repo_root()
    from backends import piper

    factory = piper.load_factory()
    session = factory.create()
    requests = [piper.PiperRequest(t, seed=i) for i, t in enumerate(PIPER_TEXTS)]

    def check(serial: list[Any], batched: list[list[Any]]) -> str:
        same = sum(a.audio.shape == b.audio.shape for a, (b,) in zip(serial, batched, strict=True))
        worst = max(
            float(np.max(np.abs(a.audio - b.audio), initial=0))
            for a, (b,) in zip(serial, batched, strict=True)
            if a.audio.shape == b.audio.shape
        )
        return f"{same}/{len(serial)} lengths identical, max |da| {worst:.1e}"

    rows: list[dict[str, object]] = []
    for threads in (1, 2):
        with blas_threads(threads):
            medians = _timed(
                {
                    "serial": lambda: [session.run(r) for r in requests],
                    "batched": lambda: _drive(factory.engine(BATCH), requests, stream=False),
                },
                repeats,
            )
            s_wall, s_cpu, s_out = medians["serial"]
            b_wall, b_cpu, b_out = medians["batched"]
            audio_s = sum(r.duration_s for r in s_out)
            rows.append(
                {
                    "case": f"piper joe-medium, {len(requests)} texts",
                    "audio_s": round(audio_s, 1),
                    "threads": threads,
                    "serial_s": round(s_wall, 2),
                    f"batch{BATCH}_s": round(b_wall, 2),
                    "ratio": round(s_wall / b_wall, 2),
                    "serial_cpu_s": round(s_cpu, 2),
                    f"batch{BATCH}_cpu_s": round(b_cpu, 2),
                    "cpu_ratio": round(s_cpu / b_cpu, 2),
                    "check": check(s_out, b_out),
                }
            )
            print(rows[-1], flush=True)
    return rows


if __name__ == "__main__":
    _args = [a for a in sys.argv[1:] if not a.startswith("--")]
    _repeats = int(_args[0]) if _args else 3
    if "--piper" in sys.argv:  # only the Piper wave (piper_bench)
        print(markdown_table(piper_bench(_repeats)))
    else:
        print(markdown_table(decoder_steps()), flush=True)
        print(markdown_table(bench(_repeats)))
