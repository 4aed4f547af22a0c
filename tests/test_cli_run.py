"""``voxpool run tts|asr|vad`` end to end, as a user would type them."""

from __future__ import annotations

import subprocess
import sys
import wave
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def voxpool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "server.cli", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
    )


def test_tts_then_vad_then_asr_round_trip(tmp_path: Path) -> None:
    out = tmp_path / "hello.wav"
    tts = voxpool("run", "tts", "--text", "Good morning. The weather is fine.", "-o", str(out))
    assert tts.returncode == 0, tts.stderr
    assert "sentence 2" in tts.stderr, "progress is reported per sentence"
    with wave.open(str(out)) as w:
        assert w.getframerate() == 22050 and w.getnchannels() == 1
        assert 1.0 < w.getnframes() / 22050 < 6.0
    vad = voxpool("run", "vad", str(out))
    assert vad.returncode == 0, vad.stderr
    assert vad.stdout.startswith("speech "), vad.stdout
    asr = voxpool("run", "asr", str(out))
    assert asr.returncode == 0, asr.stderr
    words = asr.stdout.lower()
    assert "morning" in words and "weather" in words, asr.stdout


def test_clear_errors_for_bad_input(tmp_path: Path) -> None:
    missing = voxpool("run", "asr", str(tmp_path / "nope.wav"))
    assert missing.returncode == 2 and "cannot read" in missing.stderr
    garbage = tmp_path / "garbage.wav"
    garbage.write_bytes(b"not a wav file at all")
    bad = voxpool("run", "vad", str(garbage))
    assert bad.returncode == 2 and "not a WAV file" in bad.stderr
    no_text = voxpool("run", "tts", "-o", str(tmp_path / "x.wav"))
    assert no_text.returncode == 2 and "--text is required" in no_text.stderr
