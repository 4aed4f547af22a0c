"""Time to first audio for streamed TTS (#15): voxpool's Piper stream against piper-tts's.

    python bench/tts_first_audio.py [--threads 1,2] [--repeats 5] [--no-http] [--cold 3]
                                    [--profile]

For a one-sentence text, a 3-sentence paragraph and a 10-sentence one, three ways
of getting the speech sentence by sentence, each timed from the call to its
first audio (``first_ms``) and to its last (``all_ms``):

- ``voxpool in-process``: a streaming-mode Piper session's ``stream`` (one chunk
  per sentence), BLAS threads limited with threadpoolctl;
- ``voxpool HTTP``: a real ``voxpool serve`` on loopback (``threads: N`` in its
  config), ``POST /v1/audio/speech`` with ``stream_format: "audio"`` and
  ``response_format: "pcm"`` read with httpx streaming: the first body bytes are
  PCM of the first sentence (no header), the end is the end of the body;
- ``piper-tts``: ``PiperVoice.synthesize`` (onnxruntime, ``intra_op_num_threads =
  N``), which phonemizes the whole text and then yields one chunk per sentence:
  its first chunk is its first sentence's audio.

All three phonemize the whole text with the same espeak-ng bridge before the first
sentence and use noise_w = 0, so they place the very same frames (onnxruntime's
noise is not seedable) and do the same work. Every (input, threads) runs each way
once to warm up, then ``--repeats`` rounds in a rotating order (so all see the
same machine load), with a short pause before each run; medians are reported;
``first/peer`` and ``all/peer`` are our medians over piper-tts's (below 1.0 we
are faster).
``--cold N`` adds the first request after a load: N fresh processes per side (ours
in-process, piper-tts), each loading its model, then streaming the paragraph twice.
``--profile`` adds a cProfile of the in-process first chunk of the long text.
Results and their reading: docs/performance.md, "TTS time to first audio".
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import attrs

ROOT = Path(__file__).resolve().parents[1]
if sys.path[:1] != [str(ROOT)]:  # run as a script: the project, not bench/core.py
    sys.path.insert(0, str(ROOT))

from bench.common import blas_threads, markdown_table, serve_config  # noqa: E402
from bench.model_piper import TEXTS as PIPER_TEXTS  # noqa: E402

MODEL = "piper"
TEXTS = {
    "1 sentence": PIPER_TEXTS["medium (1 sentence)"],
    "3 sentences": PIPER_TEXTS["paragraph (3 sentences)"],
    "10 sentences": (
        "The weather is lovely today, let us go for a walk. "
        "We can take the path along the river and stop at the old mill. "
        "Bring a coat, because the wind picks up in the afternoon. "
        "The bakery on the corner opens at eight. "
        "Their bread is still warm if you get there early. "
        "After that, the museum has a new exhibition about early radio. "
        "It shows how voices first travelled across the ocean. "
        "Tickets are cheaper before noon. "
        "In the evening we could cook something simple at home. "
        "Then we will rest, and tomorrow we can plan the next trip."
    ),
}
PEER = "piper-tts"
PAUSE_S = 0.3
"""Before each run: OpenBLAS's and onnxruntime's pool threads spin a while after a call
(measured: 2-5% slower runs after a 0.05 s pause than after 0.5 s, at 2 threads)."""


@attrs.frozen
class Timing:
    """One streamed synthesis: seconds to the first audio and to the end, and what came."""

    first_s: float
    all_s: float
    chunks: int  # sentences (in-process, piper-tts) or body reads (HTTP)
    first_audio_s: float  # audio seconds in the first chunk (in-process, piper-tts)
    audio_s: float
    pcm: bytes  # the whole audio as 16-bit PCM


def ours_stream(session: Any, text: str) -> Timing:
    """A streaming Piper session's ``stream``: the call to its first and last chunk."""
    from backends.piper import PiperRequest, pcm16_bytes

    request = PiperRequest(text, noise_w=0.0, seed=0)
    chunks = []
    t0 = time.perf_counter()
    for chunk in session.stream(request):
        if not chunks:
            first = time.perf_counter() - t0
        chunks.append(chunk)
    total = time.perf_counter() - t0
    rate = chunks[0].sample_rate
    pcm = b"".join(pcm16_bytes(c.audio) for c in chunks)
    samples = sum(c.audio.size for c in chunks)
    return Timing(first, total, len(chunks), chunks[0].audio.size / rate, samples / rate, pcm)


def peer_stream(voice: Any, text: str) -> Timing:
    """piper-tts's ``PiperVoice.synthesize`` (one chunk per sentence), noise_w = 0."""
    from piper.config import SynthesisConfig

    syn = SynthesisConfig(noise_w_scale=0.0)
    chunks = []
    t0 = time.perf_counter()
    for chunk in voice.synthesize(text, syn):
        if not chunks:
            first = time.perf_counter() - t0
        chunks.append(chunk)
    total = time.perf_counter() - t0
    rate = int(voice.config.sample_rate)
    pcm = b"".join(c.audio_int16_bytes for c in chunks)
    samples = sum(c.audio_float_array.size for c in chunks)
    first_audio = chunks[0].audio_float_array.size / rate
    return Timing(first, total, len(chunks), first_audio, samples / rate, pcm)


def http_stream(client: Any, text: str, rate: int) -> Timing:
    """``POST /v1/audio/speech`` streamed as raw PCM: the request to its first and last bytes."""
    body = {
        "model": MODEL,
        "input": text,
        "stream_format": "audio",
        "response_format": "pcm",
        "noise_w": 0,
        "seed": 0,
    }
    parts: list[bytes] = []
    t0 = time.perf_counter()
    with client.stream("POST", "/v1/audio/speech", json=body) as response:
        response.raise_for_status()
        for data in response.iter_raw():
            if data:
                if not parts:
                    first = time.perf_counter() - t0
                parts.append(data)
    total = time.perf_counter() - t0
    pcm = b"".join(parts)
    return Timing(first, total, len(parts), float("nan"), len(pcm) / 2 / rate, pcm)


def peer_voice(threads: int) -> Any:
    """piper-tts's voice on onnxruntime with ``threads`` intra-op threads (bench/model_piper)."""
    from bench.model_piper import _piper_voice

    return _piper_voice(threads)


def streaming_session() -> Any:
    """A session of a streaming-mode Piper model on the numpy backend."""
    from backends.piper import load_factory

    return load_factory(mode="streaming").create()


@contextmanager
def served(threads: int, log_dir: Path) -> Iterator[Any]:
    """A real ``voxpool serve`` with Piper in streaming mode and ``threads`` BLAS threads per
    call; yields an httpx client on it."""
    import httpx

    config = {
        "busy_timeout_ms": 0,
        "threads": threads,
        "models": [{"id": MODEL, "family": MODEL, "mode": "streaming", "slots": 1}],
    }
    server = serve_config(config, log_dir / f"tts-first-audio-{threads}.json")
    try:
        with httpx.Client(base_url=server.url, timeout=600.0) as client:
            yield client
    finally:
        server.stop()


def measure(
    runs: dict[str, Callable[[str], Timing]], texts: dict[str, str], repeats: int
) -> dict[tuple[str, str], list[Timing]]:
    """(input, impl) -> its timed runs: a warm-up run each, then ``repeats`` rounds, each
    round in another order of the impls."""
    order = list(runs)
    out: dict[tuple[str, str], list[Timing]] = {}
    for label, text in texts.items():
        for impl in order:
            runs[impl](text)
        for rep in range(repeats):
            shift = rep % len(order)
            for impl in order[shift:] + order[:shift]:
                time.sleep(PAUSE_S)
                out.setdefault((label, impl), []).append(runs[impl](text))
    return out


def rows_of(results: dict[tuple[str, str], list[Timing]], threads: int) -> list[dict[str, object]]:
    """Median rows, ``ours/peer`` for first and all audio against piper-tts's medians."""
    rows: list[dict[str, object]] = []
    labels = list(dict.fromkeys(label for label, _ in results))
    for label in labels:
        impls = [impl for (lab, impl) in results if lab == label]
        med = {
            impl: (
                statistics.median(t.first_s for t in results[(label, impl)]),
                statistics.median(t.all_s for t in results[(label, impl)]),
            )
            for impl in impls
        }
        peer = med.get(PEER)
        for impl in impls:
            runs = results[(label, impl)]
            first, total = med[impl]
            known = [t for t in runs if t.first_audio_s == t.first_audio_s]  # not NaN
            first_audio = f"{known[0].first_audio_s:.2f}" if known else ""
            row: dict[str, object] = {
                "threads": threads,
                "input": f"{label}, {runs[0].audio_s:.1f} s audio",
                "impl": impl,
                "first_ms": f"{first * 1e3:.1f}",
                "all_ms": f"{total * 1e3:.1f}",
                "first_chunk_audio_s": first_audio,
                "first/peer": "" if peer is None or impl == PEER else f"{first / peer[0]:.2f}",
                "all/peer": "" if peer is None or impl == PEER else f"{total / peer[1]:.2f}",
            }
            rows.append(row)
    return rows


def bench(
    threads: int,
    repeats: int,
    texts: dict[str, str] | None = None,
    http: bool = True,
    log_dir: Path | None = None,
) -> tuple[list[dict[str, object]], dict[tuple[str, str], list[Timing]]]:
    """The table's rows at ``threads`` and the raw timings."""
    texts = TEXTS if texts is None else texts
    session = streaming_session()
    voice = peer_voice(threads)
    rate = int(voice.config.sample_rate)
    with ExitStack() as stack:
        runs: dict[str, Callable[[str], Timing]] = {
            "voxpool in-process": _limited(session, threads)
        }
        if http:
            where = log_dir or Path(tempfile.mkdtemp(prefix="voxpool-tts-first-audio-"))
            client = stack.enter_context(served(threads, where))
            runs["voxpool HTTP"] = lambda text: http_stream(client, text, rate)
        runs[PEER] = lambda text: peer_stream(voice, text)
        results = measure(runs, texts, repeats)
    return rows_of(results, threads), results


def _limited(session: Any, threads: int) -> Callable[[str], Timing]:
    def run(text: str) -> Timing:
        with blas_threads(threads):
            return ours_stream(session, text)

    return run


def profile_first_chunk(text: str, threads: int = 1, top: int = 25) -> str:
    """cProfile of an in-process stream up to its first chunk (warm session), plus the time
    of the phonemization of the whole text and of the first sentence's synthesis."""
    from backends.piper import PiperRequest
    from backends.piper import progress as piper_progress

    session = streaming_session()
    request = PiperRequest(text, noise_w=0.0, seed=0)
    with blas_threads(threads):
        next(iter(session.stream(request)))  # warm
        session.reset()
        t0 = time.perf_counter()
        rng = piper_progress.request_rng(request)
        started = piper_progress.Progress.start(session.model, request, rng)
        t1 = time.perf_counter()
        profiler = cProfile.Profile()
        profiler.enable()
        next(iter(session.stream(request)))
        profiler.disable()
        t2 = time.perf_counter()
        session.reset()
    out = io.StringIO()
    out.write(
        f"phonemize the whole text ({len(started.sentences)} sentences): "
        f"{(t1 - t0) * 1e3:.1f} ms; stream to its first chunk (profiled): "
        f"{(t2 - t1) * 1e3:.1f} ms\n"
    )
    pstats.Stats(profiler, stream=out).sort_stats("cumulative").print_stats(top)
    return out.getvalue()


def cold_child(impl: str, text: str, threads: int) -> dict[str, float]:
    """In a fresh process: load ``impl`` (``ours``: a streaming Piper session; ``peer``: piper-tts's
    voice), then its first stream of ``text`` and a second one. Seconds."""
    t0 = time.perf_counter()
    if impl == "ours":
        run = _limited(streaming_session(), threads)
    else:
        voice = peer_voice(threads)

        def run(text: str) -> Timing:
            return peer_stream(voice, text)

    load = time.perf_counter() - t0
    first, second = run(text), run(text)
    return {
        "load_s": load,
        "first_s": first.first_s,
        "all_s": first.all_s,
        "warm_first_s": second.first_s,
    }


def cold(repeats: int, threads: int, label: str = "3 sentences") -> list[dict[str, object]]:
    """The first request after a load: ``repeats`` fresh processes per impl, alternating; medians
    of the load, the first request's first and last audio, and a second request's first."""
    got: dict[str, list[dict[str, float]]] = {"ours": [], "peer": []}
    for rep in range(repeats):
        for impl in ("ours", "peer") if rep % 2 == 0 else ("peer", "ours"):
            cmd = [sys.executable, __file__, "--cold-child", impl, "--threads", str(threads)]
            out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
            got[impl].append(json.loads(out.splitlines()[-1]))
    names = {"ours": "voxpool in-process", "peer": PEER}
    med = {
        impl: {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        for impl, runs in got.items()
    }
    rows: list[dict[str, object]] = []
    for impl in ("ours", "peer"):
        m = med[impl]
        ratio = "" if impl == "peer" else f"{m['first_s'] / med['peer']['first_s']:.2f}"
        rows.append(
            {
                "threads": threads,
                "input": label,
                "impl": names[impl],
                "load_ms": f"{m['load_s'] * 1e3:.0f}",
                "first request: first_ms": f"{m['first_s'] * 1e3:.1f}",
                "first request: all_ms": f"{m['all_s'] * 1e3:.1f}",
                "second request: first_ms": f"{m['warm_first_s'] * 1e3:.1f}",
                "first request: first/peer": ratio,
            }
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", default="1,2", help="comma-separated thread counts")
    p.add_argument("--repeats", type=int, default=5, help="0: no warm table")
    p.add_argument("--no-http", action="store_true", help="skip the voxpool serve rows")
    p.add_argument("--profile", action="store_true")
    p.add_argument("--cold", type=int, default=3, help="fresh processes per impl (0: none)")
    p.add_argument("--cold-child", choices=("ours", "peer"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.cold_child:
        n = int(args.threads.split(",")[0])
        print(json.dumps(cold_child(args.cold_child, TEXTS["3 sentences"], n)))
        return 0
    before = os.getloadavg()
    print(f"repeats={args.repeats}, cold={args.cold}, load average before: {before}")
    threads = [int(t) for t in args.threads.split(",")]
    if args.repeats > 0:
        rows = [r for n in threads for r in bench(n, args.repeats, http=not args.no_http)[0]]
        print(markdown_table(rows))
    if args.cold:
        cold_rows = [r for n in threads for r in cold(args.cold, n)]
        print(f"\nfirst request after a load ({args.cold} fresh processes each):")
        print(markdown_table(cold_rows))
    print(f"load average after: {os.getloadavg()}")
    if args.profile:
        print()
        print(profile_first_chunk(TEXTS["10 sentences"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
