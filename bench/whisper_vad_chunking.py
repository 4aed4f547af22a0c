"""Word error rate of VAD-chunked long audio (issue #14) against sequential long-form decoding.

Inputs: every fixture of ``tests/data/whisper`` (Piper speech with a reference text), and
two long files made of all five joined in order by 1 s and by 5 s of silence (93 s and
109 s). Each input is transcribed by

* ``voxpool sequential``: today's long-form loop (``WhisperRequest(audio)``: 30 s
  windows, each conditioned on the text before it, temperature fallback);
* ``voxpool vad_chunking``: ``WhisperRequest(audio, vad_chunking=True)`` (Silero VAD
  pieces of at most 30 s decoded as one batch, no text carried between pieces);
* ``faster-whisper sequential``: ``WhisperModel.transcribe`` with beam size 1, VAD off
  (what voxpool's sequential decoding reproduces);
* ``faster-whisper batched``: ``BatchedInferencePipeline.transcribe`` with beam size 1,
  its other defaults (Silero VAD on, batch size 8, no timestamps, temperature 0 only);

faster-whisper (CTranslate2, float32) reads the same tiny.en files as voxpool; its rows
are skipped if it is not installed. WER = (substitutions + deletions + insertions) /
reference words, after lower-casing and dropping punctuation
(:func:`tests.models.whisper_audio.word_error_rate`; no spelling or number
normalisation); the ``all`` rows pool the word errors of their inputs.

Run: ``.venv/bin/python bench/whisper_vad_chunking.py [threads]`` (default 1 thread).
Accuracy only: nothing is timed.
"""

from __future__ import annotations

import json
import os
import platform
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if sys.path[:1] != [str(ROOT)]:
    sys.path.insert(0, str(ROOT))  # the repo's packages (bench/core.py would shadow ``core``)

from bench.common import blas_threads, markdown_table  # noqa: E402
from tests.models.whisper_audio import DATA, load_wav, word_error_rate, words  # noqa: E402

SR = 16000


def inputs() -> list[tuple[str, np.ndarray, str]]:
    """(name, audio, reference text): the fixtures, then the two joined files."""
    fixtures = json.loads((DATA / "fixtures.json").read_text())
    single = [(str(f["name"]), load_wav(str(f["file"])), str(f["text"])) for f in fixtures]
    reference = " ".join(text for _, _, text in single)
    joined = []
    for gap_s in (1, 5):
        gap = np.zeros(gap_s * SR, np.float32)
        parts = [p for _, audio, _ in single for p in (audio, gap)][:-1]
        joined.append((f"joined ({gap_s} s gaps)", np.concatenate(parts), reference))
    return single + joined


def systems(threads: int) -> dict[str, Callable[[np.ndarray], tuple[str, int | None]]]:
    """Each system: audio in, (transcript, pieces or None) out."""
    from backends.whisper import WhisperRequest, load_factory

    session = load_factory().create()

    def ours(chunked: bool) -> Callable[[np.ndarray], tuple[str, int | None]]:
        def run(audio: np.ndarray) -> tuple[str, int | None]:
            result = session.run(WhisperRequest(audio, vad_chunking=chunked))
            return result.text, len(result.pieces) if chunked else None

        return run

    out = {"voxpool sequential": ours(False), "voxpool vad_chunking": ours(True)}
    try:
        from faster_whisper import BatchedInferencePipeline, WhisperModel
    except ImportError:
        print("faster-whisper is not installed: its rows are left out", file=sys.stderr)
        return out
    from backends.whisper.session import default_model_dir

    model = WhisperModel(
        str(default_model_dir()), device="cpu", compute_type="float32", cpu_threads=threads
    )
    pipeline = BatchedInferencePipeline(model)

    def peer(audio: np.ndarray) -> tuple[str, int | None]:
        segments, _ = model.transcribe(audio, beam_size=1, vad_filter=False)
        return "".join(s.text for s in segments), None

    def peer_batched(audio: np.ndarray) -> tuple[str, int | None]:
        segments, _ = pipeline.transcribe(audio, beam_size=1, batch_size=8)
        return "".join(s.text for s in segments), None

    out["faster-whisper sequential"] = peer
    out["faster-whisper batched"] = peer_batched
    return out


def _errors(reference: str, hypothesis: str) -> float:
    return word_error_rate(reference, hypothesis) * len(words(reference))


def table(threads: int = 1) -> tuple[list[dict[str, object]], dict[str, dict[str, str]]]:
    """One row per input (WER per system, our piece count) and two pooled rows; the texts."""
    rows: list[dict[str, object]] = []
    texts: dict[str, dict[str, str]] = {}
    pooled: dict[str, dict[str, float]] = {"fixtures": {}, "joined": {}}
    pooled_words = {"fixtures": 0, "joined": 0}
    with blas_threads(threads):
        runs = systems(threads)
        for name, audio, reference in inputs():
            group = "joined" if name.startswith("joined") else "fixtures"
            pooled_words[group] += len(words(reference))
            row: dict[str, object] = {
                "input": name,
                "seconds": f"{len(audio) / SR:.1f}",
                "words": len(words(reference)),
            }
            texts[name] = {}
            pieces: int | None = None
            for system, run in runs.items():
                text, count = run(audio)
                pieces = count if count is not None else pieces
                texts[name][system] = text
                errors = _errors(reference, text)
                pooled[group][system] = pooled[group].get(system, 0.0) + errors
                row[system] = f"{errors / len(words(reference)):.1%}"
            row["voxpool pieces"] = pieces
            rows.append(row)
    for group, label in (("fixtures", "all five fixtures"), ("joined", "both joined files")):
        total: dict[str, object] = {"input": f"**{label}**", "seconds": "", "words": ""}
        total["words"] = pooled_words[group]
        for system, errors in pooled[group].items():
            total[system] = f"**{errors / pooled_words[group]:.1%}**"
        total["voxpool pieces"] = ""
        rows.append(total)
    return rows, texts


def machine() -> str:
    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{model}, {os.cpu_count()} CPUs, Python {platform.python_version()}"


def main(argv: list[str]) -> None:
    threads = int(argv[1]) if len(argv) > 1 else 1
    rows, texts = table(threads)
    print(f"machine: {machine()}; {threads} thread(s)\n")
    print(markdown_table(rows))
    if os.environ.get("VAD_CHUNKING_TEXTS"):
        print(json.dumps(texts, indent=1))


if __name__ == "__main__":
    main(sys.argv)
