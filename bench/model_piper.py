"""Piper TTS: voxpool's numpy VITS against piper-tts (onnxruntime), same text, same threads.

Each row synthesises one text end to end (phonemes, model, piper's output stage)
through the public API of each side: ``PiperSession.run`` and
``PiperVoice.synthesize``. Both use noise_w = 0 so they place the very same
frames (the duration noise of onnxruntime is not seedable) and do the same work;
noise_scale stays at the voice's 0.667. ``rtf`` = compute time / audio duration,
``ratio`` = numpy time / onnxruntime time; ``cpu_ms``/``cpu_ratio`` the same in
process CPU time, steadier on a shared machine. Runs alternate between the two.
``--profile`` adds where the numpy time goes (text encoder, duration predictor,
flow, HiFi-GAN generator); ``--idle`` the same stages on the short sentence, run back
to back and after :data:`IDLE_S` idle (what a request arriving at an idle server
meets). ``--http`` adds ``voxpool-http``: the same text, one request at a time,
through a real, otherwise idle ``voxpool serve`` (``threads: N``, one slot) on
loopback, posted to ``/v1/audio/speech`` for raw PCM (HTTP, the server's runtime and
the encoding included); its CPU time is the server process's plus this client's.
Run: ``.venv/bin/python bench/model_piper.py [threads] [--repeats=N] [--profile] [--idle]
[--http]`` (``N`` timed runs of each side, alternating; 5 by default).
"""

from __future__ import annotations

import contextlib
import functools
import json
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if sys.path[:1] != [str(ROOT)]:  # the project's packages, not bench/backends.py
    sys.path.insert(0, str(ROOT))

import backends  # noqa: E402,F401  # before numpy: OpenBLAS's environment as the server has it

# isort: split
from bench.common import array_backend as _array_backend  # noqa: E402
from bench.common import blas_threads, machine, served_model  # noqa: E402

MODEL = "piper"
PAUSE_S = 0.2
"""Idle time before each timed run (see :func:`_interleaved`)."""
IDLE_S = 0.5
"""``--idle``: the pause before each run of the stage timings that shows what idling costs."""
TEXTS = {
    "short (1 sentence)": "Hello world, this is a test.",
    "medium (1 sentence)": (
        "The quick brown fox jumps over the lazy dog near the riverbank at dawn."
    ),
    "paragraph (3 sentences)": (
        "Piper is a fast, local neural text to speech system. It sounds great. "
        "This paragraph has three sentences, so it is synthesised in three chunks."
    ),
}


def _interleaved(
    fns: Sequence[Callable[[], float]],
    repeats: int,
    other_cpu: Sequence[Callable[[], float] | None] = (),
) -> list[tuple[float, float, float]]:
    """Per function: (median wall s, median CPU s, audio s). Runs alternate A, B, A, B...
    so every side sees the same machine load; one warm-up run each first. Each run starts
    after a pause of :data:`PAUSE_S` (not timed): onnxruntime's pool threads spin after a
    run, and a run started at once found its second core taken by them. CPU is this
    process's, plus ``other_cpu[i]()``'s difference where given (a server's)."""
    extra = list(other_cpu) + [None] * (len(fns) - len(other_cpu))
    walls: list[list[float]] = [[] for _ in fns]
    cpus: list[list[float]] = [[] for _ in fns]
    audio = [fn() for fn in fns]
    for _ in range(repeats):
        for i, fn in enumerate(fns):
            time.sleep(PAUSE_S)
            other = extra[i]
            o0 = other() if other is not None else 0.0
            t0, c0 = time.perf_counter(), time.process_time()
            audio[i] = fn()
            walls[i].append(time.perf_counter() - t0)
            c1 = time.process_time()
            o1 = other() if other is not None else 0.0
            cpus[i].append(c1 - c0 + o1 - o0)
    return [
        (statistics.median(w), statistics.median(c), a)
        for w, c, a in zip(walls, cpus, audio, strict=True)
    ]


def _root_first() -> None:
    """Import the project's packages, not bench/core.py (the script's folder is on sys.path)."""
    if sys.path[:1] != [str(ROOT)]:
        sys.path.insert(0, str(ROOT))


def _piper_voice(threads: int) -> Any:
    import onnxruntime as ort
    from piper.config import PiperConfig
    from piper.voice import PiperVoice

    from backends.piper.loader import voice_paths

    onnx_path, json_path = voice_paths()
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    session = ort.InferenceSession(str(onnx_path), opts, providers=["CPUExecutionProvider"])
    config = PiperConfig.from_dict(json.loads(json_path.read_text(encoding="utf-8")))
    return PiperVoice(session=session, config=config)


def bench(
    threads: int = 1, repeats: int = 5, backend: str = "numpy", http: bool = False
) -> list[dict[str, object]]:
    """Both runtimes side by side; one row per (impl, input). ``http`` adds ``voxpool-http``
    (the same request through a real ``voxpool serve``, see the module's docstring)."""
    label_ours = f"voxpool-{backend}"
    _root_first()
    array_backend = _array_backend(backend)
    from piper.config import SynthesisConfig

    from backends.piper import PiperRequest, load_factory

    session = load_factory(array_backend).create()
    voice = _piper_voice(threads)
    syn = SynthesisConfig(noise_w_scale=0.0)
    rate = int(voice.config.sample_rate)
    rows: list[dict[str, object]] = []
    served = served_model(MODEL, threads) if http else contextlib.nullcontext(None)
    with served as server, blas_threads(threads):
        for label, text in TEXTS.items():
            request = PiperRequest(text, noise_w=0.0, seed=0)

            def ours(request: PiperRequest = request) -> float:
                return float(session.run(request).duration_s)

            def peer(text: str = text) -> float:
                samples = sum(int(c.audio_float_array.size) for c in voice.synthesize(text, syn))
                return samples / rate

            impls = [label_ours, "piper-tts/onnxruntime"]
            fns: list[Callable[[], float]] = [ours, peer]
            other_cpu: list[Callable[[], float] | None] = [None, None]
            if server is not None:
                client, server_cpu = server
                impls.append("voxpool-http")
                fns.append(functools.partial(_post, client, text, rate))
                other_cpu.append(server_cpu)
            medians = _interleaved(fns, repeats, other_cpu)
            ort_s, ort_cpu = medians[1][:2]
            for impl, (sec, cpu, audio_s) in zip(impls, medians, strict=True):
                rows.append(
                    {
                        "model": MODEL,
                        "impl": impl,
                        "input": f"{label}, {audio_s:.2f} s audio",
                        "median_ms": round(sec * 1e3, 1),
                        "rtf": round(sec / audio_s, 4),
                        "ratio": round(sec / ort_s, 3),
                        "cpu_ms": round(cpu * 1e3, 1),
                        "cpu_ratio": round(cpu / ort_cpu, 3),
                        "threads": threads,
                    }
                )
    return rows


def _post(client: Any, text: str, rate: int) -> float:
    """``text`` through ``/v1/audio/speech`` (raw 16-bit PCM, ``noise_w`` 0 as above, seed 0):
    the audio's seconds."""
    body = {
        "model": MODEL,
        "input": text,
        "response_format": "pcm",
        "noise_w": 0.0,
        "seed": 0,
    }
    r = client.post("/v1/audio/speech", json=body)
    r.raise_for_status()
    return len(r.content) / 2 / rate


def profile(
    threads: int = 1, repeats: int = 5, text: str = "paragraph (3 sentences)", pause: float = 0.0
) -> dict[str, float]:
    """Median ms per model stage of the numpy implementation on ``text`` (a key of
    :data:`TEXTS`), each run after ``pause`` idle seconds (0: back to back)."""
    _root_first()
    from backends.piper import PiperRequest, load_factory
    from backends.piper import model as piper_model

    # the numpy backend runs the encoder, the flow and the generator on their host paths
    stages = (
        "encode",
        "encode_host",
        "log_durations",
        "flow_reverse",
        "flow_reverse_host",
        "generate",
        "generate_host",
    )
    spent: dict[str, list[float]] = {s: [] for s in (*stages, "total")}
    originals = {s: getattr(piper_model, s) for s in stages}
    current: dict[str, float] = {}

    def timed(name: str) -> Callable[..., Any]:
        def run(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            out = originals[name](*args, **kwargs)
            current[name] = current.get(name, 0.0) + time.perf_counter() - t0
            return out

        return run

    session = load_factory().create()
    request = PiperRequest(TEXTS[text], noise_w=0.0, seed=0)
    try:
        for s in stages:
            setattr(piper_model, s, timed(s))
        with blas_threads(threads):
            session.run(request)
            for _ in range(repeats):
                time.sleep(pause)
                current.clear()
                t0 = time.perf_counter()
                session.run(request)
                current["total"] = time.perf_counter() - t0
                for s in spent:
                    spent[s].append(current.get(s, 0.0))
    finally:
        for s in stages:
            setattr(piper_model, s, originals[s])
    return {s: round(statistics.median(v) * 1e3, 1) for s, v in spent.items()}


def _table(rows: list[dict[str, object]]) -> str:
    keys = list(rows[0])
    widths = {k: max(len(k), *(len(str(r[k])) for r in rows)) for k in keys}
    lines = [" | ".join(k.ljust(widths[k]) for k in keys)]
    lines.append("-+-".join("-" * widths[k] for k in keys))
    lines += [" | ".join(str(r[k]).ljust(widths[k]) for k in keys) for r in rows]
    return "\n".join(lines)


if __name__ == "__main__":
    print(machine())
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    n_threads = int(args[0]) if args else 1
    counts = [int(a.split("=", 1)[1]) for a in sys.argv[1:] if a.startswith("--repeats=")]
    repeats = counts[-1] if counts else 5
    print(_table(bench(threads=n_threads, repeats=repeats, http="--http" in sys.argv)))
    if "--profile" in sys.argv:
        print(f"\nnumpy stages, ms (paragraph, {n_threads} thread(s)):", profile(threads=n_threads))
    if "--idle" in sys.argv:
        for pause in (0.0, IDLE_S, 0.0, IDLE_S):
            stages = profile(n_threads, repeats=9, text="short (1 sentence)", pause=pause)
            print(f"numpy stages, ms (short, {n_threads} thread(s), {pause} s idle first):", stages)
