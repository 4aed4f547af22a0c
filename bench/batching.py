"""Cross-request batching (#14): waves of c concurrent requests, batched vs not, vs the peers.

    python bench/batching.py [--task asr|tts] [--concurrency 1,2,4,8,16] [--threads 1,2]
                             [--repeats 2] [--http]

ASR: a wave is c transcriptions of the 8 inputs of ``bench/batched_models.py`` (the 5
Whisper fixtures and 3 made from them), cycled. Side by side in one process, runs
alternating so load drift hits all alike:

* ``voxpool slots=2``: the runtime (``Runtime`` + ``ThreadedProvider``) as the embedded
  default serves it today, 2 slots, no batching, the c requests submitted at once;
* ``voxpool batched``: the same runtime with ``batching: true`` and c slots (the batch);
* ``fw fp32 serial``: faster-whisper float32, the c files one after another (greedy, one
  temperature, as ``bench/model_whisper.py``);
* ``voxpool batched vad_chunking``: the batched runtime again, each request with
  ``vad_chunking`` (cut at Silero VAD's silences into pieces of at most 30 s decoded as
  rows of the batch: what faster-whisper's batched pipeline does with its VAD);
* ``fw fp32 batched`` / ``fw int8 batched``: faster-whisper's ``BatchedInferencePipeline``
  (batch_size 8), the c files one after another.

Our runtimes use the server's default BLAS thread policy (``threads: "auto"``,
server/blas.py) as on a machine of ``threads`` cores: a session call alone gets them all,
concurrent calls share them. With ``--http`` two ``voxpool serve`` processes (the same
two configurations; ``threads: "auto"`` under a ``threads``-CPU affinity mask) get the
same waves over HTTP (multipart uploads, c connections at once; the batched server also
gets them with ``vad_chunking=true``). Every side transcribes the same samples: the
inputs as a 16-bit WAV upload carries them (the in-process runtimes and the peers get
them decoded as the server decodes them). BLAS threads for the
peers: ``cpu_threads``. The table gives median wave seconds and each row's ratio to
``fw fp32 batched`` and ``fw int8 batched``; ``same`` says whether the batched
runtime's texts equal the unbatched one's (not given for ``vad_chunking`` rows: chunked
texts differ from sequential decoding by design, docs/performance.md, "VAD-chunked long
audio").

TTS (``--task tts``): a wave is c of ``bench/model_piper.py``'s texts, cycled, on the
runtime unbatched (2 slots) and batched (c slots), with ``--http`` the same two
configurations as ``voxpool serve`` processes (c speech requests posted at once for raw
PCM), and ``piper-tts serial`` (onnxruntime, ``intra_op_num_threads`` = threads); ratios
to piper-tts; ``same`` compares every voxpool side's lengths in samples with the 2-slot
runtime's (the audio itself is within 1e-4).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import sys
import tempfile
import time
import wave
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if sys.path[:1] != [str(ROOT)]:  # run as a script: the project, not bench/core.py
    sys.path.insert(0, str(ROOT))

import anyio  # noqa: E402
import numpy as np  # noqa: E402

from bench.batched_models import _whisper_inputs  # noqa: E402
from bench.common import blas_threads, markdown_table  # noqa: E402

Wave = Callable[[list[np.ndarray]], list[str]]
CHUNKED = "voxpool batched vad_chunking"
HTTP_CHUNKED = "http batched vad_chunking"
SETTLE_S = 1.0
"""Pause before each timed wave: the previous one's spinning worker threads (OpenMP in
CTranslate2 and onnxruntime, OpenBLAS's pool) go idle instead of stealing the next one's
cores."""


def _runtime_wave(
    slots: int, batching: bool, task: str = "asr", threads: int = 1
) -> tuple[Any, Callable[[bool], Wave]]:
    """A portal-driven runtime serving one model of ``task``, and its waves (every request
    submitted at once; ``wave(True)``: ASR requests with ``vad_chunking``)."""
    from anyio.from_thread import start_blocking_portal

    from server.blas import AdaptiveThreads
    from server.provider import ThreadedProvider
    from server.runtime import ModelSpec, Runtime, RuntimeConfig

    family = "whisper" if task == "asr" else "piper"
    cm = start_blocking_portal()
    portal = cm.__enter__()

    async def build() -> Runtime:  # the runtime reads the loop's clock
        # the server's threads "auto" on a machine of `threads` cores: a call alone gets
        # them all, concurrent calls share them
        provider = ThreadedProvider(threads=AdaptiveThreads(threads))
        rt = Runtime(provider, RuntimeConfig(busy_timeout_ms=0))
        rt.add_model(ModelSpec("m", family, task=task, slots=slots, batching=batching))
        return rt

    rt = portal.call(build)
    held = portal.wrap_async_context_manager(rt)  # entered and left in one task
    held.__enter__()

    async def run_all(inputs: list[Any], chunked: bool) -> list[str]:
        out = [""] * len(inputs)

        async def one(k: int) -> None:
            out[k] = _fingerprint(await rt.run("m", _request(task, inputs[k], chunked)))

        async with anyio.create_task_group() as tg:
            for k in range(len(inputs)):
                tg.start_soon(one, k)
        return out

    def make_wave(chunked: bool) -> Wave:
        return lambda inputs: portal.call(run_all, inputs, chunked)

    def close() -> None:
        held.__exit__(None, None, None)
        cm.__exit__(None, None, None)

    return close, make_wave


def _request(task: str, given: Any, vad_chunking: bool = False) -> Any:
    if task == "asr":
        from backends.whisper import WhisperRequest

        return WhisperRequest(given, vad_chunking=vad_chunking)
    from backends.piper import PiperRequest

    return PiperRequest(given, noise_w=0.0, seed=0)


def _fingerprint(result: Any) -> str:
    """A transcript's text, or a synthesis's length in samples (batched audio is within
    1e-4 of the unbatched: lengths must match exactly)."""
    text = getattr(result, "text", None)
    return str(text) if text is not None else f"{np.asarray(result.audio).size} samples"


def _piper_wave(threads: int) -> Wave:
    """piper-tts on onnxruntime, the texts one after another (noise_w 0, as ours)."""
    from piper.config import SynthesisConfig

    from bench.model_piper import _piper_voice

    voice = _piper_voice(threads)
    syn = SynthesisConfig(noise_w_scale=0.0)

    def wave_fn(texts: list[Any]) -> list[str]:
        out = []
        for text in texts:
            samples = sum(int(c.audio_float_array.size) for c in voice.synthesize(text, syn))
            out.append(f"{samples} samples")
        return out

    return wave_fn


def _peer_wave(compute_type: str, threads: int, batched: bool) -> Wave:
    from faster_whisper import BatchedInferencePipeline, WhisperModel

    from backends.whisper.session import default_model_dir

    model = WhisperModel(
        str(default_model_dir()), device="cpu", compute_type=compute_type, cpu_threads=threads
    )
    pipeline = BatchedInferencePipeline(model) if batched else None

    def wave_fn(audios: list[np.ndarray]) -> list[str]:
        texts = []
        for audio in audios:
            if pipeline is not None:
                segments, _ = pipeline.transcribe(audio, batch_size=8, beam_size=1)
            else:
                segments, _ = model.transcribe(
                    audio, beam_size=1, temperature=[0.0], vad_filter=False
                )
            texts.append("".join(s.text for s in segments).strip())
        return texts

    return wave_fn


def _pcm16(audio: np.ndarray) -> np.ndarray:
    """The 16-bit samples of ``audio`` as a WAV upload carries them: ``audio * 32768`` rounded
    (and clipped), so that audio the server decoded (``/ 32768``) is written back as the
    very same samples."""
    return np.clip(np.round(np.asarray(audio, np.float64) * 32768.0), -32768, 32767).astype("<i2")


def _as_uploaded(audio: np.ndarray) -> np.ndarray:
    """``audio`` as the server decodes its WAV upload (:func:`server.audio` divides by 32768):
    what every side of a wave transcribes, so that all of them get the same samples."""
    return _pcm16(audio).astype(np.float32) / np.float32(32768.0)


def _wav(audio: np.ndarray) -> bytes:
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(16000)
        w.writeframes(_pcm16(audio).tobytes())
    return buf.getvalue()


def _serve(task: str, slots: int, batching: bool, threads: int, logs: Path) -> Any:
    """A ``voxpool serve`` process with one model of ``task`` (``threads: "auto"`` under a
    ``threads``-CPU affinity mask), started."""
    from tests.server.live import LiveServer

    family = "whisper" if task == "asr" else "piper"
    model = {"id": family, "family": family, "slots": slots, "batching": batching}
    config = {"busy_timeout_ms": 0, "threads": "auto", "models": [model]}
    path = logs / f"bench-{task}-{'batched' if batching else 'slots'}-{threads}.json"
    path.write_text(json.dumps(config))
    # LiveServer (the tests' launcher) pins BLAS to 1 thread unless the environment names a
    # value: an empty one leaves the server's own "auto" policy in charge. Only the server
    # sees it (the peers' OpenMP here would warn about an empty value).
    variables = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
    saved = {var: os.environ.get(var) for var in variables}
    os.environ.update({var: "" for var in variables})
    mine = os.sched_getaffinity(0)
    os.sched_setaffinity(0, sorted(mine)[:threads])  # the server inherits it: its "auto"
    try:
        return LiveServer(path, logs).start()
    finally:
        os.sched_setaffinity(0, mine)
        for var, value in saved.items():
            if value is None:
                os.environ.pop(var, None)
            else:
                os.environ[var] = value


def _http_wave(
    slots: int, batching: bool, threads: int, logs: Path
) -> tuple[Any, Callable[[bool], Wave]]:
    """A ``voxpool serve`` process and its waves: every file posted at once on its own
    connection (``wave(True)``: with ``vad_chunking=true``)."""

    server = _serve("asr", slots, batching, threads, logs)
    client = _client(server.url)

    def one(data: bytes, chunked: bool) -> str:
        r = client.post(
            "/v1/audio/transcriptions",
            files={"file": ("a.wav", data, "audio/wav")},
            data={"model": "whisper", "vad_chunking": "true" if chunked else "false"},
            timeout=600.0,
        )
        r.raise_for_status()
        return str(r.json()["text"])

    def make_wave(chunked: bool) -> Wave:
        def wave_fn(audios: list[np.ndarray]) -> list[str]:
            files = [_wav(a) for a in audios]
            with ThreadPoolExecutor(len(files)) as pool:
                return list(pool.map(lambda data: one(data, chunked), files))

        return wave_fn

    return _closing(server, client), make_wave


def _client(url: str) -> Any:
    """One HTTP client for a wave's requests, made before any is timed: a client made per
    request (``httpx.post``) builds an SSL context each time, about 10 ms of this machine's
    CPU that the server's cores then lose (a wave of 8 TTS requests took 0.77-0.88 s
    against 0.62 in-process that way). Each request still opens its own connection (no
    keep-alive): a kept connection idle past the server's ``header_timeout_s`` while the
    other sides ran was closed by the server as the next wave reused it (a reset)."""
    import httpx

    limits = httpx.Limits(max_connections=64, max_keepalive_connections=0)
    return httpx.Client(base_url=url, timeout=600.0, limits=limits)


def _closing(server: Any, client: Any) -> Callable[[], None]:
    def close() -> None:
        client.close()
        server.stop()

    return close


def _http_tts_wave(slots: int, batching: bool, threads: int, logs: Path) -> tuple[Any, Wave]:
    """A ``voxpool serve`` process with Piper and its wave: every text posted at once to
    ``/v1/audio/speech`` on its own connection (raw 16-bit PCM, noise_w 0, seed 0, as the
    in-process requests), each answer's length in samples."""

    server = _serve("tts", slots, batching, threads, logs)
    client = _client(server.url)

    def one(text: str) -> str:
        body = {"model": "piper", "input": text, "response_format": "pcm", "noise_w": 0.0}
        r = client.post("/v1/audio/speech", json={**body, "seed": 0})
        r.raise_for_status()
        return f"{len(r.content) // 2} samples"

    def wave_fn(texts: list[Any]) -> list[str]:
        with ThreadPoolExecutor(len(texts)) as pool:
            return list(pool.map(one, texts))

    return _closing(server, client), wave_fn


def _measure(waves: dict[str, Wave], audios: list[np.ndarray], repeats: int) -> dict[str, Any]:
    names = list(waves)
    for name in names:  # warm-up: loads, first-call allocations
        waves[name](audios[:1])
    times: dict[str, list[float]] = {n: [] for n in names}
    texts: dict[str, list[str]] = {}
    for rep in range(repeats):
        for name in names if rep % 2 == 0 else names[::-1]:
            time.sleep(SETTLE_S)
            t0 = time.perf_counter()
            texts[name] = waves[name](audios)
            times[name].append(time.perf_counter() - t0)
    return {n: (statistics.median(times[n]), texts[n]) for n in names}


def run(concurrency: list[int], threads: int, repeats: int, http: bool) -> list[dict[str, Any]]:
    # the samples a 16-bit WAV upload carries, for every side: Whisper's transcript (and so
    # its time) moves with the last bits of the input (story's VAD-chunked decode: 229
    # tokens in 4.75 s from the float32 file, 241 in 6.3 s from its 16-bit copy)
    inputs = [_as_uploaded(audio) for _, audio in _whisper_inputs()]
    rows: list[dict[str, Any]] = []
    logs = Path(tempfile.mkdtemp(prefix="voxpool-bench-"))
    with blas_threads(threads):
        for c in concurrency:
            audios = [inputs[k % len(inputs)] for k in range(c)]
            closers: list[Any] = []
            close, slots2 = _runtime_wave(2, False, threads=threads)
            closers.append(close)
            close, batched = _runtime_wave(max(c, 1), True, threads=threads)
            closers.append(close)
            waves: dict[str, Wave] = {
                "voxpool slots=2": slots2(False),
                "voxpool batched": batched(False),
                CHUNKED: batched(True),
            }
            if http:
                close, w = _http_wave(2, False, threads, logs)
                closers.append(close)
                waves["http slots=2"] = w(False)
                close, w = _http_wave(max(c, 1), True, threads, logs)
                closers.append(close)
                waves["http batched"] = w(False)
                waves[HTTP_CHUNKED] = w(True)
            waves["fw fp32 serial"] = _peer_wave("float32", threads, batched=False)
            waves["fw fp32 batched"] = _peer_wave("float32", threads, batched=True)
            waves["fw int8 batched"] = _peer_wave("int8", threads, batched=True)
            try:
                got = _measure(waves, audios, repeats)
            finally:
                for close in closers:
                    close()
            seconds = sum(a.size for a in audios) / 16000
            same = got["voxpool batched"][1] == got["voxpool slots=2"][1]
            for name, (wall, _texts) in got.items():
                rows.append(
                    {
                        "c": c,
                        "threads": threads,
                        "impl": name,
                        "audio_s": round(seconds, 1),
                        "wave_s": round(wall, 2),
                        "vs_fp32_batched": round(wall / got["fw fp32 batched"][0], 2),
                        "vs_int8_batched": round(wall / got["fw int8 batched"][0], 2),
                        "same": same
                        if name.startswith(("voxpool", "http")) and "vad_chunking" not in name
                        else "",
                    }
                )
            print(markdown_table(rows[-len(got) :]), flush=True)
    return rows


def run_tts(concurrency: list[int], threads: int, repeats: int, http: bool) -> list[dict[str, Any]]:
    """TTS waves: c texts (bench/model_piper.py's, cycled) on the runtime unbatched (2 slots)
    and batched (c slots), with ``http`` through two ``voxpool serve`` too, and piper-tts
    serially; ratios to piper-tts."""
    from bench.model_piper import TEXTS

    texts = list(TEXTS.values())
    rows: list[dict[str, Any]] = []
    logs = Path(tempfile.mkdtemp(prefix="voxpool-bench-"))
    with blas_threads(threads):
        for c in concurrency:
            wave_texts = [texts[k % len(texts)] for k in range(c)]
            closers: list[Any] = []
            close, slots2 = _runtime_wave(2, False, "tts", threads)
            closers.append(close)
            close, batched = _runtime_wave(max(c, 1), True, "tts", threads)
            closers.append(close)
            waves = {"voxpool slots=2": slots2(False), "voxpool batched": batched(False)}
            if http:
                close, waves["http slots=2"] = _http_tts_wave(2, False, threads, logs)
                closers.append(close)
                close, waves["http batched"] = _http_tts_wave(max(c, 1), True, threads, logs)
                closers.append(close)
            waves["piper-tts serial"] = _piper_wave(threads)
            try:
                got = _measure(waves, wave_texts, repeats)
            finally:
                for close in closers:
                    close()
            same = all(
                got[n][1] == got["voxpool slots=2"][1] for n in got if n != "piper-tts serial"
            )
            for name, (wall, _out) in got.items():
                rows.append(
                    {
                        "c": c,
                        "threads": threads,
                        "impl": name,
                        "wave_s": round(wall, 2),
                        "vs_piper_tts": round(wall / got["piper-tts serial"][0], 2),
                        "same": same if name != "piper-tts serial" else "",
                    }
                )
            print(markdown_table(rows[-len(got) :]), flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--task", choices=("asr", "tts"), default="asr")
    p.add_argument("--concurrency", default="1,2,4,8,16")
    p.add_argument("--threads", default="1,2")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--http", action="store_true", help="also through two voxpool serve")
    args = p.parse_args(argv)
    rows: list[dict[str, Any]] = []
    concurrency = [int(x) for x in args.concurrency.split(",")]
    for t in (int(x) for x in args.threads.split(",")):
        if args.task == "tts":
            rows += run_tts(concurrency, t, args.repeats, args.http)
        else:
            rows += run(concurrency, t, args.repeats, args.http)
    print()
    print(markdown_table(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
