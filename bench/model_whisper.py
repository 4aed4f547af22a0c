"""Whisper tiny.en: voxpool's numpy backend against faster-whisper (CTranslate2), same inputs.

Every fixture of ``tests/data/whisper`` is transcribed by our numpy session and by
faster-whisper ``float32`` and ``int8`` (beam 1, temperature 0 only, VAD and word
timestamps off), all with the same thread count (BLAS via threadpoolctl,
CTranslate2 ``cpu_threads``). Runs alternate between implementations so load
drift on a shared machine hits all of them alike. ``rtf`` = compute time / audio
duration; ``ratio`` = our median / the peer's (``cpu_*``: the same in process CPU
time, robust to other load on a shared machine). ``--profile`` prints where our
time goes (encoder, decoder layers, vocabulary projection, host-side rules).
``--http`` adds ``voxpool-http``: one request at a time through a real, otherwise idle
``voxpool serve`` (``threads: N``, one slot) on loopback, the fixture's WAV posted to
``/v1/audio/transcriptions`` (HTTP, decoding and the server's runtime included); its
CPU time is the server process's plus this client's.
Run: ``.venv/bin/python bench/model_whisper.py [threads] [--profile [--fixture=NAME]] [--http]``
(``--fixture``: which input the profile runs, ``recipe`` unless named).
"""

from __future__ import annotations

import json
import statistics
import sys
import time
import wave
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if sys.path[:1] != [str(ROOT)]:  # the project's packages, not bench/backends.py
    sys.path.insert(0, str(ROOT))

import backends  # noqa: E402,F401  # before numpy: OpenBLAS's environment as the server has it

# isort: split
import numpy as np  # noqa: E402

from bench.common import array_backend as _array_backend  # noqa: E402
from bench.common import blas_threads, machine, served_model  # noqa: E402

DATA = ROOT / "tests" / "data" / "whisper"
MODEL = "whisper-tiny.en"


def _use_repo_root() -> None:
    """Import the repo's packages (bench/core.py would otherwise shadow ``core``)."""
    if sys.path[:1] != [str(ROOT)]:
        sys.path.insert(0, str(ROOT))


def _fixtures() -> list[tuple[str, np.ndarray]]:
    out = []
    for meta in json.loads((DATA / "fixtures.json").read_text()):
        with wave.open(str(DATA / meta["file"])) as f:
            pcm = np.frombuffer(f.readframes(f.getnframes()), dtype="<i2")
        out.append((meta["name"], pcm.astype(np.float32) / np.float32(32768.0)))
    return out


def _interleaved(
    fns: dict[str, Callable[[], object]],
    repeats: int,
    other_cpu: dict[str, Callable[[], float]] | None = None,
) -> dict[str, tuple[float, float]]:
    """Median (wall, CPU) seconds per call of each function, alternating the order per pass.

    CPU time (this process, all threads, plus ``other_cpu[name]()``'s difference: another
    process working for that call) is reported too: on a shared machine it is far less
    sensitive to other load than wall time, and with one thread it is the latency an
    idle machine would show.
    """
    names = list(fns)
    extra = other_cpu or {}
    for name in names:
        fns[name]()
    wall: dict[str, list[float]] = {name: [] for name in names}
    cpu: dict[str, list[float]] = {name: [] for name in names}
    for rep in range(repeats):
        for name in names if rep % 2 == 0 else names[::-1]:
            o0 = extra[name]() if name in extra else 0.0
            w0, c0 = time.perf_counter(), time.process_time()
            fns[name]()
            wall[name].append(time.perf_counter() - w0)
            c1 = time.process_time()
            o1 = extra[name]() if name in extra else 0.0
            cpu[name].append(c1 - c0 + o1 - o0)
    return {name: (statistics.median(wall[name]), statistics.median(cpu[name])) for name in names}


@contextmanager
def _served(threads: int) -> Iterator[tuple[Callable[[bytes], str], Callable[[], float]]]:
    """A real ``voxpool serve`` (this model, one slot, ``threads`` BLAS threads a call): yields
    (post a WAV and return the text, the server process's CPU seconds so far)."""
    family = "whisper"
    with served_model(family, threads) as (client, server_cpu):

        def post(wav: bytes) -> str:
            r = client.post(
                "/v1/audio/transcriptions",
                files={"file": ("a.wav", wav, "audio/wav")},
                data={"model": family},
            )
            r.raise_for_status()
            return str(r.json()["text"])

        yield post, server_cpu


def _peer(compute_type: str, threads: int) -> Any:
    from faster_whisper import WhisperModel

    from backends.whisper.session import default_model_dir

    return WhisperModel(
        str(default_model_dir()), device="cpu", compute_type=compute_type, cpu_threads=threads
    )


def _peer_run(model: Any, audio: np.ndarray) -> str:
    segments, _ = model.transcribe(
        audio, beam_size=1, temperature=[0.0], vad_filter=False, word_timestamps=False
    )
    return "".join(s.text for s in segments)


def bench(
    threads: int = 1, repeats: int = 5, backend: str = "numpy", http: bool = False
) -> list[dict[str, object]]:
    """One row per (impl, fixture): median latency, RTF and our/peer ratio; ``http`` adds
    ``voxpool-http`` (a request through ``voxpool serve``, see the module's docstring)."""
    ours = f"voxpool-{backend}"
    _use_repo_root()
    array_backend = _array_backend(backend)
    from backends.whisper import WhisperRequest, load_factory

    rows: list[dict[str, object]] = []
    with _served(threads) if http else _no_server() as served, blas_threads(threads):
        session = load_factory(array_backend).create()
        peers = {f"faster-whisper-{ct}": _peer(ct, threads) for ct in ("float32", "int8")}
        for name, audio in _fixtures():
            seconds = len(audio) / 16000
            request = WhisperRequest(audio)
            fns: dict[str, Callable[[], object]] = {ours: lambda r=request: session.run(r)}
            other_cpu: dict[str, Callable[[], float]] = {}
            if served is not None:
                post, server_cpu = served
                wav = _wav_bytes(name)
                fns["voxpool-http"] = lambda p=post, b=wav: p(b)
                other_cpu["voxpool-http"] = server_cpu
            for impl, model in peers.items():
                fns[impl] = lambda m=model, a=audio: _peer_run(m, a)
            medians = _interleaved(fns, repeats, other_cpu)
            ours_wall, ours_cpu = medians[ours]
            for impl, (wall, cpu) in medians.items():
                rows.append(
                    {
                        "model": MODEL,
                        "impl": impl,
                        "input": f"{name} ({seconds:.1f} s)",
                        "median_ms": round(wall * 1e3, 1),
                        "rtf": round(wall / seconds, 4),
                        "ratio": round(ours_wall / wall, 2),  # ours / this impl (1.0 for ours)
                        "cpu_ms": round(cpu * 1e3, 1),
                        "cpu_ratio": round(ours_cpu / cpu, 2),
                        "threads": threads,
                    }
                )
    return rows


@contextmanager
def _no_server() -> Iterator[None]:
    yield None


def _wav_bytes(name: str) -> bytes:
    """The fixture ``name``'s WAV file as it is stored."""
    meta = {m["name"]: m for m in json.loads((DATA / "fixtures.json").read_text())}
    return bytes((DATA / str(meta[name]["file"])).read_bytes())


def profile(threads: int = 1, name: str = "recipe") -> dict[str, float]:
    """CPU seconds per stage for one fixture: encoder, cross K/V, decoder layers, logits, host."""
    _use_repo_root()
    from backends.whisper import WhisperRequest, load_factory, model

    totals: dict[str, float] = {}

    def timed(key: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            t0 = time.process_time()
            out = fn(*args, **kwargs)
            totals[key] = totals.get(key, 0.0) + time.process_time() - t0
            return out

        return wrapper

    audio = dict(_fixtures())[name]
    with blas_threads(threads):
        session = load_factory().create()
        session.run(WhisperRequest(audio))
        originals = (model.encode, model.decode, model.logits, model.DecoderState.set_memory)
        model.encode = timed("encoder", model.encode)
        model.decode = timed("decoder layers", model.decode)
        model.logits = timed("vocab projection (logits)", model.logits)
        model.DecoderState.set_memory = timed("cross K/V projection", model.DecoderState.set_memory)  # type: ignore[method-assign]
        try:
            t0 = time.process_time()
            session.run(WhisperRequest(audio))
            total = time.process_time() - t0
        finally:
            model.encode, model.decode, model.logits, model.DecoderState.set_memory = originals  # type: ignore[method-assign]
    totals["host: features, rules, argmax, bookkeeping"] = total - sum(totals.values())
    totals["total"] = total
    return totals


def _print_table(rows: list[dict[str, object]]) -> None:
    keys = list(rows[0])
    widths = {k: max(len(k), *(len(str(r[k])) for r in rows)) for k in keys}
    print("  ".join(k.ljust(widths[k]) for k in keys))
    for row in rows:
        print("  ".join(str(row[k]).ljust(widths[k]) for k in keys))


if __name__ == "__main__":
    print(machine())
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    n_threads = int(args[0]) if args else 1
    named = [a.split("=", 1)[1] for a in sys.argv[1:] if a.startswith("--fixture=")]
    if "--profile" in sys.argv:
        for stage, sec in profile(n_threads, *named[-1:]).items():
            print(f"{stage:45s} {sec * 1e3:9.1f} ms")
    else:
        _print_table(bench(n_threads, http="--http" in sys.argv))
