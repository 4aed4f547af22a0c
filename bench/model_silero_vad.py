"""Silero VAD: voxpool's numpy backend against onnxruntime, same audio, same threads.

Rows: offline over ~60 s of speech/silence/noise (``run`` vs the chunk loop of
silero's ``OnnxWrapper``); streaming latency of one 512-sample chunk (``stream``
vs one ``InferenceSession.run`` with state and context); and a native batch of
16 requests (both runtimes batch along the batch axis). ``rtf`` = compute time /
audio duration. Run: ``.venv/bin/python bench/model_silero_vad.py [threads]``.
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if sys.path[:1] != [str(ROOT)]:  # the project's packages, not bench/backends.py
    sys.path.insert(0, str(ROOT))

from bench.common import array_backend as _array_backend  # noqa: E402
from bench.common import blas_threads, machine  # noqa: E402

RATE = 16000
CHUNK = 512
CONTEXT = 64
MODEL = "silero_vad"


def _interleaved(
    fns: dict[str, Callable[[], object]], repeats: int, calls: int = 1
) -> dict[str, float]:
    """Median seconds per call of each function, passes alternating between them.

    Alternating (and reversing the order every pass) keeps the comparison fair
    on a shared machine whose load drifts during the run.
    """
    names = list(fns)
    for name in names:  # warm-up
        fns[name]()
    times: dict[str, list[float]] = {name: [] for name in names}
    for rep in range(repeats):
        for name in names if rep % 2 == 0 else names[::-1]:
            t0 = time.perf_counter()
            for _ in range(calls):
                fns[name]()
            times[name].append((time.perf_counter() - t0) / calls)
    return {name: statistics.median(ts) for name, ts in times.items()}


def _ort_session(threads: int) -> Any:
    import onnxruntime as ort

    from backends.silero_vad.weights import ONNX_FILE, package_file

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    return ort.InferenceSession(
        str(package_file(ONNX_FILE)), providers=["CPUExecutionProvider"], sess_options=opts
    )


def _ort_offline(sess: Any, audio: np.ndarray) -> np.ndarray:
    """silero's ``OnnxWrapper.audio_forward`` loop (batch of one or more rows)."""
    audio = np.atleast_2d(audio)
    batch, n = audio.shape
    pad = (-n) % CHUNK
    x = np.pad(audio, ((0, 0), (0, pad)))
    state = np.zeros((2, batch, 128), np.float32)
    context = np.zeros((batch, CONTEXT), np.float32)
    sr = np.array(RATE, dtype=np.int64)
    out = []
    for i in range(0, x.shape[1], CHUNK):
        window = np.concatenate([context, x[:, i : i + CHUNK]], axis=1)
        prob, state = sess.run(None, {"input": window, "state": state, "sr": sr})
        context = window[:, -CONTEXT:]
        out.append(prob)
    return np.concatenate(out, axis=1)


def _row(impl: str, label: str, ms: float, audio_s: float) -> dict[str, object]:
    return {
        "model": MODEL,
        "impl": impl,
        "input": label,
        "median_ms": round(ms, 3),
        "rtf": round(ms / 1e3 / audio_s, 5),
    }


def bench(threads: int = 1, repeats: int = 5, backend: str = "numpy") -> list[dict[str, object]]:
    """Measure both runtimes side by side; returns one row per (impl, input)."""
    ours = f"voxpool-{backend}"
    array_backend = _array_backend(backend)
    from backends.silero_vad import VadRequest, load_factory
    from tests.models.silero_vad_reference import fixture, minute_mix

    audio = np.array(minute_mix())
    seconds = len(audio) / RATE
    factory = load_factory(array_backend)
    session = factory.create()
    sess = _ort_session(threads)
    rows: list[dict[str, object]] = []

    def measure(
        label: str, audio_s: float, fns: dict[str, Callable[[], object]], calls: int = 1
    ) -> None:
        for impl, sec in _interleaved(fns, repeats, calls).items():
            rows.append(_row(impl, label, sec * 1e3, audio_s))

    with blas_threads(threads):
        measure(
            f"offline {seconds:.1f} s",
            seconds,
            {
                ours: lambda: session.run(VadRequest(audio)),
                "onnxruntime": lambda: _ort_offline(sess, audio),
            },
        )

        # streaming, state carried chunk to chunk; ORT runs the graph once per chunk
        n_chunks = 10 * RATE // CHUNK
        ten_s = audio[: n_chunks * CHUNK]
        live: Iterator[object] = iter(())

        def np_step() -> None:  # one 10 s request, pulled chunk by chunk
            nonlocal live
            if next(live, None) is None:
                live = session.stream(VadRequest(ten_s))
                next(live)

        piece = 0

        def np_live_step() -> None:  # every 512-sample piece is its own request
            nonlocal piece
            request = VadRequest(
                ten_s[piece * CHUNK : (piece + 1) * CHUNK], continue_stream=piece > 0, final=False
            )
            for _ in session.stream(request):
                pass
            piece = (piece + 1) % n_chunks

        state = np.zeros((2, 1, 128), np.float32)
        sr = np.array(RATE, dtype=np.int64)
        window = np.zeros((1, CONTEXT + CHUNK), np.float32)
        pos = 0

        def ort_step() -> None:
            nonlocal state, window, pos
            window = np.concatenate([window[:, -CONTEXT:], ten_s[None, pos : pos + CHUNK]], axis=1)
            _, state = sess.run(None, {"input": window, "state": state, "sr": sr})
            pos = (pos + CHUNK) % (n_chunks * CHUNK)

        chunk_s = CHUNK / RATE
        measure(
            "stream live: 1 chunk (32 ms) per request",
            chunk_s,
            {ours: np_live_step, "onnxruntime": ort_step},
            calls=n_chunks,
        )
        measure(
            "stream 10 s request: per chunk",
            chunk_s,
            {ours: np_step, "onnxruntime": ort_step},
            calls=n_chunks,
        )

        # native batch of 16 requests of the ~15 s clip at different gains
        clip = np.array(fixture()[0])
        members = [np.float32(0.25 + 0.05 * i) * clip for i in range(16)]
        stacked = np.stack(members)
        measure(
            f"batch 16 x {len(clip) / RATE:.1f} s",
            16 * len(clip) / RATE,
            {
                ours: lambda: session.batch([VadRequest(m) for m in members]),
                "onnxruntime": lambda: _ort_offline(sess, stacked),
            },
        )
    return rows


def _print_table(rows: list[dict[str, object]]) -> None:
    cols = ["model", "impl", "input", "median_ms", "rtf"]
    widths = [max(len(c), *(len(str(r[c])) for r in rows)) for c in cols]
    print("  ".join(c.ljust(w) for c, w in zip(cols, widths, strict=True)))
    for r in rows:
        print("  ".join(str(r[c]).ljust(w) for c, w in zip(cols, widths, strict=True)))


if __name__ == "__main__":
    print(machine())
    _print_table(bench(threads=int(sys.argv[1]) if len(sys.argv) > 1 else 1))
